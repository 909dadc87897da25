"""slurm-bridge gangs: time from a group's creation to all its pods bound, for groups of 2, 4
and 8 pods, through one Slurm job of N nodes, against the default kube-scheduler binding the
same pods (which binds them one by one, with no all-or-nothing guarantee: the floor), and
against one pod of no group through the bridge (the single pod a gang is compared with).

What is real and what is not (printed with the results):
- the bridge runs as its own process against the bench test bed's real apiserver, slurmctld
  and slurmrestd; its nodes are kwok nodes it registered as EXTERNAL Slurm nodes: Slurm's
  allocation is real, the containers are not run (kwok);
- a group is a scheduler-plugins PodGroup (`minMember` N) and N pods created at once with its
  label; the clock starts when the PodGroup is created and stops when the last pod is seen
  bound (watch event);
- the pods ask for 1 CPU and share nodes (`exclusive: "false"`), each group gets N distinct
  nodes; groups run one after another, `BENCH_GROUPS_REPEAT` times per size.

Run: `python -m bench.bench_groups` (part of `make bench`). Env: BENCH_GROUPS_SIZES (default
"2,4,8"), BENCH_GROUPS_REPEAT (default 5).
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path

import yaml

from bench.bench_bridge import (
    NS,
    OWN_NS,
    SCHEDULER,
    Bindings,
    bench_pod,
    bridge_bench,
    create_all,
    finish,
    give_back,
    register_nodes,
    start_bridge,
    stop_bench,
    until,
)
from bench.common import bench_testbed, pct
from slinky.bridge.groups import PODGROUP_LABEL
from slinky.kube import rest
from slinky.kube.informer import InformerFactory

REPO = Path(__file__).resolve().parents[1]
KWOK_NODES = 16
SIZES = [int(n) for n in os.environ.get("BENCH_GROUPS_SIZES", "2,4,8").split(",")]
REPEAT = int(os.environ.get("BENCH_GROUPS_REPEAT", "5"))
PODGROUPS = rest.Resource("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup")


async def install_crd(kube: rest.Kube) -> None:
    crd = yaml.safe_load((REPO / "config/groups/scheduling.x-k8s.io_podgroups.yaml").read_text())
    await kube.apply(rest.CRDS, crd, field_manager="slinky-bench")

    async def established() -> bool:
        got = await kube.get(rest.CRDS, crd["metadata"]["name"])
        conds = (got.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    await until(established, "PodGroup CRD established", 30)


async def group(
    kube: rest.Kube, binds: Bindings, n: int, *, bridge: bool, gang: bool = True
) -> tuple[float, float]:
    """One group of n pods: PodGroup created -> last pod bound, and -> the last pod's create
    answered, in seconds (`gang` False: n pods of no group, created -> last bound)."""
    run = uuid.uuid4().hex[:6]
    name = f"g{run}"
    pods = []
    for i in range(n):
        pod = bench_pod(f"{name}-{i}", run, SCHEDULER if bridge else None)
        if gang:
            pod["metadata"]["labels"][PODGROUP_LABEL] = name
        pods.append(pod)
    start = time.monotonic()
    podgroup = {
        "apiVersion": PODGROUPS.api_version,
        "kind": PODGROUPS.kind,
        "metadata": {"name": name},
        "spec": {"minMember": n},
    }
    if gang:
        await kube.create(PODGROUPS, podgroup, NS)
    await create_all(kube, pods)
    created = time.monotonic() - start
    names = [p["metadata"]["name"] for p in pods]

    async def all_bound() -> bool:
        return all(x in binds.bound_at for x in names)

    await until(all_bound, f"group of {n} bound", 120 + 10 * n)
    took = max(binds.bound_at[x] for x in names) - start
    await finish(kube, binds, run, bridge=bridge)
    if gang:
        await kube.delete(PODGROUPS, name, NS)
    return took, created


async def run() -> None:
    bed = bench_testbed(kwok_nodes=KWOK_NODES)
    kwok = bed.load().kwok_nodes[:KWOK_NODES]
    if len(kwok) < max(SIZES):
        raise SystemExit(f"bench: {len(kwok)} kwok nodes, a group of {max(SIZES)} needs more")
    work, kube, slurm = await bridge_bench(bed, "groups", (NS, OWN_NS))
    await install_crd(kube)
    bridge, _ = await asyncio.to_thread(start_bridge, bed, bed.slurm_rest_url, work)
    factory = InformerFactory(kube)
    binds = Bindings(factory)
    factory.start()
    results: dict[tuple[str, int], list[float]] = {}
    # Group size -> PodGroup created to its last pod's create answered (bridge groups).
    created: dict[int, list[float]] = {}
    try:
        await factory.wait_synced()
        await register_nodes(kube, slurm, kwok)
        for _ in range(REPEAT):
            # The baseline the issue names: one pod of no group, through the bridge.
            took, _ = await group(kube, binds, 1, bridge=True, gang=False)
            results.setdefault(("single", 1), []).append(took)
        for n in SIZES:
            for _ in range(REPEAT):
                took, made = await group(kube, binds, n, bridge=True)
                results.setdefault(("bridge", n), []).append(took)
                created.setdefault(n, []).append(made)
                took, _ = await group(kube, binds, n, bridge=False)
                results.setdefault(("kube", n), []).append(took)
    finally:
        await give_back(kube, slurm, binds, kwok)
        await stop_bench(bridge, factory, slurm, kube)

    print("\nslurm-bridge gangs: PodGroup created -> all pods bound (one Slurm job of N nodes)")
    print(
        f"  nodes: {len(kwok)} kwok nodes, EXTERNAL in Slurm; groups one after another, "
        f"{REPEAT} per size"
    )
    print(f"  machine load average at the end: {os.getloadavg()[0]:.1f} (2 cores, shared)")
    single = pct(results[("single", 1)], 50)
    print(f"  one pod of no group through the bridge: p50 {single * 1000:.0f} ms")
    print(
        "  pods   bridge p50   bridge max   kube-scheduler p50 (no gang)   ratio p50   vs one pod"
        "   pods created p50"
    )
    for n in SIZES:
        b, k = results[("bridge", n)], results[("kube", n)]
        print(
            f"  {n:4d} {pct(b, 50) * 1000:9.0f} ms {max(b) * 1000:9.0f} ms "
            f"{pct(k, 50) * 1000:18.0f} ms {pct(b, 50) / pct(k, 50):22.1f}x"
            f" {pct(b, 50) / single:11.1f}x {pct(created[n], 50) * 1000:15.0f} ms"
        )
    print(
        "  (pods created: PodGroup created -> the last member's create answered; the bridge"
        " can bind\n  nothing before, and kube-scheduler's column pays the same creates)"
    )


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
