"""What running MPI in slurmd pods costs against plain processes on the host (issue 48 part 4).

The same programs, from the same files, run in interleaved rounds (pods, host, pods, host...):

- pods: two slurmd pods of the slurm-hpc image on two real nodes of the bench test bed, each
  registered with the test bed's host-run slurmctld (`slurmd -Z`, configless, as
  `slinky_testbed.pods` makes them; no chart: the figures are the pods', not the operator's);
  `salloc -N2` from the first pod, then OpenMPI's `mpirun` (PRRTE starts its daemons by srun),
  one rank per pod;
- host: the slurm-hpc image's root file system, unpacked once under the cache
  (`hpc_root`), entered by `unshare` + `chroot` with the host's network, `mpirun` with two
  ranks on this machine.

Both sides use OpenMPI's TCP transport only (`pml ob1`, `btl tcp,self`, one interface), one
thread per rank and rank r pinned to CPU r, so the difference is the path between the ranks
and the pod's confinement, not the choice of transport or a shared core. Figures per round:
mpi4py ping-pong latency (8 B, half a round trip) and bandwidth (4 MiB), allreduce of 8 B and
1 MiB, and hpcc's HPL and StarDGEMM (Gflop/s). Then each figure's median on both sides, the
pods/host ratio and the goal (HPL within 5%, latency within 1.5x, bandwidth at least 0.8x).

Both "nodes" of the test bed are on this one machine: between pods a packet crosses two veths,
two bridges and a route inside the test bed's network namespace, where the host's two ranks
talk over loopback. Neither is a real network: the figures say what the pod's path and
confinement add, not what a cluster's NICs give.

Run: `python -m bench.bench_workloads` (8-10 minutes on a warm bed; `BENCH_ROUNDS` rounds
each, default 5; results in docs/workloads.md). Not part of `make bench` (`IN_MAKE_BENCH`): it
needs the slurm-hpc image (1.3 GiB per node) and the CPUs to itself.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from slinky_testbed import images, nodes, paths, pods
from slinky_testbed.bed import Testbed

# Minutes long, the HPC image on two nodes and the CPUs to itself: run alone.
IN_MAKE_BENCH = False
NS = "bench-workloads"
POD_NAMES = ("wlbench-0", "wlbench-1")
WORK = "/tmp/wlbench"  # the programs' directory, in the pods and in the host's root
HPL_N = 4000
ROUNDS = int(os.environ.get("BENCH_ROUNDS", "5"))

# mpi4py ping-pong and allreduce between two ranks; rank 0 prints `figure NAME VALUE`.
MPI_PROGRAM = """\
import sys, time
from mpi4py import MPI
import numpy as np
comm = MPI.COMM_WORLD
rank, peer = comm.Get_rank(), 1 - comm.Get_rank()
def pingpong(size, iters):
    buf = np.zeros(size, dtype=np.uint8)
    for i in range(iters + iters // 10):
        if i == iters // 10:
            comm.Barrier()
            t0 = time.perf_counter()
        if rank == 0:
            comm.Send([buf, MPI.BYTE], dest=peer); comm.Recv([buf, MPI.BYTE], source=peer)
        else:
            comm.Recv([buf, MPI.BYTE], source=peer); comm.Send([buf, MPI.BYTE], dest=peer)
    return (time.perf_counter() - t0) / iters / 2  # one way
def allreduce(count, iters):
    a, b = np.ones(count), np.zeros(count)
    for i in range(iters + iters // 10):
        if i == iters // 10:
            comm.Barrier()
            t0 = time.perf_counter()
        comm.Allreduce(a, b, op=MPI.SUM)
    assert b[0] == comm.Get_size()
    return (time.perf_counter() - t0) / iters
lat = pingpong(8, 2000)
big = 4 << 20
bw = big / pingpong(big, 40)
ar_small = allreduce(1, 2000)
ar_big = allreduce(131072, 40)
if rank == 0:
    print(f"figure latency_us {lat * 1e6:.3f}")
    print(f"figure bandwidth_MBps {bw / 1e6:.1f}")
    print(f"figure allreduce_8B_us {ar_small * 1e6:.3f}")
    print(f"figure allreduce_1MiB_us {ar_big * 1e6:.1f}")
    print(f"figure host {MPI.Get_processor_name()}")
sys.stdout.flush()
"""

HPCC_INPUT = f"""\
HPLinpack benchmark input file
slinky bench_workloads: 2 ranks, one core each
HPL.out      output file name (if any)
8            device out (6=stdout,7=stderr,file)
1            # of problems sizes (N)
{HPL_N}         Ns
1            # of NBs
128          NBs
0            PMAP process mapping (0=Row-,1=Column-major)
1            # of process grids (P x Q)
1            Ps
2            Qs
16.0         threshold
1            # of panel fact
2            PFACTs (0=left, 1=Crout, 2=Right)
1            # of recursive stopping criterium
4            NBMINs (>= 1)
1            # of panels in recursion
2            NDIVs
1            # of recursive panel fact.
1            RFACTs (0=left, 1=Crout, 2=Right)
1            # of broadcast
1            BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)
1            # of lookahead depth
1            DEPTHs (>=0)
2            SWAP (0=bin-exch,1=long,2=mix)
64           swapping threshold
0            L1 in (0=transposed,1=no-transposed) form
0            U  in (0=transposed,1=no-transposed) form
1            Equilibration (0=no,1=yes)
8            memory alignment in double (> 0)
##### This line (no. 32) is ignored (it serves as a separator). ######
0                               Number of additional problem sizes for PTRANS
1200 10000 30000                values of N
0                               number of additional blocking sizes for PTRANS
40 9 8 13 13 20 16 32 64        values of NB
"""

# The same MPI settings on both sides: TCP only, one thread per rank.
MPI_ENV = {
    "OMPI_MCA_pml": "ob1",
    "OMPI_MCA_btl": "tcp,self",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "OMPI_ALLOW_RUN_AS_ROOT": "1",
    "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
}
# Rank r on CPU r (the machine has 2).
PIN = '#!/bin/sh\nexec taskset -c "$OMPI_COMM_WORLD_RANK" "$@"'


@dataclass(frozen=True)
class Goal:
    figure: str
    unit: str
    higher_is_better: bool
    bound: float  # the pods/host ratio the goal allows (at least for higher, at most for lower)
    says: str


GOALS = (
    Goal("hpl_gflops", "Gflop/s", True, 0.95, "HPL within 5% of the host"),
    Goal("stardgemm_gflops", "Gflop/s", True, 0.95, "DGEMM per rank within 5%"),
    Goal("latency_us", "us", False, 1.5, "ping-pong latency within 1.5x"),
    Goal("bandwidth_MBps", "MB/s", True, 0.8, "ping-pong bandwidth at least 0.8x"),
    Goal("allreduce_8B_us", "us", False, 1.5, "like latency"),
    Goal("allreduce_1MiB_us", "us", False, 1.25, "like bandwidth (1/0.8)"),
)


# ---------------------------------------------------------------- pure parts


def parse_figures(out: str) -> dict[str, float]:
    """`figure NAME VALUE` lines of the MPI program's output, numeric ones only."""
    found: dict[str, float] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "figure":
            try:
                found[parts[1]] = float(parts[2])
            except ValueError:
                continue
    for goal in GOALS[2:]:
        if goal.figure not in found:
            raise ValueError(f"the MPI program printed no {goal.figure}: {out[-2000:]!r}")
    return found


def parse_hpcc(text: str) -> dict[str, float]:
    """HPL and StarDGEMM Gflop/s from hpcc's summary (`hpccoutf.txt`), which must say
    `Success=1`."""
    summary = dict(
        line.split("=", 1) for line in text.splitlines() if re.match(r"^\w+=\S", line.strip())
    )
    if summary.get("Success") != "1":
        raise ValueError(f"hpcc did not succeed (Success={summary.get('Success')!r})")
    try:
        return {
            "hpl_gflops": float(summary["HPL_Tflops"]) * 1000,
            "stardgemm_gflops": float(summary["StarDGEMM_Gflops"]),
        }
    except (KeyError, ValueError) as e:
        raise ValueError(f"hpcc's summary has no usable {e}") from e


def spread(values: list[float]) -> str:
    """(max - min) / median, in percent: how much the rounds of one side disagree."""
    m = statistics.median(values)
    return f"{(max(values) - min(values)) / m * 100:.0f}%" if m else "-"


def best(values: list[float], higher_is_better: bool) -> float:
    return max(values) if higher_is_better else min(values)


def ratio_lines(
    pods_side: dict[str, list[float]], host_side: dict[str, list[float]], *, of_best: bool = False
) -> list[str]:
    """One line per goal: both medians (the unit is in the figure's name), or with `of_best`
    each side's best round (other load on the machine only makes a figure worse), the
    pods/host ratio, each side's spread over its rounds and whether the goal is met."""
    what = "best" if of_best else "median"
    lines = [
        f"{'figure (' + what + ')':<18} {'pods':>9} {'host':>9} {'pods/host':>9} "
        f"{'spread p/h':>11}  goal",
    ]
    for g in GOALS:
        p, h = pods_side.get(g.figure, []), host_side.get(g.figure, [])
        if not p or not h:
            lines.append(
                f"{g.figure:<18} {'-':>9} {'-':>9} {'-':>9} {'-':>11}  {g.says}: not measured"
            )
            continue
        if of_best:
            mp, mh = best(p, g.higher_is_better), best(h, g.higher_is_better)
        else:
            mp, mh = statistics.median(p), statistics.median(h)
        ratio = mp / mh if mh else float("inf")
        met = ratio >= g.bound if g.higher_is_better else ratio <= g.bound
        sign = ">=" if g.higher_is_better else "<="
        lines.append(
            f"{g.figure:<18} {mp:>9.2f} {mh:>9.2f} {ratio:>9.2f} "
            f"{spread(p) + '/' + spread(h):>11}  "
            f"{g.says} ({sign} {g.bound}): {'met' if met else 'NOT met'}"
        )
    return lines


def whiteouts(members: Iterable[str]) -> tuple[list[str], list[str]]:
    """The paths a layer's whiteout files delete from the layers below, and the directories
    its opaque markers empty (the layer's own files are extracted after both)."""
    deleted, emptied = [], []
    for m in members:
        path = m.removeprefix("./")
        head, _, name = path.rpartition("/")
        if name == ".wh..wh..opq":
            emptied.append(head)
        elif name.startswith(".wh."):
            deleted.append(f"{head}/{name[4:]}" if head else name[4:])
    return deleted, emptied


# ---------------------------------------------------------------- the host's side


def hpc_root() -> Path:
    """The slurm-hpc image's file system (the Slurm root and the HPC layer, whiteouts
    applied), unpacked once under the cache; again when either tarball changes."""
    base = paths.cache_dir() / "slurm-root-sid.tar.zst"
    layer = images.hpc_layer_tarball()
    for t in (base, layer):
        if not t.exists():
            raise FileNotFoundError(f"{t} is missing: run `make images`")
    root = paths.cache_dir() / "slurm-hpc-root"
    stamp = paths.cache_dir() / "slurm-hpc-root.stamp"
    want = json.dumps([images.file_fingerprint(base), images.file_fingerprint(layer)])
    if root.is_dir() and stamp.exists() and stamp.read_text() == want:
        return root
    t0 = time.monotonic()
    stamp.unlink(missing_ok=True)
    if root.exists():
        shutil.rmtree(root)
    tmp = Path(tempfile.mkdtemp(prefix="slurm-hpc-root.", dir=paths.cache_dir()))
    subprocess.run(["tar", "-C", str(tmp), "--zstd", "-xpf", str(base)], check=True)
    listing = subprocess.run(
        ["tar", "--zstd", "-tf", str(layer)], check=True, capture_output=True, text=True
    ).stdout.split("\n")
    deleted, emptied = whiteouts(listing)
    for rel in deleted:
        target = tmp / rel
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        else:
            target.unlink(missing_ok=True)
    for rel in emptied:
        d = tmp / rel
        if d.is_dir() and not d.is_symlink():
            for child in d.iterdir():
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child)
                else:
                    child.unlink()
    subprocess.run(
        ["tar", "-C", str(tmp), "--zstd", "-xpf", str(layer), "--wildcards", "--exclude=*/.wh.*"],
        check=True,
    )
    tmp.rename(root)
    stamp.write_text(want)
    print(f"slurm-hpc root unpacked into {root} in {time.monotonic() - t0:.0f}s")
    return root


def default_interface() -> str:
    """The interface of the host's default route (the host's ranks talk over its address:
    the kernel carries that over loopback)."""
    out = subprocess.run(
        ["ip", "-o", "route", "show", "default"], check=True, capture_output=True, text=True
    ).stdout
    m = re.search(r"\bdev (\S+)", out)
    if not m:
        raise RuntimeError(f"no default route on this host: {out!r}")
    return m.group(1)


def in_root(root: Path, script: str, env: dict[str, str]) -> str:
    """`script` run by sh inside `root` with the host's network, its own mount and PID
    namespaces (/proc, /sys, /dev there end with it); its output."""
    r = shlex.quote(str(root))
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    inner = (
        f"mount -t proc proc {r}/proc && mount --rbind /sys {r}/sys && "
        f"mount --rbind /dev {r}/dev && mount -t tmpfs -o size=256m tmpfs {r}/dev/shm && "
        f"exec chroot {r} env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root {exports} "
        f"sh -c {shlex.quote(script)}"
    )
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "sh", "-c", inner],
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"on the host: ...{script[-300:]!r} failed: {done.stdout[-2000:]}{done.stderr}"
        )
    return done.stdout


def prepare_dir_script() -> str:
    return (
        f"mkdir -p {WORK} && cd {WORK} && printf %s {shlex.quote(HPCC_INPUT)} > hpccinf.txt && "
        f"printf %s {shlex.quote(MPI_PROGRAM)} > pingpong.py && "
        f"printf '%s\\n' {shlex.quote(PIN)} > pin && chmod +x pin"
    )


def host_round(root: Path, iface: str) -> dict[str, float]:
    env = {**MPI_ENV, "OMPI_MCA_btl_tcp_if_include": iface}
    mpirun = "mpirun -n 2 --host localhost:2 --bind-to none --allow-run-as-root"
    out = in_root(
        root,
        f"{prepare_dir_script()} && rm -f hpccoutf.txt && "
        f"{mpirun} ./pin python3 pingpong.py && {mpirun} ./pin hpcc >/dev/null && "
        "cat hpccoutf.txt",
        env,
    )
    return {**parse_figures(out), **parse_hpcc(out)}


# ---------------------------------------------------------------- the pods' side


def kubectl(bed: Testbed, *args: str, stdin: str | None = None) -> str:
    done = subprocess.run(
        [str(paths.bin_dir() / "kubectl"), f"--kubeconfig={bed.kubeconfig}", *args],
        input=stdin,
        check=False,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {shlex.join(args)[-500:]}: {done.stdout[-2000:]}{done.stderr}")
    return done.stdout


def in_pod(bed: Testbed, pod: str, script: str) -> str:
    return kubectl(bed, "-n", NS, "exec", pod, "-c", "slurmd", "--", "sh", "-c", script)


def import_hpc_image(bed: Testbed) -> str:
    """The slurm-hpc image in each real node's containerd (a stamp per node root, the one
    tests/e2e/site_workloads.py keeps); its reference."""
    hpc = images.image("slurm-hpc")
    for name in bed.load().real_nodes[:2]:
        sock = bed.nodes_dir / name / "containerd" / "containerd.sock"
        stamp = bed.dir / "containerd-roots" / f"{name}.slurm-hpc-imported"
        t0 = time.monotonic()
        if nodes.import_images(sock, [hpc.archive], stamp):
            print(f"slurm-hpc imported into {name} in {time.monotonic() - t0:.0f}s")
    return hpc.ref


def start_pods(bed: Testbed, image: str) -> None:
    """Two slurmd pods of the HPC image, one per real node, each a 2-CPU Slurm node, IDLE."""
    docs: list[dict[str, object]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        pods.slurm_key_secret(bed, NS),
    ]
    for pod, node in zip(POD_NAMES, bed.load().real_nodes, strict=False):
        spec = pods.slurmd_pod_spec(
            ["-D", "-Z", "--conf-server", bed.slurmctld_addr, "--conf", "CPUs=2 RealMemory=2000"]
        )
        spec["containers"][0]["image"] = image
        spec["nodeSelector"] = {"kubernetes.io/hostname": node}
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": pod, "namespace": NS},
                "spec": spec,
            }
        )
    kubectl(
        bed,
        "apply",
        "-f",
        "-",
        stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}),
    )
    kubectl(bed, "-n", NS, "wait", "--for=condition=Ready", "--timeout=300s", "pod", *POD_NAMES)
    deadline = time.monotonic() + 120
    names = ",".join(POD_NAMES)
    while True:
        with_states = in_pod(bed, POD_NAMES[0], f"sinfo -h -N -n {names} -o '%N %T' || true")
        states = dict(line.split() for line in with_states.splitlines() if len(line.split()) == 2)
        if all(states.get(p) == "idle" for p in POD_NAMES):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"slurmd pods not idle in Slurm within 120 s: {states}")
        time.sleep(1)


def stop_pods(bed: Testbed) -> None:
    kubectl(bed, "delete", "namespace", NS, "--ignore-not-found", "--wait=true", "--timeout=120s")


def pods_round(bed: Testbed) -> dict[str, float]:
    for pod in POD_NAMES:
        in_pod(bed, pod, prepare_dir_script())
    exports = " ".join(f"{k}={v}" for k, v in MPI_ENV.items())
    names = ",".join(POD_NAMES)
    mpirun = "mpirun -n 2 --map-by node --bind-to none --allow-run-as-root"
    out = in_pod(
        bed,
        POD_NAMES[0],
        f"cd {WORK} && rm -f hpccoutf.txt && export {exports} && "
        f"salloc -N2 -n2 -w {names} --exclusive -t 10 sh -c "
        + shlex.quote(f"{mpirun} ./pin python3 pingpong.py && {mpirun} ./pin hpcc >/dev/null")
        + " && cat hpccoutf.txt",
    )
    figures = {**parse_figures(out), **parse_hpcc(out)}
    return figures


# ---------------------------------------------------------------- the run


def show(side: str, n: int, figures: dict[str, float], seconds: float) -> None:
    said = ", ".join(f"{g.figure} {figures[g.figure]:.2f}" for g in GOALS if g.figure in figures)
    load = os.getloadavg()[0]
    print(f"round {n} {side:<4} ({seconds:.0f}s, load {load:.1f}): {said}", flush=True)


# What confines a process: its seccomp mode, the CPUs it may use, its cgroup's CPU share
# (cgroup v1: a pod sees its container's cgroup at the top of /sys/fs/cgroup, no cgroupns).
FACTS = (
    "grep -E '^(Seccomp|Cpus_allowed_list):' /proc/self/status | tr -s '\\t' ' '; "
    "c=$(grep -E ':cpu(,cpuacct)?:' /proc/self/cgroup | cut -d: -f2-); "
    "d=/sys/fs/cgroup/${c%%:*}; echo cgroup $c cpu.shares "
    "$(cat $d${c#*:}/cpu.shares 2>/dev/null || cat $d/cpu.shares)"  # a pod: its own at the top
)


def facts(bed: Testbed, root: Path) -> None:
    """Print what confines the ranks on each side."""
    pod = " ".join(in_pod(bed, POD_NAMES[0], FACTS).split())
    host = " ".join(in_root(root, FACTS, {}).split())
    print(f"a pod's process: {pod}\na host process: {host}")


def run(bed: Testbed, rounds: int) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    root = hpc_root()
    iface = default_interface()
    start_pods(bed, import_hpc_image(bed))
    facts(bed, root)
    got: dict[str, dict[str, list[float]]] = {"pods": {}, "host": {}}
    try:
        for n in range(1, rounds + 1):
            for side in ("pods", "host"):
                t0 = time.monotonic()
                figures = pods_round(bed) if side == "pods" else host_round(root, iface)
                show(side, n, figures, time.monotonic() - t0)
                for k, v in figures.items():
                    got[side].setdefault(k, []).append(v)
    finally:
        stop_pods(bed)
    return got["pods"], got["host"]


def main(argv: Sequence[str] | None = None) -> None:
    from bench.common import bench_testbed

    bed = bench_testbed()
    print(
        f"bench_workloads: {ROUNDS} interleaved rounds, OpenMPI over TCP, 2 ranks pinned to "
        f"CPUs 0 and 1, hpcc N={HPL_N}; both test-bed nodes are on this machine"
    )
    pods_side, host_side = run(bed, ROUNDS)
    print()
    print("\n".join(ratio_lines(pods_side, host_side)))
    print()
    print("\n".join(ratio_lines(pods_side, host_side, of_best=True)))


if __name__ == "__main__":
    main()
