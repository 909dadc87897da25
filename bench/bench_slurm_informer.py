"""Slurm informer with 100 registered nodes: change-to-event latency p50/p99, and the load an
idle informer puts on slurmrestd, against a naive loop that GETs all nodes every poll.

The 100 nodes are EXTERNAL node records (no slurmd processes), so that 2 cores can hold them;
changes are drains and undrains through slurmrestd.
Run: `make bench` (or `python -m bench.bench_slurm_informer`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time

from bench.common import bench_testbed, pct
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmEvent, SlurmInformer
from slinky.slurm.tokens import MintedToken

NODES = 100
CHANGES = 40
POLL = 2.0
IDLE_WINDOW = 35.0  # includes one periodic full resync (every 30 s)


async def ensure_nodes(client: SlurmClient) -> list[str]:
    names = [f"bench-{i:03d}" for i in range(NODES)]
    existing, _ = await client.list_nodes()
    have = {n.name for n in existing or []}
    for name in names:
        if name not in have:
            await client.create_node(
                f"NodeName={name} NodeAddr=127.0.0.1 CPUs=4 RealMemory=4000 Features=bench"
                " State=EXTERNAL"
            )
    return names


async def change_latency(client: SlurmClient, names: list[str]) -> list[float]:
    inf = SlurmInformer(client, poll_interval=POLL)
    waiting: dict[str, tuple[str, float]] = {}
    latencies: list[float] = []

    def on_event(ev: SlurmEvent) -> None:
        if ev.type != "UPDATED" or ev.name not in waiting:
            return
        want, t0 = waiting[ev.name]
        if (want == "drain") == ev.new.state.is_drain:
            latencies.append(time.monotonic() - t0)
            del waiting[ev.name]

    inf.subscribe(on_event)
    inf.start()
    await inf.wait_synced()
    for name in names:  # start from undrained
        if inf.nodes[name].state.is_drain:
            await client.undrain_node(name)
    await asyncio.sleep(POLL * 2)
    for i in range(CHANGES):
        name = names[i % len(names)]
        await asyncio.sleep(random.uniform(0, POLL))
        waiting[name] = ("drain", time.monotonic())
        await client.drain_node(name, "bench: latency")
    deadline = time.monotonic() + POLL * 5
    while waiting and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await inf.stop()
    for i in range(CHANGES):
        with contextlib.suppress(errors.SlurmError):
            await client.undrain_node(names[i % len(names)])
    return latencies


async def idle_load(url: str, tokens: MintedToken) -> tuple[tuple[int, int], tuple[int, int]]:
    """(requests, bytes) per minute: informer vs naive GET-all loop, both idle."""
    a = SlurmClient(url, tokens)
    b = SlurmClient(url, tokens)
    inf = SlurmInformer(a, poll_interval=POLL)
    inf.start()
    await inf.wait_synced()
    await asyncio.sleep(POLL)

    async def naive() -> None:
        while True:
            await b.list_nodes()
            await asyncio.sleep(POLL)

    await b.negotiate()
    ra, ba, rb, bb = a.requests_sent, a.bytes_received, b.requests_sent, b.bytes_received
    task = asyncio.create_task(naive())
    await asyncio.sleep(IDLE_WINDOW)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await inf.stop()
    scale = 60.0 / IDLE_WINDOW
    informer = (round((a.requests_sent - ra) * scale), round((a.bytes_received - ba) * scale))
    baseline = (round((b.requests_sent - rb) * scale), round((b.bytes_received - bb) * scale))
    await a.close()
    await b.close()
    return informer, baseline


async def run() -> None:
    bed = bench_testbed()
    tokens = MintedToken.from_file(bed.jwt_key_path, user="root")
    client = SlurmClient(bed.slurm_rest_url, tokens)
    names = await ensure_nodes(client)
    lat = await change_latency(client, names)
    informer, naive = await idle_load(bed.slurm_rest_url, tokens)
    await client.close()
    print(f"slurm informer, {NODES} nodes, poll {POLL:.0f}s:")
    print(
        f"  change-to-event latency over {len(lat)} drains: p50 {pct(lat, 50) * 1000:.0f} ms,"
        f" p99 {pct(lat, 99) * 1000:.0f} ms"
    )
    for label, (reqs, nbytes) in (
        ("informer (update_time deltas)", informer),
        ("naive GET all every poll", naive),
    ):
        print(f"  idle load, {label:30} {reqs:4d} req/min, {nbytes / 1024:8.1f} KiB/min")
    ratio = naive[1] / max(informer[1], 1)
    print(f"  bytes ratio naive / informer: {ratio:.1f}x")


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
