"""Pure pieces of the test bed: slurmd command lines, $(VAR) expansion, process identity."""

from __future__ import annotations

import os
import subprocess

from slinky_testbed import kubelet, procs, slurmconf


def test_slurmd_gets_foreground_name_and_unique_port() -> None:
    argv = kubelet.slurmd_argv(["slurmd", "-Z", "--conf", "Features=a"], hostname="n-0", port=7001)
    assert argv[:4] == ["slurmd", "-N", "n-0", "-D"]
    assert argv[argv.index("--conf") + 1] == "Features=a Port=7001"


def test_slurmd_keeps_name_and_port_the_user_set() -> None:
    argv = kubelet.slurmd_argv(
        ["slurmd", "-D", "-N", "x", "--conf=Port=9 CPUs=2"], hostname="h", port=1
    )
    assert argv == ["slurmd", "-D", "-N", "x", "--conf=Port=9 CPUs=2"]


def test_slurmd_without_conf_gets_one() -> None:
    argv = kubelet.slurmd_argv(["slurmd", "-Z"], hostname="h", port=5)
    assert argv[-2:] == ["--conf", "Port=5"]


def test_var_expansion_follows_kubernetes() -> None:
    env = {"A": "1", "B": "two"}
    assert kubelet.expand("$(A)-$(B)-$(C)", env) == "1-two-$(C)"
    assert kubelet.expand("$$(A)", env) == "$(A)"


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
