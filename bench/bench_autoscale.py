"""Autoscaling a NodeSet from Slurm's queue (issue 13).

For N = 1, 10, 50 single-node jobs (1 CPU, 5 s each) submitted at once to an empty NodeSet's
partition: submission -> first job RUNNING, -> all COMPLETED, -> NodeSet back at 0 pods,

- driven by the real HPA (kube-controller-manager, sync period 2 s, scale-down window 5 s)
  on `slurm_nodeset_jobs_pending_nodes` from the operator's external metrics API;
- the floor, same run: the HPA removed and the NodeSet scaled by hand to the replica count the
  HPA chose at submission, and to 0 as soon as the last job completed (no window, no metric).

The difference is the HPA's share (metric freshness + sync period + stabilization window);
what remains in the floor is the operator's and Slurm's (pod start, slurmd registration,
partition update, drain before delete). Also: the metrics API's cost per HPA sync (requests,
time to answer, Slurm requests caused).

Run: `make bench` (or `python -m bench.bench_autoscale`).
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

from bench.bench_nodeset import REAL_PLACEMENT, counter, setup, template
from bench.common import bench_testbed
from slinky.kube import rest
from slinky.operator.resources import NODESETS
from slinky.slurm.client import SlurmClient
from slinky.slurm.tokens import MintedToken
from slinky_testbed import metricsapi, procs
from slinky_testbed.bed import Testbed

JSON = dict[str, Any]
NS = "bench-nodeset"  # bench_nodeset.setup makes its Cluster here
REPO = Path(__file__).resolve().parents[1]
HPAS = rest.Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")
APISERVICES = rest.Resource(
    "apiregistration.k8s.io", "v1", "apiservices", "APIService", namespaced=False
)
KINDS = {
    "Namespace": rest.NAMESPACES,
    "Service": rest.SERVICES,
    "EndpointSlice": rest.Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
    "APIService": APISERVICES,
}
MAX_REPLICAS = 5
JOB_SECONDS = 5
SIZES = (1, 10, 50)


def start_operator(bed: Testbed) -> tuple[subprocess.Popen[bytes], str, int]:
    mport, pport = procs.free_ports(2)
    api_args, api_port = metricsapi.operator_args(bed)
    log = open(bed.logs / "bench-autoscale-operator.log", "ab")  # noqa: SIM115
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
            *api_args,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    log.close()
    return proc, f"http://127.0.0.1:{mport}/metrics", api_port


def hpa(name: str) -> JSON:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "slinky.slurm.net/v1alpha1",
                "kind": "NodeSet",
                "name": name,
            },
            "minReplicas": 0,
            "maxReplicas": MAX_REPLICAS,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {
                            "name": "slurm_nodeset_jobs_pending_nodes",
                            "selector": {"matchLabels": {"nodeset": name}},
                        },
                        "target": {"type": "AverageValue", "averageValue": "2"},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0},
                "scaleDown": {
                    "stabilizationWindowSeconds": 5,
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}],
                },
            },
        },
    }


async def until(check: Any, timeout: float, what: str) -> float:
    deadline = time.monotonic() + timeout
    while True:
        if await check():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"benchmark: timed out waiting for {what}")
        await asyncio.sleep(0.1)


class Run:
    def __init__(self, kube: rest.Kube, slurm: SlurmClient, name: str) -> None:
        self.kube, self.slurm, self.name = kube, slurm, name

    async def pods(self) -> int:
        params = {"labelSelector": f"nodeset.slinky.slurm.net/name={self.name}"}
        return len((await self.kube.list(rest.PODS, NS, params=params))["items"])

    async def replicas(self) -> int:
        return int((await self.kube.get(NODESETS, self.name, NS))["spec"]["replicas"])

    async def submit(self, n: int) -> list[int]:
        job = {
            "name": "bench-as",
            "partition": self.name,
            "minimum_nodes": 1,
            "maximum_nodes": 1,
            "tasks": 1,
            "current_working_directory": "/tmp",
            "environment": ["PATH=/usr/bin:/bin"],
            "time_limit": {"set": True, "number": 10},
        }
        script = f"#!/bin/sh\nsleep {JOB_SECONDS}\n"
        return list(
            await asyncio.gather(*(self.slurm.submit_job(job, script=script) for _ in range(n)))
        )

    async def states(self, ids: list[int]) -> list[list[str]]:
        return [j.state for j in await asyncio.gather(*(self.slurm.get_job(i) for i in ids))]

    async def measure(self, n: int, scale_to: int | None) -> dict[str, float]:
        """Submit n jobs; with `scale_to` scale by hand (the floor), otherwise the HPA does."""
        t0 = time.monotonic()
        ids = await self.submit(n)
        if scale_to is not None:
            await self.kube.patch(
                NODESETS, self.name, {"spec": {"replicas": scale_to}}, NS, subresource="scale"
            )

        async def any_running() -> bool:
            return any("RUNNING" in s or "COMPLETED" in s for s in await self.states(ids))

        async def all_done() -> bool:
            states = await self.states(ids)
            bad = [
                s
                for s in states
                if s != ["COMPLETED"] and set(s) & {"FAILED", "CANCELLED", "NODE_FAIL", "TIMEOUT"}
            ]
            if bad:
                raise AssertionError(f"benchmark job ended {bad}")
            return all(s == ["COMPLETED"] for s in states)

        first = await until(any_running, 300, "first job running") - t0
        done = await until(all_done, 900, "all jobs completed") - t0
        if scale_to is not None:
            await self.kube.patch(
                NODESETS, self.name, {"spec": {"replicas": 0}}, NS, subresource="scale"
            )

        async def zero() -> bool:
            return await self.pods() == 0

        back = await until(zero, 300, "NodeSet back at 0") - t0
        return {"first": first, "done": done, "zero": back}


async def amain() -> None:
    bed = bench_testbed()
    kube = rest.Kube.from_kubeconfig(bed.kubeconfig)
    slurm = SlurmClient(bed.slurm_rest_url, MintedToken.from_file(bed.jwt_key_path, user="root"))
    await setup(kube, bed)
    proc, metrics, api_port = start_operator(bed)
    name = "bench-as"
    try:
        for obj in metricsapi.manifests(bed, api_port, REPO / "config/autoscale/apiservice.yaml"):
            await kube.apply(KINDS[obj["kind"]], obj, field_manager="bench", force=True)

        async def available() -> bool:
            obj = await kube.get(APISERVICES, metricsapi.APISERVICE_NAME)
            conds = (obj.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Available" and c["status"] == "True" for c in conds)

        await until(available, 120, "APIService Available")
        manifest: dict[str, Any] = {
            "apiVersion": "slinky.slurm.net/v1alpha1",
            "kind": "NodeSet",
            "metadata": {"name": name, "namespace": NS},
            "spec": {
                "clusterName": "slurm",
                "replicas": 1,
                "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
                "template": template(name, REAL_PLACEMENT, slurmd=True),
                "partition": {"enabled": True},
            },
        }
        manifest["spec"]["template"]["spec"]["containers"][0]["args"] = [
            "--conf",
            "CPUs=2 RealMemory=500",
        ]
        await kube.apply(NODESETS, manifest, field_manager="bench", force=True)
        run = Run(kube, slurm, name)
        print(
            f"\nautoscale: N single-node jobs ({JOB_SECONDS}s, 1 CPU each), 2-CPU slurmd "
            f"pods, at most {MAX_REPLICAS}"
        )
        header = ("N", "driver", "replicas", "first RUNNING", "all COMPLETED", "back at 0")
        print("{:>4} {:>7} {:>8} {:>14} {:>14} {:>10}".format(*header))

        def row(n: int, driver: str, replicas: int, r: dict[str, float]) -> None:
            first, done, zero = (f"{r[k]:.1f}s" for k in ("first", "done", "zero"))
            print(f"{n:>4} {driver:>7} {replicas:>8} {first:>14} {done:>14} {zero:>10}")

        count = "slinky_external_metrics_request_duration_seconds_count"
        total = "slinky_external_metrics_request_duration_seconds_sum"
        for n in SIZES:
            # The HPA leaves 0 only for a target it scaled to 0 itself (ScaledToZero): start
            # each round from 1 replica and let it take the NodeSet to 0.
            await kube.patch(NODESETS, name, {"spec": {"replicas": 1}}, NS, subresource="scale")
            await kube.apply(HPAS, hpa(name), field_manager="bench", force=True)

            async def scaled_to_zero() -> bool:
                obj = await kube.get(HPAS, name, NS)
                conds = (obj.get("status") or {}).get("conditions") or []
                hpa_zero = any(c["type"] == "ScaledToZero" and c["status"] == "True" for c in conds)
                return hpa_zero and await run.pods() == 0

            await until(scaled_to_zero, 300, "HPA at 0")
            before, t_before = counter(metrics, count), counter(metrics, total)
            t0 = time.monotonic()
            row(n, "HPA", min(MAX_REPLICAS, -(-n // 2)), await run.measure(n, None))
            elapsed = time.monotonic() - t0
            reqs, spent = counter(metrics, count) - before, counter(metrics, total) - t_before
            await kube.delete(HPAS, name, NS)
            chosen = min(MAX_REPLICAS, -(-n // 2))
            row(n, "by hand", chosen, await run.measure(n, chosen))
            per = spent / reqs * 1000 if reqs else float("nan")
            print(
                f"     metrics API during the HPA run: {reqs:.0f} requests in {elapsed:.0f}s "
                f"({reqs / elapsed * 2:.2f} per 2s HPA sync), {per:.2f} ms each; "
                "no Slurm request per answer (informer cache)"
            )
    finally:
        with contextlib.suppress(rest.ApiError):
            await kube.delete(HPAS, name, NS)
        with contextlib.suppress(rest.ApiError, TimeoutError):
            await kube.delete(NODESETS, name, NS)

            async def gone() -> bool:
                try:
                    await kube.get(NODESETS, name, NS)
                except rest.ApiError as e:
                    return e.not_found
                return False

            await until(gone, 120, "benchmark NodeSet deleted")  # the operator drains it
        proc.terminate()
        proc.wait(30)
        await slurm.close()
        await kube.close()


def main() -> None:
    asyncio.run(amain())


if __name__ == "__main__":
    main()
