"""slurm-bridge hand-over on real nodes: N short pods, each given a whole node by Slurm
(exclusive, the default), run one after another; how long a node stands idle between one
pod's end and the next pod's start, and where those seconds go.

What is real: the bench test bed's real nodes (kubelet, containerd, runc), its apiserver,
slurmctld and slurmrestd, and the bridge as its own process (nodes, scheduler and workload
components). Two of the real nodes are labelled as the bridge's EXTERNAL nodes, without the
managed-node taint (it would evict the test bed's own pods there). Each pod runs
`sleep 5` and prints the time at its start and end (date +%s.%N, the same clock as the
bench: one machine).

Each hand-over on a node (pod A ends, pod B starts) is split into:
- report: A's container ended -> the bench's watch sees A's containers reported ended (the
  kubelet's status report; its PLEG relists every second);
- cancel: that -> the bridge cancelled A's job (its workload controller; the bridge's log);
- Slurm: that -> slurmctld allocated B's job (its log: "sched: Allocate"; it runs the pass
  a freed EXTERNAL node waits for on the next whole second of its clock, whatever asks for
  it);
- bind: that -> B seen bound (the bridge's job watch sees the allocation, B is bound);
- start: B bound -> B's container started (the kubelet: sandbox, container).
Also printed: terminal, A's container ended -> A seen Succeeded (the kubelet writes the phase
once it has torn down the sandbox; the bridge no longer waits for it when B fits beside A).

Baseline, the same run: the ideal time (pods x 5 s / nodes, no gap) and the 5 s the pods
themselves measured. Run: `python -m bench.bench_handover` (in `make bench`). Env:
BENCH_HANDOVER_RUNS (default "10x1,20x2": pods x nodes).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import re
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.bench_bridge import OWN_NS, SCHEDULER, bridge_bench, start_bridge, stop_bench, until
from bench.common import bench_testbed, pct
from slinky.bridge import podcontrol
from slinky.bridge.labels import EXTERNAL_NODE
from slinky.kube import rest
from slinky.kube.informer import Handler, InformerFactory
from slinky.slurm.client import SlurmClient
from slinky_testbed import nodes, paths

JSON = dict[str, Any]
NS = "bench-handover"
PARTITION = "slurm-bridge"
SLEEP_S = 5
RUNS = [
    tuple(int(x) for x in r.split("x"))
    for r in os.environ.get("BENCH_HANDOVER_RUNS", "10x1,20x2").split(",")
]


@dataclass
class Seen:
    """When the bench's watch first saw each pod bound, its containers ended, and
    Succeeded (wall clock)."""

    bound: dict[str, float] = field(default_factory=dict)
    ended: dict[str, float] = field(default_factory=dict)
    succeeded: dict[str, float] = field(default_factory=dict)
    node: dict[str, str] = field(default_factory=dict)

    def on(self, pod: JSON) -> None:
        name = pod["metadata"]["name"]
        node = pod["spec"].get("nodeName")
        if node and name not in self.bound:
            self.bound[name] = time.time()
            self.node[name] = node
        if podcontrol.has_ended(pod) and name not in self.ended:
            self.ended[name] = time.time()
        if (pod.get("status") or {}).get("phase") == "Succeeded" and name not in self.succeeded:
            self.succeeded[name] = time.time()


def handover_pod(name: str, run: str, node_names: list[str]) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"bench-run": run}},
        "spec": {
            "schedulerName": SCHEDULER,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "kubernetes.io/hostname",
                                        "operator": "In",
                                        "values": node_names,
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
            "containers": [
                {
                    "name": "c",
                    "image": nodes.image_ref("slurm"),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sh", "-c", f"date +%s.%N; sleep {SLEEP_S}; date +%s.%N"],
                    "resources": {"requests": {"cpu": "100m", "memory": "16Mi"}},
                }
            ],
        },
    }


async def register(kube: rest.Kube, slurm: SlurmClient, names: list[str]) -> None:
    for name in names:
        await kube.patch(rest.NODES, name, {"metadata": {"labels": {EXTERNAL_NODE: "true"}}})

    async def registered() -> bool:
        got, _ = await slurm.list_nodes()
        return all(
            any(n.name == name and PARTITION in n.partitions and n.state.is_idle for n in got or [])
            for name in names
        )

    await until(registered, f"{names} registered in Slurm, idle", 180)


async def clear(kube: rest.Kube) -> None:
    """Every pod of the namespace deleted and gone (the bridge cancels their jobs)."""
    await kube.request("DELETE", rest.PODS.path(NS))

    async def gone() -> bool:
        return not (await kube.list(rest.PODS, NS))["items"]

    with contextlib.suppress(SystemExit):
        await until(gone, "the bench's pods gone", 120)


async def release(kube: rest.Kube, slurm: SlurmClient, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(rest.ApiError):
            await kube.patch(rest.NODES, name, {"metadata": {"labels": {EXTERNAL_NODE: None}}})

    async def gone() -> bool:
        got, _ = await slurm.list_nodes()
        return not set(names) & {n.name for n in got or []}

    with contextlib.suppress(SystemExit):
        await until(gone, "nodes released by the bridge", 120)


@dataclass
class Result:
    pods: int
    nodes: int
    makespan: float  # first container start -> last container end
    gaps: list[float]  # per hand-over: B start - A end
    report: list[float]
    terminal: list[float]
    cancel: list[float]
    slurm: list[float]
    bind: list[float]
    start: list[float]
    runtimes: list[float]


# The bridge's log lines the breakdown reads (its own words, at INFO).
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")
_CANCELLED = re.compile(r"job \d+: cancelled \(pod [^/ ]+/(\S+) is ended")
_BOUND = re.compile(r"pod [^/ ]+/(\S+): bound to \S+ \(Slurm job (\d+) on")


_SLURM_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] ")
_ALLOCATED = re.compile(r"(?:sched: Allocate|backfill: Started) JobId=(\d+) ")


def slurm_log(path: Path, job_ids: set[int]) -> dict[int, float]:
    """From slurmctld's log: when each job of `job_ids` was allocated (its last allocation;
    wall clock). A job's `start_time` will not do: a pending job's update sets it."""
    allocated: dict[int, float] = {}
    for line in path.read_text(errors="replace").splitlines():
        stamp = _SLURM_STAMP.match(line)
        m = _ALLOCATED.search(line) if stamp else None
        if stamp and m and int(m.group(1)) in job_ids:
            at = datetime.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S.%f").timestamp()
            allocated[int(m.group(1))] = at
    return allocated


def bridge_log(path: Path, names: set[str]) -> tuple[dict[str, float], dict[str, int]]:
    """From the bridge's log: when the job of each pod of `names` was cancelled (wall
    clock), and the job each was bound through."""
    cancelled: dict[str, float] = {}
    job_of: dict[str, int] = {}
    for line in path.read_text(errors="replace").splitlines():
        stamp = _STAMP.match(line)
        if stamp is None:
            continue
        if (m := _CANCELLED.search(line)) and m.group(1) in names:
            at = datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
            cancelled.setdefault(m.group(1), at)
        elif (m := _BOUND.search(line)) and m.group(1) in names:
            job_of[m.group(1)] = int(m.group(2))
    return cancelled, job_of


async def one_run(
    kube: rest.Kube,
    *,
    work: Path,
    bed_dir: Path,
    seen: Seen,
    n_pods: int,
    node_names: list[str],
) -> Result:
    run = uuid.uuid4().hex[:6]
    names = [f"h{run}-{i:02d}" for i in range(n_pods)]
    for name in names:  # one after another: Slurm's order (job ids) is the creation order
        await kube.create(rest.PODS, handover_pod(name, run, node_names), NS)

    async def all_done() -> bool:
        return all(n in seen.succeeded for n in names)

    await until(all_done, f"{n_pods} pods Succeeded", 60 + n_pods * (SLEEP_S + 30))
    times: dict[str, tuple[float, float]] = {}
    for name in names:
        out = await asyncio.to_thread(
            subprocess.run,
            [str(paths.bin_dir() / "kubectl"), f"--kubeconfig={bed_dir / 'kubeconfig'}",
             "-n", NS, "logs", name],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        stamps = out.stdout.split()
        if out.returncode != 0 or len(stamps) < 2:
            raise SystemExit(f"bench: logs of pod {name}: {out.stdout!r} {out.stderr.strip()}")
        times[name] = (float(stamps[0]), float(stamps[1]))
    cancelled, job_of = bridge_log(work / "bridge.log", set(names))
    allocated = slurm_log(bed_dir / "logs" / "slurmctld.log", set(job_of.values()))
    started = {name: allocated[j] for name, j in job_of.items() if j in allocated}
    gaps, report, terminal, start_lat = [], [], [], []
    cancel, slurm_lat, bind = [], [], []
    for node in node_names:
        on = sorted((n for n in names if seen.node.get(n) == node), key=lambda n: times[n][0])
        for a, b in itertools.pairwise(on):
            gaps.append(times[b][0] - times[a][1])
            report.append(seen.ended[a] - times[a][1])
            terminal.append(seen.succeeded[a] - times[a][1])
            start_lat.append(times[b][0] - seen.bound[b])
            if a not in cancelled or b not in started:
                continue  # B's job was allocated in its own request, not after A's cancel
            cancel.append(cancelled[a] - seen.ended[a])
            slurm_lat.append(started[b] - cancelled[a])
            bind.append(seen.bound[b] - started[b])
    await kube.request("DELETE", rest.PODS.path(NS), params={"labelSelector": f"bench-run={run}"})
    return Result(
        pods=n_pods,
        nodes=len(node_names),
        makespan=max(e for _, e in times.values()) - min(s for s, _ in times.values()),
        gaps=gaps,
        report=report,
        terminal=terminal,
        cancel=cancel,
        slurm=slurm_lat,
        bind=bind,
        start=start_lat,
        runtimes=[e - s for s, e in times.values()],
    )


async def run() -> list[Result]:
    bed = bench_testbed()
    state = bed.load()
    real = state.real_nodes[-2:]
    if len(real) < max(n for _, n in RUNS):
        raise SystemExit(f"bench: {len(real)} real nodes, the runs {RUNS} need more")
    work, kube, slurm = await bridge_bench(bed, "handover", (NS, OWN_NS))
    bridge, _ = await asyncio.to_thread(
        start_bridge,
        bed,
        bed.slurm_rest_url,
        work,
        NS,
        managedNodeTaint={"enabled": False},
        slurmPollInterval="500ms",
    )
    seen = Seen()
    factory = InformerFactory(kube)
    pods = factory.informer(rest.PODS, namespace=NS)
    pods.add_handler(Handler(on_add=seen.on, on_update=lambda _o, n: seen.on(n)))
    factory.start()
    results = []
    try:
        await factory.wait_synced()
        await register(kube, slurm, real)
        for n_pods, n_nodes in RUNS:
            results.append(
                await one_run(
                    kube,
                    work=work,
                    bed_dir=bed.dir,
                    seen=seen,
                    n_pods=n_pods,
                    node_names=real[:n_nodes],
                )
            )
    finally:
        await clear(kube)  # a failed run's pods, while the bridge still runs
        await release(kube, slurm, real)
        await stop_bench(bridge, factory, slurm, kube)
    return results


def ms(v: float) -> str:
    return f"{v * 1000:.0f} ms"


def report(results: list[Result]) -> None:
    print("\nslurm-bridge hand-over on real nodes (exclusive pods of `sleep 5`, one after another)")
    print("  bridge: slurmPollInterval 500ms, immediateAllocation on; machine: 2 cores, shared")
    print(
        "  pods nodes  makespan    ideal  ratio  gap p50  gap p99 | where the gap goes (p50): "
        "report  cancel   Slurm    bind   start | terminal p50"
    )
    for r in results:
        ideal = r.pods * SLEEP_S / r.nodes
        print(
            f"  {r.pods:4d} {r.nodes:5d} {r.makespan:8.1f}s {ideal:7.1f}s "
            f"{r.makespan / ideal:5.2f}x "
            f"{ms(pct(r.gaps, 50)):>8} {ms(pct(r.gaps, 99)):>8} | {'':24}"
            + "".join(
                f"{ms(pct(x, 50)):>8}" for x in (r.report, r.cancel, r.slurm, r.bind, r.start)
            )
            + f" | {ms(pct(r.terminal, 50)):>12}"
        )
    runtimes = [t for r in results for t in r.runtimes]
    print(
        f"  the pods' own run time (baseline): p50 {pct(runtimes, 50):.2f}s; targets: "
        "gap p50 <= 1 s, ratio <= 1.2x (upstream's plugin: 3.3x on 2 nodes)"
    )


def main() -> None:
    report(asyncio.run(run()))


if __name__ == "__main__":
    main()
