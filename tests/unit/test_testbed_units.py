"""Pure pieces of the test bed: process identity, Slurm configuration."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from slinky_testbed import procs, slurmconf


def test_proc_identity_survives_only_for_the_same_process() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        p = procs.Proc.of(child.pid)
        assert p.alive()
        assert not procs.Proc(child.pid, p.started + 1).alive()
    finally:
        child.kill()
        child.wait()
    assert not p.alive()


def test_free_ports_are_distinct() -> None:
    ports = procs.free_ports(20)
    assert len(set(ports)) == 20


def test_slurm_conf_has_no_static_nodes_and_jwt_alt_auth() -> None:
    text = slurmconf.slurm_conf(ctld_port=1, slurmd_port=2)
    assert "NodeName=" not in text
    assert "AuthAltTypes=auth/jwt" in text
    assert "SlurmctldParameters=enable_configless" in text
    assert os.linesep in text


def test_slurmctld_serves_its_own_metrics_open_to_the_test_beds_prometheus() -> None:
    lines = slurmconf.slurm_conf(ctld_port=1, slurmd_port=2).splitlines()
    assert "MetricsType=metrics/openmetrics" in lines
    # PrivateData would close the endpoints to anyone but SlurmUser and root with a JWT.
    assert not any(line.startswith("PrivateData") for line in lines)


def test_a_removed_extra_process_is_forgotten_not_left_to_read_as_a_crash(tmp_path: Path) -> None:
    import sys

    from slinky_testbed.bed import Testbed

    bed = Testbed(tmp_path / "bed")
    bed.dir.mkdir(parents=True)
    bed.logs.mkdir(parents=True, exist_ok=True)
    bed.spawn_extra("sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], env={})
    assert "sleeper" in bed.load().pids
    bed.remove_extra("sleeper")
    assert "sleeper" not in bed.load().pids
    bed.remove_extra("sleeper")  # gone already: nothing to do
    assert [n for n, p in bed.tracked_processes(bed.load()) if not p.alive()] == []


def test_the_slurm_root_asks_no_resolver_outside_the_machine(tmp_path: Path) -> None:
    """slurmctld looks up the host name of every client that submits through slurmrestd;
    the machine's resolver throttled those lookups into 5 s stalls (bench_bridge: 9 pods/s).
    The root's resolv.conf names a loopback address nothing serves: a lookup fails at once."""
    slurmconf.write_slurm_config(tmp_path, ctld_port=1, slurmd_port=2)
    lines = (tmp_path / "etc" / "resolv.conf").read_text().splitlines()
    servers = [ln.split()[1] for ln in lines if ln.startswith("nameserver")]
    assert servers == ["127.0.0.1"]


def test_a_test_bed_short_of_disk_is_refused_naming_the_space_and_the_beds_to_remove(
    tmp_path: Path,
) -> None:
    from slinky_testbed.bed import disk_problem

    old = tmp_path / "old-bed"
    old.mkdir()
    (old / "state.json").write_text("{}")
    (old / "big").write_bytes(b"x" * 4096)
    (tmp_path / "not-a-bed").mkdir()

    assert disk_problem(tmp_path, real_nodes=2, free=10 * 2**30) is None
    problem = disk_problem(tmp_path, real_nodes=2, free=3 * 2**30)
    assert problem is not None
    assert "only 3.0 GiB free" in problem and "needs 4 GiB" in problem
    assert "old-bed" in problem and "not-a-bed" not in problem
    # A bed without real nodes needs less.
    assert disk_problem(tmp_path, real_nodes=0, free=3 * 2**30) is None
