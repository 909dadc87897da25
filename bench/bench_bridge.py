"""slurm-bridge scheduler: pod created -> bound, through Slurm placeholder jobs, against the
default kube-scheduler binding the same pods to the same nodes; the cost of one scheduling
decision with 10 and with 5,000 unrelated jobs queued in Slurm; throughput.

What is real and what is not (printed with the results):
- the bridge runs as its own process (nodes, scheduler and workload components), against the
  bench test bed's real apiserver, slurmctld and slurmrestd;
- its nodes are kwok nodes registered by the bridge's node controller as EXTERNAL Slurm
  nodes (32 CPUs each): Slurm's allocation is real, the containers are not (kwok reports the
  pods Running). Binding does not depend on what runs the pod, and 500 pods at once would
  not fit on the test bed's 3 real nodes;
- the pods ask for 1 CPU and share nodes (`exclusive: "false"`), so 500 fit at once on 16
  nodes: the latency is scheduling, not waiting for a node to free up. The kube-scheduler
  pods are the same pods (same requests, nodeSelector and tolerations), only the
  schedulerName differs;
- slurmrestd bytes are counted by a TCP proxy between the bridge and slurmrestd, over the
  window from a pod's creation to its binding (median of single pods one after another);
  the bursts come first, from a bridge that talks to slurmrestd directly as in a cluster
  (the proxy runs in the bench's process, beside the clock), which is then started again
  through the proxy; each is measured once its start-up sweep read the job list;
- the 5,000 queued jobs are held batch jobs in another partition (Slurm keeps them pending);
- one bridge replica, without leader election.

Run: `make bench` (or `python -m bench.bench_bridge`). Env: BENCH_BRIDGE_BURSTS (default
"1,100,500"), BENCH_BRIDGE_QUEUED (default 5000).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import yaml

from bench.common import CpuMeter, bench_testbed, pct
from slinky.bridge.labels import EXTERNAL_NODE, MANAGED_NODE_TAINT, SLURMJOB_PREFIX
from slinky.kube import rest
from slinky.kube.informer import Handler, InformerFactory
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.models import Job
from slinky.slurm.tokens import MintedToken
from slinky_testbed import procs
from slinky_testbed.bed import Testbed

JSON = dict[str, Any]
NS = "bench-bridge"
OWN_NS = "bench-bridge-system"
SCHEDULER = "slurm-bridge-scheduler"
PARTITION = "slurm-bridge"
KWOK_NODES = 16
NODE_CPUS = 32  # what the bridge registers a kwok node with
SINGLE_PODS = 10
QUEUED_FEW = 10
BURSTS = [int(n) for n in os.environ.get("BENCH_BRIDGE_BURSTS", "1,100,500").split(",")]
QUEUED_MANY = int(os.environ.get("BENCH_BRIDGE_QUEUED", "5000"))
REFUSED = "slurm_bridge_immediate_allocations_refused_total"
TOLERATIONS = [
    {"key": "kwok.x-k8s.io/node", "operator": "Exists"},
    {"key": MANAGED_NODE_TAINT, "operator": "Equal", "value": SCHEDULER, "effect": "NoExecute"},
]


# ---------------------------------------------------------------- slurmrestd byte counter


class CountingProxy:
    """A loopback TCP proxy to slurmrestd that counts the bytes each way."""

    def __init__(self, target: str) -> None:
        host, _, port = target.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port.rstrip("/"))
        self.up = 0
        self.down = 0
        self.server: asyncio.Server | None = None

    @property
    def total(self) -> int:
        return self.up + self.down

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            r2, w2 = await asyncio.open_connection(self.host, self.port)
        except OSError:
            writer.close()
            return

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, up: bool) -> None:
            with contextlib.suppress(OSError, asyncio.CancelledError):
                while data := await src.read(65536):
                    if up:
                        self.up += len(data)
                    else:
                        self.down += len(data)
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(OSError):
                dst.close()

        await asyncio.gather(pipe(reader, w2, True), pipe(r2, writer, False))

    async def stop(self) -> None:
        if self.server is not None:
            self.server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), 5)


# ---------------------------------------------------------------- the bridge process


def start_bridge(
    bed: Testbed, slurm_url: str, work: Path, namespace: str = NS, **extra: Any
) -> tuple[subprocess.Popen[bytes], int]:
    """The bridge as its own process (config keys in `extra` added to the bench's)."""
    config = {
        "schedulerName": SCHEDULER,
        "slurmRestApi": slurm_url,
        "managedNamespaces": [namespace],
        "partition": PARTITION,
        "slurmAuth": {"jwtKeyFile": str(bed.jwt_key_path), "user": "root"},
        **extra,
    }
    (work / "config.yaml").write_text(yaml.safe_dump(config))
    mport, pport = procs.free_ports(2)
    argv = [
        sys.executable,
        "-m",
        "slinky.bridge.main",
        f"--config={work / 'config.yaml'}",
        f"--kubeconfig={bed.kubeconfig}",
        f"--namespace={OWN_NS}",
        "--components=nodes,scheduler,workload",
        f"--metrics-bind-address=127.0.0.1:{mport}",
        f"--health-probe-bind-address=127.0.0.1:{pport}",
        # One replica: no Lease to lose while a loaded machine answers slowly.
        "--leader-elect=false",
        f"--log-level={os.environ.get('BENCH_BRIDGE_LOG_LEVEL', 'info')}",
        *([f"--scheduler-workers={w}"] if (w := os.environ.get("BENCH_BRIDGE_WORKERS")) else []),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    with (work / "bridge.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"bridge exited {proc.returncode}; see {work / 'bridge.log'}")
        with (
            contextlib.suppress(urllib.error.URLError, OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{pport}/readyz", timeout=2) as r,
        ):
            if r.status == 200:
                return proc, mport
        time.sleep(0.3)
    proc.terminate()
    raise SystemExit(f"bridge not ready; see {work / 'bridge.log'}")


async def bridge_bench(
    bed: Testbed, name: str, namespaces: tuple[str, ...]
) -> tuple[Path, rest.Kube, SlurmClient]:
    """A bridge benchmark's work directory (`bench-<name>` in the test bed's), its apiserver
    and slurmrestd clients; `namespaces` made if missing."""
    work = bed.dir / f"bench-{name}"
    work.mkdir(exist_ok=True)
    kube = rest.Kube.from_kubeconfig(bed.kubeconfig)
    slurm = SlurmClient(bed.slurm_rest_url, MintedToken(bed.jwt_key_path.read_bytes(), user="root"))
    for ns in namespaces:
        with contextlib.suppress(rest.ApiError):
            await kube.create(rest.NAMESPACES, {"metadata": {"name": ns}})
    return work, kube, slurm


async def stop_bench(
    bridge: subprocess.Popen[bytes], factory: InformerFactory, slurm: SlurmClient, kube: rest.Kube
) -> None:
    """Stop the bridge process (40 s to end) and close the bench's informers and clients."""
    await stop_bridge(bridge)
    await factory.stop()
    await slurm.close()
    await kube.close()


async def started_up(port: int) -> None:
    """The bridge's start-up steps against Slurm are done: its workload controller read the
    job list once (its sweep for orphaned jobs, before its first reconcile)."""

    async def swept() -> bool:
        return any(
            name.startswith("slurm_rest_requests_total{")
            and 'method="GET"' in name
            and name.split('endpoint="')[1].split('"')[0].endswith("/jobs/")
            for name in samples(port)
        )

    await until(swept, "the bridge's start-up sweep", 60)


async def stop_bridge(bridge: subprocess.Popen[bytes]) -> None:
    """Stop the bridge process (40 s to end)."""
    bridge.terminate()
    with contextlib.suppress(subprocess.TimeoutExpired):
        await asyncio.to_thread(bridge.wait, 40)


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: timed out waiting for {what}")
        await asyncio.sleep(0.2)


async def register_nodes(kube: rest.Kube, slurm: SlurmClient, names: list[str]) -> None:
    """The kwok nodes become EXTERNAL Slurm nodes of the bridge's partition (Slurm needs an
    address it never contacts: loopback) and get the bridge's taint."""
    for name in names:
        node = await kube.get(rest.NODES, name)
        if not (node.get("status") or {}).get("addresses"):
            await kube.patch(
                rest.NODES,
                name,
                {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}},
                subresource="status",
            )
        await kube.patch(rest.NODES, name, {"metadata": {"labels": {EXTERNAL_NODE: "true"}}})

    async def registered() -> bool:
        nodes, _ = await slurm.list_nodes()
        in_part = {n.name for n in nodes or [] if PARTITION in n.partitions}
        if not set(names) <= in_part:
            return False
        for name in names:
            taints = (await kube.get(rest.NODES, name))["spec"].get("taints") or []
            if not any(t.get("key") == MANAGED_NODE_TAINT for t in taints):
                return False
        return True

    await until(registered, "kwok nodes registered in Slurm and tainted", 180)


# ---------------------------------------------------------------- pods


def bench_pod(name: str, run: str, scheduler: str | None) -> JSON:
    spec: JSON = {
        "nodeSelector": {"type": "kwok"},
        "tolerations": TOLERATIONS,
        "containers": [
            {
                "name": "c",
                "image": "bench/none:1",
                "resources": {"requests": {"cpu": "1", "memory": "64Mi"}},
            }
        ],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"bench-run": run},
            "annotations": {SLURMJOB_PREFIX + "exclusive": "false"},
        },
        "spec": spec,
    }


class Bindings:
    """When each pod of the namespace was first seen bound (watch event arrival)."""

    def __init__(self, factory: InformerFactory) -> None:
        self.informer = factory.informer(rest.PODS, namespace=NS)
        self.bound_at: dict[str, float] = {}
        self.informer.add_handler(Handler(on_add=self._seen, on_update=lambda _o, n: self._seen(n)))

    def _seen(self, pod: JSON) -> None:
        name = pod["metadata"]["name"]
        if pod["spec"].get("nodeName") and name not in self.bound_at:
            self.bound_at[name] = time.monotonic()

    def of_run(self, run: str) -> list[JSON]:
        """The pods of one run (label `bench-run`) the watch shows."""
        return [
            p
            for p in self.informer.store.objects()
            if (p["metadata"].get("labels") or {}).get("bench-run") == run
        ]

    def count(self, run: str) -> int:
        return len(self.of_run(run))


async def create_all(kube: rest.Kube, pods: list[JSON]) -> dict[str, float]:
    """Create the pods at once (16 requests in flight); when each create was sent."""
    sent: dict[str, float] = {}
    limit = asyncio.Semaphore(16)

    async def one(pod: JSON) -> None:
        async with limit:
            sent[pod["metadata"]["name"]] = time.monotonic()
            await kube.create(rest.PODS, pod, NS)

    await asyncio.gather(*(one(p) for p in pods))
    return sent


async def burst(
    kube: rest.Kube,
    binds: Bindings,
    n: int,
    scheduler: str | None,
    *,
    slurm: SlurmClient | None = None,
    problems: list[str] | None = None,
    metrics_port: int = 0,
    breakdown: dict[str, float] | None = None,
    requests: dict[str, int] | None = None,
    cpu: CpuMeter | None = None,
) -> tuple[list[float], float]:
    """n pods at once: create->bound latencies and pods/s (first create to last bind). With
    `slurm`, the placements are checked against Slurm's jobs (see `placement_problems`)
    and, once the pods are gone, that no job of theirs is left; found problems are added
    to `problems`. With the bridge's `metrics_port`, `breakdown` gets where its time went
    until the last pod was bound (`where_time_went`) and `requests` its Kubernetes requests
    by method; `cpu` measures the machine's CPU from the first create until then."""
    run = uuid.uuid4().hex[:6]
    pods = [bench_pod(f"b{run}-{i}", run, scheduler) for i in range(n)]
    before = samples(metrics_port) if metrics_port and breakdown is not None else {}
    if cpu is not None:
        cpu.start()
    sent = await create_all(kube, pods)

    async def all_bound() -> bool:
        return all(name in binds.bound_at for name in sent)

    await until(all_bound, f"{n} pods bound", 120 + n)
    if cpu is not None:
        cpu.stop()
    if before and metrics_port and breakdown is not None:
        after = samples(metrics_port)
        breakdown.update(where_time_went(before, after))
        if requests is not None:
            requests.update(kube_requests(before, after))
    lat = [binds.bound_at[name] - t for name, t in sent.items()]
    span = max(binds.bound_at[name] for name in sent) - min(sent.values())
    if slurm is not None and problems is not None:
        problems += await placement_problems(slurm, binds, run)
    await finish(kube, binds, run, bridge=scheduler is not None)
    if slurm is not None and problems is not None:
        left = [j for j in await live_jobs(slurm) if j.name.startswith(f"{NS}/b{run}-")]
        problems += [f"job {j.job_id} ({j.name}) left after its pod went" for j in left]
    return lat, n / span if span > 0 else float("inf")


async def live_jobs(slurm: SlurmClient) -> list[Job]:
    jobs, _ = await slurm.list_jobs()
    return [j for j in jobs or [] if not j.is_finished and j.partition == PARTITION]


async def placement_problems(slurm: SlurmClient, binds: Bindings, run: str) -> list[str]:
    """What Slurm's jobs say against the run's bindings: every pod has exactly one live
    job, running on the pod's node, and no node holds more pods than it has CPUs (each
    pod asks one); one full read of the job list."""
    mine = {
        str(p["metadata"]["name"]): str(p["spec"].get("nodeName") or "") for p in binds.of_run(run)
    }
    jobs: dict[str, list[Job]] = {}
    for j in await live_jobs(slurm):
        jobs.setdefault(j.name.removeprefix(f"{NS}/"), []).append(j)
    problems = []
    per_node: dict[str, int] = {}
    for name, node in mine.items():
        per_node[node] = per_node.get(node, 0) + 1
        have = jobs.get(name, [])
        if len(have) != 1:
            problems.append(f"pod {name}: {len(have)} live jobs")
        elif not have[0].is_running or have[0].nodes != node:
            problems.append(f"pod {name} on {node}: its job {have[0].job_id} is on {have[0].nodes}")
    problems += [
        f"node {n}: {c} pods for {NODE_CPUS} CPUs" for n, c in per_node.items() if c > NODE_CPUS
    ]
    return problems


def metric_sum(port: int, name: str) -> float:
    """The sum of a metric's samples on the bridge's /metrics."""
    return sum(v for sample, v in samples(port).items() if sample.startswith(name))


def samples(port: int) -> dict[str, float]:
    """Every sample on the bridge's /metrics, by name with labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def label(sample: str, key: str) -> str:
    """The value of label `key` in a sample's name (`name{key="value",...}`)."""
    return sample.split(f'{key}="')[1].split('"', maxsplit=1)[0]


def kube_requests(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    """The bridge's Kubernetes API requests between two `samples`, by method."""
    out: dict[str, int] = {}
    for name, value in after.items():
        if name.startswith("rest_client_requests_total{"):
            method = label(name, "method")
            out[method] = out.get(method, 0) + round(value - before.get(name, 0.0))
    return {k: v for k, v in sorted(out.items()) if v}


def where_time_went(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean seconds, between two `samples`, of: a scheduler pass waiting in the work queue
    (`queue`) and running (`pass`), and each kind of slurmrestd request (by endpoint)."""

    def mean(prefix: str, labels: str) -> tuple[float, float]:
        total = after.get(f"{prefix}_sum{labels}", 0.0) - before.get(f"{prefix}_sum{labels}", 0.0)
        count = after.get(f"{prefix}_count{labels}", 0.0) - before.get(
            f"{prefix}_count{labels}", 0.0
        )
        return (total / count if count else 0.0), count

    def labelled(prefix: str) -> list[str]:
        return [
            n.removeprefix(f"{prefix}_count") for n in after if n.startswith(f"{prefix}_count{{")
        ]

    out: dict[str, float] = {}
    for what, prefix in (("queue", "workqueue_queue_duration_seconds"),
                         ("pass", "workqueue_work_duration_seconds")):  # fmt: skip
        for labels in labelled(prefix):
            if '"bridge-scheduler"' in labels:
                out[what], _ = mean(prefix, labels)
    prefix = "slurm_rest_request_duration_seconds"
    for labels in labelled(prefix):
        avg, count = mean(prefix, labels)
        if count:
            method = label(labels, "method")
            endpoint = label(labels, "endpoint").split("/", 3)[-1]
            out[f"{method} {endpoint} (n={count:.0f})"] = avg
    return out


async def finish(kube: rest.Kube, binds: Bindings, run: str, *, bridge: bool) -> None:
    """End the run's pods: bridge pods are reported Succeeded (as a kubelet would when the
    work ends) so the bridge cancels their jobs and lets them go; then all are deleted."""
    names = [p["metadata"]["name"] for p in binds.of_run(run)]
    if bridge:
        # Running first, as a kubelet reports a pod that ran: kwok's Running status for a
        # pod bound just before the burst ended could land after a Succeeded written now,
        # and a pod that runs again is not released (the run waited for it forever).
        async def running() -> bool:
            return all((p.get("status") or {}).get("phase") == "Running" for p in binds.of_run(run))

        await until(running, f"pods of run {run} running", 120)
        limit = asyncio.Semaphore(16)

        async def succeed(name: str) -> None:
            async with limit:
                with contextlib.suppress(rest.ApiError):
                    await kube.patch(
                        rest.PODS,
                        name,
                        {"status": {"phase": "Succeeded"}},
                        NS,
                        subresource="status",
                    )

        await asyncio.gather(*(succeed(n) for n in names))
    await kube.request("DELETE", rest.PODS.path(NS), params={"labelSelector": f"bench-run={run}"})

    async def gone() -> bool:
        return binds.count(run) == 0

    await until(gone, f"pods of run {run} gone", 300)


async def single_decisions(
    kube: rest.Kube, binds: Bindings, proxy: CountingProxy
) -> tuple[list[float], list[int]]:
    """One pod at a time: create->bound and slurmrestd bytes in that window."""
    times: list[float] = []
    sizes: list[int] = []
    for _ in range(SINGLE_PODS):
        run = uuid.uuid4().hex[:6]
        name = f"s{run}"
        before = proxy.total
        sent = await create_all(kube, [bench_pod(name, run, SCHEDULER)])

        async def bound(name: str = name) -> bool:
            return name in binds.bound_at

        await until(bound, f"pod {name} bound", 120)
        sizes.append(proxy.total - before)
        times.append(binds.bound_at[name] - sent[name])
        await finish(kube, binds, run, bridge=True)
    return times, sizes


# ---------------------------------------------------------------- queued jobs


async def queue_jobs(slurm: SlurmClient, n: int, have: list[int]) -> None:
    """Held batch jobs in partition `all`, up to `n` (Slurm keeps them pending)."""
    limit = asyncio.Semaphore(8)

    async def one(i: int) -> None:
        async with limit:
            job_id = await slurm.submit_job(
                {
                    "name": f"bench-queued-{i}",
                    "partition": "all",
                    "hold": True,
                    "current_working_directory": "/tmp",
                    "environment": ["PATH=/bin:/usr/bin"],
                },
                script="#!/bin/sh\ntrue\n",
            )
            have.append(job_id)

    await asyncio.gather(*(one(i) for i in range(len(have), n)))


async def cancel_jobs(slurm: SlurmClient, ids: list[int]) -> None:
    limit = asyncio.Semaphore(8)

    async def one(job_id: int) -> None:
        async with limit:
            with contextlib.suppress(errors.SlurmError):
                await slurm.cancel_job(job_id)

    await asyncio.gather(*(one(j) for j in ids))


async def give_back(kube: rest.Kube, slurm: SlurmClient, binds: Bindings, names: list[str]) -> None:
    """Leave the bench test bed as found, while the bridge still runs: every pod of the
    namespace ended and deleted, the kwok nodes unlabelled, their taint and Slurm nodes
    removed by the bridge (the other benchmarks use these nodes)."""
    runs = {
        (p["metadata"].get("labels") or {}).get("bench-run") for p in binds.informer.store.objects()
    }
    for run in runs - {None}:
        with contextlib.suppress(SystemExit, rest.ApiError):
            await finish(kube, binds, str(run), bridge=True)
    for name in names:
        with contextlib.suppress(rest.ApiError):
            await kube.patch(rest.NODES, name, {"metadata": {"labels": {EXTERNAL_NODE: None}}})

    async def released() -> bool:
        nodes, _ = await slurm.list_nodes()
        if set(names) & {n.name for n in nodes or []}:
            return False
        for name in names:
            taints = (await kube.get(rest.NODES, name))["spec"].get("taints") or []
            if any(t.get("key") == MANAGED_NODE_TAINT for t in taints):
                return False
        return True

    with contextlib.suppress(SystemExit):
        await until(released, "kwok nodes released by the bridge", 180)


# ---------------------------------------------------------------- report


def ms(v: float) -> str:
    return f"{v * 1000:8.0f} ms"


async def run() -> None:
    bed = bench_testbed(kwok_nodes=KWOK_NODES)
    state = bed.load()
    kwok = state.kwok_nodes[:KWOK_NODES]
    work, kube, slurm = await bridge_bench(bed, "bridge", (NS, OWN_NS))
    proxy = CountingProxy(bed.slurm_rest_url)
    proxy_url = await proxy.start()
    # The bursts first: the bridge talks to slurmrestd directly, as in a cluster (the
    # counting proxy lives in this process, beside the clock, and adds a hop to every
    # request); then it is started again through the proxy for the single decisions.
    bridge, metrics_port = await asyncio.to_thread(start_bridge, bed, bed.slurm_rest_url, work)
    factory = InformerFactory(kube)
    binds = Bindings(factory)
    factory.start()
    queued: list[int] = []
    results: dict[str, Any] = {}
    problems: list[str] = []
    # By the burst's place in BURSTS (a size may be given twice).
    breakdowns: dict[int, dict[str, float]] = {i: {} for i in range(len(BURSTS))}
    requests: dict[int, dict[str, int]] = {i: {} for i in range(len(BURSTS))}
    cpu = {f"{who}-{i}": CpuMeter() for who in ("bridge", "kube") for i in range(len(BURSTS))}
    try:
        await factory.wait_synced()
        await register_nodes(kube, slurm, kwok)
        await started_up(metrics_port)
        refused_before = metric_sum(metrics_port, REFUSED)
        for i, n in enumerate(BURSTS):
            results[f"bridge-{i}"] = await burst(
                kube,
                binds,
                n,
                SCHEDULER,
                slurm=slurm,
                problems=problems,
                metrics_port=metrics_port,
                breakdown=breakdowns[i],
                requests=requests[i],
                cpu=cpu[f"bridge-{i}"],
            )
            results[f"kube-{i}"] = await burst(kube, binds, n, None, cpu=cpu[f"kube-{i}"])
        refused = metric_sum(metrics_port, REFUSED) - refused_before
        await stop_bridge(bridge)
        bridge, metrics_port = await asyncio.to_thread(start_bridge, bed, proxy_url, work)
        await started_up(metrics_port)
        await queue_jobs(slurm, QUEUED_FEW, queued)
        t_few, b_few = await single_decisions(kube, binds, proxy)
        t0 = time.monotonic()
        await queue_jobs(slurm, QUEUED_MANY, queued)
        queue_s = time.monotonic() - t0
        t_many, b_many = await single_decisions(kube, binds, proxy)
    finally:
        await cancel_jobs(slurm, queued)
        await give_back(kube, slurm, binds, kwok)
        await stop_bench(bridge, factory, slurm, kube)
        await proxy.stop()

    print("\nslurm-bridge scheduler vs kube-scheduler (same pods, same nodes)")
    print(
        f"  nodes: {len(kwok)} kwok nodes registered by the bridge as EXTERNAL Slurm nodes "
        "(32 CPUs): Slurm allocation real, containers not run (kwok)"
    )
    print('  pods: cpu 1, memory 64Mi, exclusive: "false" (pods share nodes; all fit at once)')
    print(f"  machine load average at the end: {os.getloadavg()[0]:.1f} (2 cores, shared)")
    head = ("pods", "bridge p50", "bridge p99", "kube p50", "kube p99", "p50 ratio")
    print("  " + " ".join(f"{h:>11}" for h in head) + "  bridge pods/s  kube pods/s  pods/s ratio")
    for i, n in enumerate(BURSTS):
        bl, bt = results[f"bridge-{i}"]
        kl, kt = results[f"kube-{i}"]
        print(
            f"  {n:11d} {ms(pct(bl, 50)):>11} {ms(pct(bl, 99)):>11} {ms(pct(kl, 50)):>11} "
            f"{ms(pct(kl, 99)):>11} {pct(bl, 50) / pct(kl, 50):10.1f}x {bt:14.1f} {kt:12.1f}"
            f" {bt / kt:12.2f}x"
        )
    print(
        "  targets: 500 pods at once at least kube-scheduler's pods/s (ratio >= 1); 100 pods at "
        "once a p50 within 2x of kube-scheduler's"
    )
    print(
        f"  checks over the bursts: {refused:.0f} allocations Slurm refused (a FAILED record "
        f"each), {len(problems)} placement problems (a pod without exactly one live job on "
        "its node, a node given more pods than CPUs, a job left after its pod)"
    )
    for p in problems[:10]:
        print(f"    {p}")
    print("  where the bridge's time went until each burst's last pod was bound (means):")
    for i, n in enumerate(BURSTS):
        said = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in breakdowns[i].items())
        asked = ", ".join(f"{k} {v}" for k, v in requests[i].items())
        print(f"    {n} pods: {said}; Kubernetes requests: {asked}")
    print(
        "  the machine's CPU per pod from the first create to the last pod bound (ms; "
        "2 cores give 2000 ms a second, so pods/s can reach at most 2000 / this):"
    )
    for i, n in enumerate(BURSTS):
        print(f"    {n} pods: bridge {cpu[f'bridge-{i}'].per(n)}")
        print(f"    {n} pods: kube-scheduler {cpu[f'kube-{i}'].per(n)}")
    print(
        f"  single pods one after another (n={SINGLE_PODS}), create -> bound: "
        f"p50 {ms(pct(t_few, 50)).strip()} p99 {ms(pct(t_few, 99)).strip()}  (target p50 <= 500 ms)"
    )
    print("\none scheduling decision vs unrelated jobs queued in Slurm (held, partition all)")
    med = statistics.median
    for label, t, b in ((f"{QUEUED_FEW:5d} queued", t_few, b_few),
                        (f"{len(queued):5d} queued", t_many, b_many)):  # fmt: skip
        print(f"  {label}: time p50 {ms(med(t)).strip()}, slurmrestd bytes p50 {med(b):,.0f}")
    print(
        f"  ratio {len(queued)}/{QUEUED_FEW}: time {med(t_many) / med(t_few):.2f}x, "
        f"bytes {med(b_many) / med(b_few):.2f}x  (target <= 1.2x; queueing took {queue_s:.0f}s)"
    )


def main() -> None:
    asyncio.run(run())


if __name__ == "__main__":
    main()
