"""HPC and AI jobs on the site's slurmd pods (tests/e2e/test_site.py calls `hpc_jobs`, on its
one installation): the login pod and NodeSets `hpc` (two pods) and `sif` (one, privileged)
run the slurm-hpc image (`make images`); a user from the directory logs in with an SSH key
and runs, from her shared home:

- an MPICH allreduce across the two pods, each rank started by `srun --mpi=pmi2` (Debian's
  Slurm has no mpi/pmix plugin: `srun --mpi=list` says so); `sacct` of that job shows both
  pods, the step's MaxRSS and TotalCPU;
- an OpenMPI (mpi4py) allreduce across them, `mpirun` inside `salloc` (PRRTE starts its
  daemons with srun; the image removes Debian's loopback-only TCP default that breaks it);
- the HPC Challenge benchmark (hpcc) across them, its HPL and ping-pong figures printed;
- a PyTorch DDP training, one rank per pod started by srun (gloo, USE_LIBUV=0), that
  converges with the same weights on both ranks;
- `apptainer exec` of a SIF built in the test and `srun --container` of an OCI bundle (crun,
  rootless, `oci.conf` from the chart's values), each seeing its job step's CPUs and its
  job's memory limit. The SIF runs on NodeSet `sif`, privileged: without FUSE apptainer
  unpacks a SIF in a helper container that mounts a new procfs, which the kernel refuses
  under an unprivileged pod's masked /proc (measured: "can't mount proc filesystem to
  /proc"); a directory image runs in any pod.

The HPC image is imported into the bed's nodes by the site fixture (the test bed imports only
the images every test needs)."""

from __future__ import annotations

import re
import shlex
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slinky_testbed import images, nodes
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for

if TYPE_CHECKING:
    from slinky_testbed.ldap import User
    from tests.e2e.test_site import Site

JSON = dict[str, Any]
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
# The memory limit of the job whose cgroup the process itself is in, on the bed's cgroup v1
# nodes: its memory cgroup (/proc/self/cgroup) cut after Slurm's job_<id> level
# (slurm_<node>/uid_<uid>/job_<id> below the pod's own), read where the memory hierarchy is
# mounted in the container (`root`).
MEMORY_LIMIT = (
    'cg=$(sed -n "s|^[0-9]*:memory:.*\\(/slurm[^/]*/uid_[0-9]*/job_[0-9]*\\)/.*|\\1|p" '
    "/proc/self/cgroup); cat {root}$cg/memory.limit_in_bytes"
)


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


def hpc_values(values: JSON, hpc_image: str) -> None:
    """Adds to the slurm chart's `values`: the HPC image for the login pods, NodeSets `hpc`
    (two pods) and `sif` (one, privileged) of it, and oci.conf."""
    image = chart_image(hpc_image)
    values["login"]["image"] = image
    values["compute"]["nodesets"] += [
        {"name": "hpc", "replicas": 2, "image": image},
        {"name": "sif", "replicas": 1, "image": image, "securityContext": {"privileged": True}},
    ]
    values.setdefault("slurmConfig", {}).setdefault("configFiles", {})["oci.conf"] = OCI_CONF


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


def one_rank_on_each(out: str, err: str, pods: list[str]) -> dict[int, str]:
    """The rank lines of a 2-rank run, asserted to be ranks 0 and 1, one on each pod."""
    ranks = rank_lines(out)
    assert sorted(ranks) == [0, 1], out + err
    assert on_nodes(ranks) == set(pods), out
    return ranks


async def hpc_jobs(s: Site, user: User) -> None:
    """Everything above, as `user` (a directory user with an association) on the login pod."""
    i = s.i
    name = user.name
    pods = [f"{i.nodeset('hpc')}-0", f"{i.nodeset('hpc')}-1"]
    home = i.work / "homes" / name  # made by her first login (pam_mkhomedir)
    for program in JOB_PROGRAMS:
        shutil.copy(PROGRAMS / program, home / program)
        (home / program).chmod(0o644)
        shutil.chown(home / program, user.uid, user.uid)

    # ------------------------------------------------ MPI plugins of Debian's Slurm
    _, out, _ = await s.ssh(name, "srun --mpi=list")
    assert "pmi2" in out.split() and "pmix" not in out, out

    # ------------------------------------------------ MPICH: srun starts every rank (PMI-2)
    t1 = time.monotonic()
    _, out, err = await s.ssh(
        name, "srun -J wl-mpich -N2 -n2 -p hpc -t 5 --mpi=pmi2 python3 mpich_allreduce.py"
    )
    ranks = one_rank_on_each(out, err, pods)
    assert all("allreduce=3 MPICH" in line for line in ranks.values()), out
    i.timings["workloads: MPICH allreduce, srun --mpi=pmi2 -N2"] = time.monotonic() - t1
    print(out)
    await mpi_job_accounted(s, name, pods)

    # ------------------------------------------------ OpenMPI: mpirun inside salloc
    t1 = time.monotonic()
    _, out, err = await s.ssh(
        name, "salloc -N2 -n2 -p hpc -t 5 mpirun -n 2 python3 mpi4py_allreduce.py"
    )
    ranks = one_rank_on_each(out, err, pods)
    assert all("allreduce=3 Open MPI" in line for line in ranks.values()), out
    i.timings["workloads: OpenMPI (mpi4py) allreduce, salloc -N2 + mpirun"] = time.monotonic() - t1
    print(out)

    # ------------------------------------------------ HPC Challenge on the two pods (a small
    # HPL, N=1000: the figures are printed, not judged: this 2-core machine is shared)
    t1 = time.monotonic()
    (home / "hpcc").mkdir()
    shutil.copy(PROGRAMS / "hpccinf.txt", home / "hpcc/hpccinf.txt")
    for path in (home / "hpcc", home / "hpcc/hpccinf.txt"):
        shutil.chown(path, user.uid, user.uid)
    _, out, err = await s.ssh(
        name,
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
    i.timings["workloads: hpcc (N=1000), salloc -N2 + mpirun"] = time.monotonic() - t1

    # ------------------------------------------------ PyTorch DDP: one rank per pod by srun
    t1 = time.monotonic()
    _, out, err = await s.ssh(
        name, "srun -N2 -n2 -p hpc -t 5 --export=ALL,USE_LIBUV=0 python3 ddp_train.py"
    )
    ranks = one_rank_on_each(out, err, pods)
    for line in ranks.values():
        m = re.search(r"loss ([\d.]+) -> ([\d.]+), weights identical on all ranks: (\w+)", line)
        assert m, line
        first, last, same = float(m.group(1)), float(m.group(2)), m.group(3)
        assert same == "True", line
        assert last < 0.05 * first, line
    i.timings["workloads: PyTorch DDP, 2 ranks on 2 pods, 300 steps"] = time.monotonic() - t1
    print(out)

    await containers(s, name, user.uid)


async def mpi_job_accounted(s: Site, name: str, pods: list[str]) -> None:
    """sacct of the MPICH job: both pods, and its MPI step's MaxRSS and TotalCPU."""

    async def recorded() -> dict[str, list[str]] | None:
        _, out, _ = await s.ssh(
            name, "sacct -n -P --name=wl-mpich -o JobID,State,NodeList,MaxRSS,TotalCPU",
            check=False,
        )  # fmt: skip
        rows = {r[0]: r[1:] for r in (line.split("|") for line in out.splitlines()) if r[0]}
        step = [v for k, v in rows.items() if k.endswith(".0")]
        done = step and step[0][0] == "COMPLETED" and step[0][2]
        return rows if done else None

    rows = await wait_for(recorded, timeout=120, interval=2, what="sacct of the MPICH job")
    job = next(v for k, v in rows.items() if "." not in k)
    step = next(v for k, v in rows.items() if k.endswith(".0"))
    _, hosts, _ = await s.ssh(name, f"scontrol show hostnames {shlex.quote(job[1])}")
    assert sorted(hosts.split()) == sorted(pods), rows
    assert job[0] == "COMPLETED", rows
    assert re.fullmatch(r"[1-9]\d*(\.\d+)?[KMG]", step[2]), rows  # MaxRSS
    assert re.fullmatch(r"[\d:.-]+", step[3]) and re.search(r"[1-9]", step[3]), rows  # TotalCPU
    print(f"sacct of the MPICH job: {rows}")


async def containers(s: Site, name: str, uid: int) -> None:
    """A SIF built here run by apptainer, and an OCI bundle run by Slurm with crun, each in a
    1-CPU and a 2-CPU step: the step's CPUs and the job's memory limit seen inside."""
    i = s.i
    t1 = time.monotonic()
    await s.ssh(
        name,
        "rm -rf rootfs c.sif && mkdir -p rootfs/bin && cp /bin/busybox rootfs/bin/ && "
        "for a in sh nproc cat id sed; do ln -s busybox rootfs/bin/$a; done && "
        "apptainer -s build c.sif rootfs && test -s c.sif",
    )
    limit = MEMORY_LIMIT.format(root="/cg")
    for cpus, mem in ((1, 300), (2, 400)):
        _, out, err = await s.ssh(
            name,
            f"srun -N1 -n1 -c{cpus} --mem={mem}M -p sif -t 5 apptainer -s exec "
            f"-B /sys/fs/cgroup/memory:/cg c.sif sh -c 'nproc; {limit}'",
        )
        assert out.split() == [str(cpus), str(mem * 1024 * 1024)], out + err
    i.timings["workloads: apptainer exec of a SIF, 1- and 2-CPU steps"] = time.monotonic() - t1

    # Slurm's own: srun --container with an OCI bundle in the shared home (crun, rootless):
    # the bundle's files, the step's CPUs, the user's uid, the job's memory limit.
    t1 = time.monotonic()
    await s.ssh(name, "python3 oci_bundle.py bundle")
    limit = MEMORY_LIMIT.format(root="/sys/fs/cgroup/memory")
    _, out, err = await s.ssh(
        name,
        "srun -N1 -n1 -c1 --mem=300M -p hpc -t 5 --container=$HOME/bundle "
        f"sh -c 'nproc; [ -e /etc/os-release ] && echo pod || echo bundle; id -u; {limit}'",
    )
    assert out.split() == ["1", "bundle", str(uid), str(300 * 1024 * 1024)], out + err
    i.timings["workloads: srun --container, a 1-CPU step"] = time.monotonic() - t1
