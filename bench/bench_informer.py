"""Informer over 5,000 pods (kwok): time to sync and RSS, against the floor of one plain
`json.loads` of the same list; and event-to-reconcile latency for 1,000 updates.

Run: `make bench` (or `python -m bench.bench_informer`).
"""

from __future__ import annotations

import asyncio
import json
import resource
import subprocess
import sys
import time

from bench.common import bench_testbed, pct
from slinky.kube import rest
from slinky.kube.controller import DONE, Controller, Result
from slinky.kube.informer import Informer

NAMESPACE = "bench-informer"
PODS = 5000
UPDATES = 1000


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


async def ensure_pods(kube: rest.Kube) -> None:
    try:
        await kube.create(rest.NAMESPACES, {"metadata": {"name": NAMESPACE}})
    except rest.ApiError as e:
        if not e.conflict:
            raise
    have = len((await kube.list(rest.PODS, NAMESPACE))["items"])
    sem = asyncio.Semaphore(32)

    async def create(i: int) -> None:
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"p-{i:05d}", "labels": {"app": "bench", "i": str(i)}},
            "spec": {
                "nodeName": f"kwok-{i % 4}",
                "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
                "containers": [
                    {
                        "name": "c",
                        "image": "bench",
                        "command": ["true"],
                        "resources": {"requests": {"cpu": "1m"}},
                    }
                ],
            },
        }
        async with sem:
            try:
                await kube.create(rest.PODS, pod, NAMESPACE)
            except rest.ApiError as e:
                if not e.conflict:
                    raise

    if have < PODS:
        t0 = time.monotonic()
        await asyncio.gather(*(create(i) for i in range(PODS)))
        print(f"  created {PODS - have} pods in {time.monotonic() - t0:.1f}s")


async def measure_sync(kubeconfig: str, mode: str) -> dict[str, float]:
    """In a fresh process: sync an informer, or fetch + json.loads the list (floor)."""
    kube = rest.Kube.from_kubeconfig(kubeconfig, timeout=120)
    before = rss_mb()
    t0 = time.perf_counter()
    out: dict[str, float] = {}
    if mode == "informer":
        inf = Informer(kube, rest.PODS, namespace=NAMESPACE)
        inf.start()
        await inf.wait_synced()
        out["objects"] = len(inf.store)
        await inf.stop()
    else:
        resp = await kube.send("GET", rest.PODS.path(NAMESPACE))
        t_fetch = time.perf_counter()
        data = json.loads(resp.content)
        out["objects"] = len(data["items"])
        out["json_loads_s"] = time.perf_counter() - t_fetch
    out["seconds"] = time.perf_counter() - t0
    out["rss_mb"] = rss_mb()
    out["rss_delta_mb"] = out["rss_mb"] - before
    out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    await kube.close()
    return out


def in_subprocess(kubeconfig: str, mode: str) -> dict[str, float]:
    code = (
        "import asyncio, json, sys; from bench.bench_informer import measure_sync;"
        f"print(json.dumps(asyncio.run(measure_sync({kubeconfig!r}, {mode!r}))))"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


async def measure_latency(kube: rest.Kube) -> list[float]:
    latencies: list[float] = []
    done = asyncio.Event()
    inf = Informer(kube, rest.PODS, namespace=NAMESPACE)

    class Timer:
        async def reconcile(self, key: str) -> Result:
            obj = inf.store.get(key)
            stamp = ((obj or {}).get("metadata", {}).get("annotations") or {}).get("bench/sent")
            if stamp:
                latencies.append(time.time() - float(stamp))
                if len(latencies) >= UPDATES:
                    done.set()
            return DONE

    ctrl = Controller("bench", Timer(), workers=4)
    ctrl.watch(
        inf,
        predicate=lambda old, new: (
            old is not None
            and (new["metadata"].get("annotations") or {}).get("bench/sent")
            != (old["metadata"].get("annotations") or {}).get("bench/sent")
        ),
    )
    inf.start()
    stop = asyncio.Event()
    task = asyncio.create_task(ctrl.run(stop))
    await inf.wait_synced()
    sem = asyncio.Semaphore(8)

    async def update(i: int) -> None:
        async with sem:
            patch = {"metadata": {"annotations": {"bench/sent": repr(time.time())}}}
            await kube.patch(rest.PODS, f"p-{i:05d}", patch, NAMESPACE)

    await asyncio.gather(*(update(i) for i in range(UPDATES)))
    await asyncio.wait_for(done.wait(), 60)
    stop.set()
    await task
    await inf.stop()
    return latencies


async def run() -> None:
    bed = bench_testbed()
    kube = rest.Kube.from_kubeconfig(bed.kubeconfig, timeout=120)
    await ensure_pods(kube)
    floor = in_subprocess(str(bed.kubeconfig), "floor")
    informer = in_subprocess(str(bed.kubeconfig), "informer")
    lat = await measure_latency(kube)
    await kube.close()
    print(f"informer over {int(informer['objects'])} pods (kwok):")
    print(
        f"  floor: GET list + json.loads     {floor['seconds'] * 1000:8.0f} ms"
        f"  (json.loads alone {floor['json_loads_s'] * 1000:.0f} ms),"
        f" RSS +{floor['rss_delta_mb']:.0f} MB"
    )
    print(
        f"  informer sync (paginated, 500)   {informer['seconds'] * 1000:8.0f} ms"
        f"  RSS +{informer['rss_delta_mb']:.0f} MB (process {informer['rss_mb']:.0f} MB)"
    )
    print(f"  ratio informer / floor           {informer['seconds'] / floor['seconds']:8.2f}x")
    print(
        f"event-to-reconcile latency over {len(lat)} updates:"
        f" p50 {pct(lat, 50) * 1000:.1f} ms, p99 {pct(lat, 99) * 1000:.1f} ms"
    )


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
