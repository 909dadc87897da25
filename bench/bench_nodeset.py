"""NodeSet scale 0->N and N->0: N = 10 real slurmd pods (containers on real nodes) and
N = 5,000 pods on kwok nodes (no slurmd there: their Slurm nodes never register;
`BENCH_KWOK_PODS` changes N). Reports total time, apiserver requests the operator issued,
operator RSS, and:

- real nodes: job-end -> pod-deleted latency (every node runs a job when the scale-in starts;
  from the moment Slurm shows the node drained, i.e. its job ended, to the moment its pod is
  being deleted), and the idle load the operator puts on slurmrestd and the apiserver
  (requests/min over two quiet minutes with 10 nodes);
- kwok: steady-state reconcile time of the NodeSet of N pods (p50/p99 from the operator's
  reconcile histogram while the NodeSet is touched repeatedly, nothing to do).

Baseline in the same run: a StatefulSet (Parallel) with the same pod count on the same nodes,
scaled by kube-controller-manager, i.e. Kubernetes' own floor without any Slurm coordination.

Run: `make bench` (or `python -m bench.bench_nodeset`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx2
import yaml

from bench.common import bench_testbed, pct
from slinky.kube import rest
from slinky.operator.resources import CLUSTERS, NODESETS
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.tokens import MintedToken
from slinky_testbed import nodes, pods, procs
from slinky_testbed.bed import Testbed

JSON = dict[str, Any]
NS = "bench-nodeset"
REPO = Path(__file__).resolve().parents[1]
STATEFULSETS = rest.Resource("apps", "v1", "statefulsets", "StatefulSet")
KWOK_PLACEMENT: JSON = {
    "nodeSelector": {"testbed.slinky.slurm.net/kubelet": "kwok"},
    "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
}
REAL_PLACEMENT: JSON = {"nodeSelector": {"testbed.slinky.slurm.net/kubelet": "real"}}


async def setup(kube: rest.Kube, bed: Testbed) -> None:
    for path in sorted((REPO / "config" / "crd").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        await kube.apply(rest.CRDS, doc, field_manager="bench")
    with contextlib.suppress(rest.ApiError):
        await kube.create(rest.NAMESPACES, {"metadata": {"name": NS}})
    import base64

    key = base64.b64encode(bed.jwt_key_path.read_bytes()).decode()
    await kube.apply(
        rest.SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "jwt", "namespace": NS},
            "data": {"jwt_hs256.key": key},
        },
        field_manager="bench",
    )
    await kube.apply(rest.SECRETS, pods.slurm_key_secret(bed, NS), field_manager="bench")
    host, port = bed.slurmctld_addr.split(":")
    for _ in range(60):  # CRDs may take a moment to be served
        try:
            await kube.apply(
                CLUSTERS,
                {
                    "apiVersion": "slinky.slurm.net/v1alpha1",
                    "kind": "Cluster",
                    "metadata": {"name": "slurm", "namespace": NS},
                    "spec": {
                        "server": bed.slurm_rest_url,
                        "username": "root",
                        "jwtKeyRef": {"name": "jwt"},
                        "controller": {"host": host, "port": int(port)},
                    },
                },
                field_manager="bench",
            )
            return
        except rest.ApiError:
            await asyncio.sleep(0.5)


def start_operator(bed: Testbed) -> tuple[subprocess.Popen[bytes], str]:
    mport, pport = procs.free_ports(2)
    log = open(bed.logs / "bench-operator.log", "ab")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "slinky.operator.main",
            f"--kubeconfig={bed.kubeconfig}",
            "--leader-elect=false",
            f"--metrics-bind-address=127.0.0.1:{mport}",
            f"--health-probe-bind-address=127.0.0.1:{pport}",
            f"--namespace={NS}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    log.close()
    return proc, f"http://127.0.0.1:{mport}/metrics"


def counter(metrics_url: str, name: str) -> float:
    """The sum of a counter over all its labels."""
    total = 0.0
    for line in httpx2.get(metrics_url, timeout=5).text.splitlines():
        if line.startswith(name + "{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def requests_issued(metrics_url: str) -> int:
    return int(counter(metrics_url, "rest_client_requests_total"))


def reconcile_buckets(metrics_url: str, controller: str) -> dict[float, float]:
    """Cumulative counts of the reconcile-time histogram, by upper bound."""
    out: dict[float, float] = {}
    prefix = "controller_runtime_reconcile_time_seconds_bucket{"
    for line in httpx2.get(metrics_url, timeout=5).text.splitlines():
        if line.startswith(prefix) and f'controller="{controller}"' in line:
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out[float(le)] = float(line.rsplit(" ", 1)[1])
    return out


def histogram_pct(before: dict[float, float], after: dict[float, float], p: float) -> float:
    """The p-th percentile of the observations between two snapshots, interpolated within
    its bucket (Prometheus' histogram_quantile)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return float("nan")
    rank = p / 100 * total
    lower, below = 0.0, 0.0
    for bound, cum in zip(bounds, counts, strict=True):
        if cum >= rank:
            if bound == float("inf"):
                return lower
            return lower + (bound - lower) * (rank - below) / max(cum - below, 1e-9)
        lower, below = bound, cum
    return lower


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def template(name: str, placement: JSON, *, slurmd: bool) -> JSON:
    spec = pods.slurmd_pod_spec(["--conf", "CPUs=1 RealMemory=500"])
    if not slurmd:
        spec["containers"] = [
            {"name": "main", "image": nodes.image_ref("slurm"), "command": ["sleep", "3600"]}
        ]
        del spec["volumes"]
    return {
        "metadata": {"labels": {"app.kubernetes.io/instance": name}},
        "spec": {**spec, **placement},
    }


async def live_pods(kube: rest.Kube, label: str) -> list[JSON]:
    items = (await kube.list(rest.PODS, NS, params={"labelSelector": label}))["items"]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


async def wait(check: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark step timed out")
        await asyncio.sleep(0.1)


async def run_nodeset(
    kube: rest.Kube,
    slurm: SlurmClient,
    metrics: str,
    pid: int,
    *,
    name: str,
    n: int,
    placement: JSON,
    real: bool,
) -> JSON:
    label = f"app.kubernetes.io/instance={name}"
    with contextlib.suppress(rest.ApiError):
        await kube.delete(NODESETS, name, NS)
    await wait(lambda: _absent(kube, NODESETS, name), 60)
    await kube.create(
        NODESETS,
        {
            "apiVersion": "slinky.slurm.net/v1alpha1",
            "kind": "NodeSet",
            "metadata": {"name": name},
            "spec": {
                "clusterName": "slurm",
                "replicas": 0,
                "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
                "template": template(name, placement, slurmd=True),
            },
        },
        NS,
    )
    req0 = requests_issued(metrics)
    t0 = time.monotonic()
    await kube.patch(NODESETS, name, {"spec": {"replicas": n}}, NS, subresource="scale")

    async def up() -> bool:
        st = (await kube.get(NODESETS, name, NS)).get("status") or {}
        if st.get("readyReplicas") != n:
            return False
        if real:
            return st.get("slurmIdle") == n
        return True

    await wait(up, 900)
    t_up = time.monotonic() - t0
    req_up = requests_issued(metrics) - req0
    rss = rss_mb(pid)
    extra: JSON = {}
    if real:
        extra.update(await idle_load(metrics))
        jobs = [await submit(slurm, name, 8) for _ in range(n)]
        await wait(lambda: _all_running(slurm, jobs), 120)
    else:
        extra.update(await steady_reconcile(kube, metrics, name))
        rss = rss_mb(pid)

    drained_at: dict[str, float] = {}
    deleting_at: dict[str, float] = {}
    stop = asyncio.Event()

    async def observe() -> None:
        while not stop.is_set():
            if real:
                with contextlib.suppress(errors.SlurmError):
                    nodes, _ = await slurm.list_nodes()
                    for node in nodes or []:
                        if node.name.startswith(name + "-") and node.state.is_drained:
                            drained_at.setdefault(node.name, time.monotonic())
            items = (await kube.list(rest.PODS, NS, params={"labelSelector": label}))["items"]
            present = set()
            for p in items:
                present.add(p["metadata"]["name"])
                if p["metadata"].get("deletionTimestamp"):
                    deleting_at.setdefault(p["metadata"]["name"], time.monotonic())
            for pod_name in drained_at:
                if pod_name not in present:
                    deleting_at.setdefault(pod_name, time.monotonic())
            await asyncio.sleep(0.1)

    watcher = asyncio.create_task(observe())
    req1 = requests_issued(metrics)
    t1 = time.monotonic()
    await kube.patch(NODESETS, name, {"spec": {"replicas": 0}}, NS, subresource="scale")
    await wait(lambda: _none(kube, label), 900)
    t_down = time.monotonic() - t1
    req_down = requests_issued(metrics) - req1
    stop.set()
    await watcher
    lat = [deleting_at[k] - drained_at[k] for k in drained_at if k in deleting_at]
    await kube.delete(NODESETS, name, NS)
    return {
        "up": t_up,
        "down": t_down,
        "req_up": req_up,
        "req_down": req_down,
        "rss": rss,
        "lat": lat,
        **extra,
    }


IDLE_WINDOW_S = 120.0  # several poll and ping periods: window edges matter less


async def idle_load(metrics: str) -> JSON:
    """Requests/min to slurmrestd and the apiserver while nothing happens."""
    await asyncio.sleep(5)  # let the last status writes of the scale-out settle
    slurm0 = counter(metrics, "slurm_rest_requests_total")
    kube0 = counter(metrics, "rest_client_requests_total")
    await asyncio.sleep(IDLE_WINDOW_S)
    per_min = 60.0 / IDLE_WINDOW_S
    return {
        "idle_slurm_rpm": (counter(metrics, "slurm_rest_requests_total") - slurm0) * per_min,
        "idle_kube_rpm": (counter(metrics, "rest_client_requests_total") - kube0) * per_min,
    }


STEADY_TOUCHES = 40


async def steady_reconcile(kube: rest.Kube, metrics: str, name: str) -> JSON:
    """Reconcile time of a NodeSet with nothing to do: touch it repeatedly (an annotation
    change enqueues it) and read the operator's reconcile histogram."""
    before = reconcile_buckets(metrics, "nodeset")
    for i in range(STEADY_TOUCHES):
        await kube.patch(NODESETS, name, {"metadata": {"annotations": {"bench/touch": str(i)}}}, NS)
        await asyncio.sleep(0.25)
    await asyncio.sleep(2)
    after = reconcile_buckets(metrics, "nodeset")
    count = after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)
    return {
        "steady_n": count,
        "steady_p50": histogram_pct(before, after, 50),
        "steady_p99": histogram_pct(before, after, 99),
    }


async def submit(slurm: SlurmClient, feature: str, seconds: int) -> int:
    return await slurm.submit_job(
        {
            "name": "bench",
            "constraints": feature,
            "minimum_nodes": 1,
            "maximum_nodes": 1,
            "tasks": 1,
            "current_working_directory": "/tmp",
            "environment": ["PATH=/usr/bin:/bin"],
            "time_limit": {"set": True, "number": 10},
        },
        script=f"#!/bin/sh\nsleep {seconds}\n",
    )


async def _all_running(slurm: SlurmClient, jobs: list[int]) -> bool:
    for job_id in jobs:
        if not (await slurm.get_job(job_id)).is_running:
            return False
    return True


async def run_statefulset(kube: rest.Kube, name: str, n: int, placement: JSON) -> JSON:
    label = f"app.kubernetes.io/instance={name}"
    with contextlib.suppress(rest.ApiError):
        await kube.delete(STATEFULSETS, name, NS)
    await wait(lambda: _absent(kube, STATEFULSETS, name), 60)
    await kube.create(
        STATEFULSETS,
        {
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": {"name": name},
            "spec": {
                "replicas": 0,
                "serviceName": name,
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
                "template": template(name, placement, slurmd=False),
            },
        },
        NS,
    )
    t0 = time.monotonic()
    await kube.patch(STATEFULSETS, name, {"spec": {"replicas": n}}, NS)

    async def up() -> bool:
        st = (await kube.get(STATEFULSETS, name, NS)).get("status") or {}
        return st.get("readyReplicas") == n

    await wait(up, 900)
    t_up = time.monotonic() - t0
    t1 = time.monotonic()
    await kube.patch(STATEFULSETS, name, {"spec": {"replicas": 0}}, NS)
    await wait(lambda: _none(kube, label), 900)
    t_down = time.monotonic() - t1
    await kube.delete(STATEFULSETS, name, NS)
    return {"up": t_up, "down": t_down}


async def _absent(kube: rest.Kube, res: rest.Resource, name: str) -> bool:
    try:
        await kube.get(res, name, NS)
    except rest.ApiError as e:
        return e.not_found
    return False


async def _none(kube: rest.Kube, label: str) -> bool:
    return not (await kube.list(rest.PODS, NS, params={"labelSelector": label}))["items"]


async def run() -> None:
    bed = bench_testbed()
    kube = rest.Kube.from_kubeconfig(bed.kubeconfig, timeout=60)
    await setup(kube, bed)
    proc, metrics = start_operator(bed)
    slurm = SlurmClient(bed.slurm_rest_url, MintedToken.from_file(bed.jwt_key_path, user="root"))
    try:
        await wait(lambda: _metrics_up(metrics), 60)
        rows = []
        kwok_pods = int(os.environ.get("BENCH_KWOK_PODS", "5000"))
        for label, n, placement, real in (
            ("10 real slurmd", 10, REAL_PLACEMENT, True),
            (f"{kwok_pods} kwok", kwok_pods, KWOK_PLACEMENT, False),
        ):
            ns_res = await run_nodeset(
                kube, slurm, metrics, proc.pid, name=f"ns{n}", n=n, placement=placement, real=real
            )
            ss_res = await run_statefulset(kube, f"ss{n}", n, placement)
            rows.append((label, ns_res, ss_res))
    finally:
        proc.terminate()
        proc.wait(30)
        await slurm.close()
        await kube.close()
    print("NodeSet scale (operator) vs StatefulSet Parallel (kube-controller-manager), same nodes:")
    for label, r, b in rows:
        for phase, key in (("0->N", "up"), ("N->0", "down")):
            print(
                f"  {label} {phase}: {r[key]:6.1f}s  (StatefulSet {b[key]:5.1f}s,"
                f" ratio {r[key] / b[key]:.2f}x)"
            )
        print(
            f"    apiserver requests by the operator: {r['req_up']} up, {r['req_down']} down;"
            f" operator RSS {r['rss']:.0f} MB"
        )
        if r["lat"]:
            print(
                f"    job-end -> pod-deleted latency over {len(r['lat'])} nodes:"
                f" p50 {pct(r['lat'], 50) * 1000:.0f} ms, p99 {pct(r['lat'], 99) * 1000:.0f} ms"
                " (target p50 < 1000 ms)"
            )
        if "idle_slurm_rpm" in r:
            print(
                f"    idle, 1 Cluster with 10 nodes: slurmrestd {r['idle_slurm_rpm']:.1f} req/min"
                f" (target <= 4), apiserver {r['idle_kube_rpm']:.1f} req/min"
            )
        if "steady_p50" in r:
            print(
                f"    steady-state reconcile ({r['steady_n']:.0f} reconciles):"
                f" p50 {r['steady_p50'] * 1000:.1f} ms, p99 {r['steady_p99'] * 1000:.1f} ms"
                " (target p99 < 100 ms); RSS target < 150 MB"
            )


async def _metrics_up(url: str) -> bool:
    try:
        async with httpx2.AsyncClient(timeout=2) as http:
            return (await http.get(url)).status_code == 200
    except httpx2.HTTPError:
        return False


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
