"""HPC and AI jobs on slurmd pods, installed by the charts on the test bed's real nodes: a
NodeSet of two pods and a login pod from the slurm-hpc image (`make images`), a user who logs
in with an SSH key and runs, from her shared home:

- an MPICH allreduce across the two pods, each rank started by `srun --mpi=pmi2` (Debian's
  Slurm has no mpi/pmix plugin: `srun --mpi=list` says so);
- an OpenMPI (mpi4py) allreduce across them, `mpirun` inside `salloc` (PRRTE starts its daemons
  with srun; the image removes Debian's loopback-only TCP default that breaks it);
- the HPC Challenge benchmark (hpcc) across them, its HPL and ping-pong figures printed;
- a PyTorch DDP training, one rank per pod started by srun (gloo, USE_LIBUV=0), that converges
  with the same weights on both ranks;
- `apptainer exec` of a directory image and `srun --container` of an OCI bundle (crun,
  rootless, `oci.conf` from the chart's values), each seeing the CPUs of its job step; a SIF
  built in the test does not run in the pod (apptainer's unpacking needs a new procfs).

One installation serves every check. The HPC image is imported into the bed's nodes here (the
test bed imports only the images every test needs)."""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slinky.kube import rest
from slinky_testbed import images, nodes
from slinky_testbed import site as parts
from slinky_testbed.bed import Testbed
from tests.e2e.test_helm import (
    CHARTS,
    PVS,
    Install,
    hostpath_pv,
    idle_nodes,
    install,
)
from tests.e2e.test_site import Site

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1500)]

JSON = dict[str, Any]
ALICE_UID = 2001
PROGRAMS = Path(__file__).parent / "programs"
JOB_PROGRAMS = ("mpich_allreduce.py", "mpi4py_allreduce.py", "ddp_train.py", "oci_bundle.py")
# Slurm's OCI support with crun, rootless, its state under /tmp (a pod has no /run/user).
CRUN = "crun --rootless=true --root=/tmp/crun-%U"
OCI_CONF = f"""\
RunTimeQuery="{CRUN} state %n.%u.%j.%s.%t"
RunTimeKill="{CRUN} kill -a %n.%u.%j.%s.%t"
RunTimeDelete="{CRUN} delete --force %n.%u.%j.%s.%t"
RunTimeRun="{CRUN} run --bundle %b %n.%u.%j.%s.%t"
"""
__all__ = ["install"]


def import_hpc_image(bed: Testbed) -> str:
    """The slurm-hpc image imported into each real node's containerd (once per node root: a
    stamp beside it); its reference."""
    hpc = images.image("slurm-hpc")

    def into(name: str) -> None:
        sock = bed.nodes_dir / name / "containerd" / "containerd.sock"
        stamp = bed.dir / "containerd-roots" / f"{name}.slurm-hpc-imported"
        t0 = time.monotonic()
        if nodes.import_images(sock, [hpc.archive], stamp):
            print(f"workloads: slurm-hpc imported into {name} in {time.monotonic() - t0:.0f}s")

    real = bed.load().real_nodes
    with ThreadPoolExecutor(max_workers=len(real)) as pool:
        list(pool.map(into, real))
    return hpc.ref


def chart_image(ref: str) -> JSON:
    repository, tag = ref.rsplit(":", 1)
    return {"repository": repository, "tag": tag}


@dataclass
class HpcSite:
    site: Site
    image: str  # the slurm-hpc image's reference


@pytest.fixture
async def hpc_site(install: Install, tmp_path: Path) -> AsyncIterator[HpcSite]:
    """alice's key, the homes on a hostPath claim, the HPC image on the nodes."""
    i = install
    t0 = time.monotonic()
    hpc = import_hpc_image(i.testbed)
    i.timings["slurm-hpc image imported into the nodes"] = time.monotonic() - t0
    pv = f"{i.storage_class}-homes"
    await hostpath_pv(i.kube, pv, tmp_path / "homes", "ReadWriteMany", "1Gi")
    await i.kube.create(rest.PVCS, parts.homes_claim("homes", i.slurm_ns, pv), i.slurm_ns)
    site = Site(i, {"alice": tmp_path / "id_alice"}, tmp_path / "known_hosts")
    try:
        yield HpcSite(site, hpc)
    finally:
        with contextlib.suppress(rest.ApiError):
            await i.kube.delete(PVS, pv)


def hpc_values(s: Site, public_key: str, hpc_image: str) -> JSON:
    """The slurm chart's values: the Slurm image for the daemons, the HPC image for the login
    pod and NodeSet `hpc` (two pods, 2 CPUs each), alice from the values, homes on the claim."""
    i = s.i
    return {
        "image": {**parts.image("slurm"), "pullPolicy": "IfNotPresent"},
        "operator": {
            "namespace": i.operator_ns,
            "serviceAccountName": f"{i.operator_release}-slurm-operator",
        },
        "controller": {
            "persistence": {
                "storageClassName": i.storage_class,
                "size": "1Gi",
                "whenDeleted": "Delete",
            },
            "terminationGracePeriodSeconds": 10,
        },
        "cleanup": {"image": parts.image("slinky")},
        "slurmConfig": {"configFiles": {"oci.conf": OCI_CONF}},
        "login": {"enabled": True, "image": chart_image(hpc_image)},
        "users": [{"name": "alice", "uid": ALICE_UID, "sshAuthorizedKeys": [public_key]}],
        "homes": {"existingClaim": "homes"},
        "compute": {
            "nodesetDefaults": {
                "nodeConfig": parts.NODE_CONFIG,
                "terminationGracePeriodSeconds": 30,
            },
            "nodesets": [{"name": "hpc", "replicas": 2, "image": chart_image(hpc_image)}],
        },
    }


def rank_lines(out: str) -> dict[int, str]:
    """`rank R/S on HOST ...` lines by rank."""
    found = {}
    for line in out.splitlines():
        if m := re.match(r"rank (\d+)/2 on (\S+)", line.strip()):
            found[int(m.group(1))] = line.strip()
    return found


def on_nodes(ranks: dict[int, str]) -> set[str]:
    """The hosts the ranks ran on (the word after `on`, without a trailing colon)."""
    return {line.split()[3].rstrip(":") for line in ranks.values()}


async def test_mpi_pytorch_and_container_jobs_across_two_slurmd_pods(hpc_site: HpcSite) -> None:
    s, i = hpc_site.site, hpc_site.site.i
    t0 = time.monotonic()
    public = parts.keygen(s.keys["alice"])
    await i.helm(
        "install", i.crds_release, str(CHARTS / "slurm-operator-crds"), "-n", i.operator_ns,
        "--take-ownership", "--wait",
    )  # fmt: skip
    await i.helm(
        "install", i.operator_release, str(CHARTS / "slurm-operator"), "-n", i.operator_ns,
        "-f", i.values_file("operator", {"operator": {"image": parts.image("slinky")},
                                         "metricsApi": {"enabled": False}}),
        "--wait", "--timeout", "4m",
    )  # fmt: skip
    values = hpc_values(s, public, hpc_site.image)
    await i.helm(
        "install", i.slurm_release, str(CHARTS / "slurm"), "-n", i.slurm_ns,
        "-f", i.values_file("slurm", values), "--wait", "--timeout", "8m",
    )  # fmt: skip
    await idle_nodes(i, "hpc", 2)
    await s.ready("login")
    await s.reachable("alice")
    i.timings["install (operator, slurm: login and 2 slurm-hpc pods)"] = time.monotonic() - t0
    pods = [f"{i.nodeset('hpc')}-0", f"{i.nodeset('hpc')}-1"]
    # The programs in alice's home (made by her first login), as hers.
    home = i.work / "homes" / "alice"
    for name in JOB_PROGRAMS:
        shutil.copy(PROGRAMS / name, home / name)
        (home / name).chmod(0o644)
        shutil.chown(home / name, ALICE_UID, ALICE_UID)

    # ------------------------------------------------ MPI plugins of Debian's Slurm
    _, out, _ = await s.ssh("alice", "srun --mpi=list")
    assert "pmi2" in out.split() and "pmix" not in out, out

    # ------------------------------------------------ MPICH: srun starts every rank (PMI-2)
    t1 = time.monotonic()
    _, out, err = await s.ssh(
        "alice", "srun -N2 -n2 -p hpc -t 5 --mpi=pmi2 python3 mpich_allreduce.py"
    )
    ranks = rank_lines(out)
    assert sorted(ranks) == [0, 1], out + err
    assert on_nodes(ranks) == set(pods), out
    assert all("allreduce=3 MPICH" in line for line in ranks.values()), out
    i.timings["MPICH allreduce, srun --mpi=pmi2 -N2"] = time.monotonic() - t1
    print(out)

    # ------------------------------------------------ OpenMPI: mpirun inside salloc
    t1 = time.monotonic()
    _, out, err = await s.ssh(
        "alice", "salloc -N2 -n2 -p hpc -t 5 mpirun -n 2 python3 mpi4py_allreduce.py"
    )
    ranks = rank_lines(out)
    assert sorted(ranks) == [0, 1], out + err
    assert on_nodes(ranks) == set(pods), out
    assert all("allreduce=3 Open MPI" in line for line in ranks.values()), out
    i.timings["OpenMPI (mpi4py) allreduce, salloc -N2 + mpirun"] = time.monotonic() - t1
    print(out)

    # ------------------------------------------------ HPC Challenge on the two pods (a small
    # HPL, N=1000: the figures are printed, not judged: this 2-core machine is shared)
    t1 = time.monotonic()
    (home / "hpcc").mkdir()
    shutil.copy(PROGRAMS / "hpccinf.txt", home / "hpcc/hpccinf.txt")
    for path in (home / "hpcc", home / "hpcc/hpccinf.txt"):
        shutil.chown(path, ALICE_UID, ALICE_UID)
    _, out, err = await s.ssh(
        "alice",
        "cd hpcc && salloc -N2 -n2 -p hpc -t 5 mpirun -n 2 hpcc && grep -E "
        "'^(Success|HPL_Tflops|AvgPingPongLatency_usec|AvgPingPongBandwidth_GBytes)=' hpccoutf.txt",
    )
    figures = dict(line.split("=", 1) for line in out.split() if "=" in line)
    assert figures.get("Success") == "1", out + err
    print(
        f"hpcc on 2 slurmd pods: HPL {float(figures['HPL_Tflops']) * 1000:.2f} Gflop/s, "
        f"ping-pong {figures['AvgPingPongLatency_usec']} us, "
        f"{figures['AvgPingPongBandwidth_GBytes']} GB/s"
    )
    i.timings["hpcc (N=1000), salloc -N2 + mpirun"] = time.monotonic() - t1

    # ------------------------------------------------ PyTorch DDP: one rank per pod by srun
    t1 = time.monotonic()
    _, out, err = await s.ssh(
        "alice",
        "srun -N2 -n2 -p hpc -t 5 --export=ALL,USE_LIBUV=0 python3 ddp_train.py",
    )
    ranks = rank_lines(out)
    assert sorted(ranks) == [0, 1], out + err
    assert on_nodes(ranks) == set(pods), out
    for line in ranks.values():
        m = re.search(r"loss ([\d.]+) -> ([\d.]+), weights identical on all ranks: (\w+)", line)
        assert m, line
        first, last, same = float(m.group(1)), float(m.group(2)), m.group(3)
        assert same == "True", line
        assert last < 0.05 * first, line
    i.timings["PyTorch DDP, 2 ranks on 2 pods, 300 steps"] = time.monotonic() - t1
    print(out)

    # ------------------------------------------------ apptainer: a directory image run in a
    # job step of 1 CPU and one of 2 sees the step's CPUs. A SIF built here does not run in
    # the pod: without FUSE apptainer unpacks it first, in a helper container that mounts a
    # new procfs, which the kernel refuses under the pod's masked /proc.
    t1 = time.monotonic()
    await s.ssh(
        "alice",
        "rm -rf rootfs c.sif && mkdir -p rootfs/bin && cp /bin/busybox rootfs/bin/ && "
        "for a in sh nproc cat; do ln -s busybox rootfs/bin/$a; done && "
        "apptainer -s build c.sif rootfs && test -s c.sif",
    )
    for cpus in (1, 2):
        _, out, err = await s.ssh(
            "alice", f"srun -N1 -n1 -c{cpus} -p hpc -t 5 apptainer -s exec rootfs nproc"
        )
        assert out.split() == [str(cpus)], out + err
    rc, out, err = await s.ssh(
        "alice", "srun -N1 -n1 -p hpc -t 5 apptainer -s exec c.sif nproc", check=False
    )
    assert rc != 0 and "can't mount proc filesystem to /proc" in err, out + err
    i.timings["apptainer exec in 1- and 2-CPU steps"] = time.monotonic() - t1

    # ------------------------------------------------ Slurm's own: srun --container with an
    # OCI bundle in the shared home (crun, rootless): the bundle's files, the step's CPUs.
    t1 = time.monotonic()
    await s.ssh("alice", "python3 oci_bundle.py bundle")
    _, out, err = await s.ssh(
        "alice",
        "srun -N1 -n1 -c1 -p hpc -t 5 --container=$HOME/bundle "
        "sh -c 'nproc; [ -e /etc/os-release ] && echo pod || echo bundle; id -u'",
    )
    assert out.split() == ["1", "bundle", str(ALICE_UID)], out + err
    i.timings["srun --container, a 1-CPU step"] = time.monotonic() - t1
