"""Autoscaling gauges computed from the operator's Slurm informers.

Values come from the informer caches (nodes, jobs and partitions, kept by `update_time`
deltas), never from a request to Slurm per scrape: one pass over a cluster's cached jobs is
made once per informer poll and reused until the next poll. Jobs are polled only while
someone wants them (the external metrics API while an HPA asks, or `--slurm-watch-jobs`);
otherwise the job gauges are left out (unknown, not zero) and only `nodes_idle` is
exported.

Names follow slurmctld's own openmetrics (`MetricsType=metrics/openmetrics`) so a user can
point the same HPA/KEDA rule at either source:

- `slurm_partition_jobs_pending{partition}`: pending jobs that wait for resources;
- `slurm_partition_jobs_pending_nodes{partition}`: the nodes those jobs ask for (a job's
  minimum node count, at least 1), so an HPA can target nodes instead of jobs;
- `slurm_partition_nodes_idle{partition}`: nodes of the partition that are IDLE and not
  draining;
- `slurm_nodeset_jobs_pending`, `…_jobs_pending_nodes`, `…_nodes_idle{namespace,nodeset}`:
  the same for a NodeSet: its partition is the one named after it, its nodes are the Slurm
  nodes of its pods.

A pending job counts unless nothing a new node could change makes it run: held by the user or
an admin (`JobHeldUser`, `JobHeldAdmin`), waiting on another job (`Dependency`,
`DependencyNeverSatisfied`) or on its begin time (`BeginTime`). Every other reason counts,
in particular `PartitionConfig` (the partition has no nodes: scale from zero), `Resources`,
`Priority` and `Nodes_required_for_job_are_DOWN,_DRAINED…`.

A NodeSet's job gauges leave out, besides, a job its NodeSet can never run (`never_fits`):
one asking for more nodes than the largest `maxReplicas` of the HPAs scaling it, more CPUs
than that many of its nodes hold, or a task or a node's worth of memory larger than one of its
nodes (its Slurm nodes' size; unknown while it has none). Counted, `sbatch -N 5` against a
maximum of 4 held 4 idle pods for as long as it pended. The partition gauges keep Slurm's
meaning (every pending job of the partition).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from slinky.operator.clients import ClusterClients
from slinky.operator.nodeset.builder import (
    ANNOTATION_CONDEMNED,
    ANNOTATION_CONDEMNED_AT,
    ANNOTATION_DRAIN_DEADLINE,
)
from slinky.operator.nodeset.partition import ANNOTATION_PARTITION
from slinky.operator.nodeset.pods import parse_time
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.models import Job, Node, csv, number
from slinky.types import JSON

UNCOUNTED_REASONS = frozenset(
    {"JobHeldUser", "JobHeldAdmin", "Dependency", "DependencyNeverSatisfied", "BeginTime"}
)

PARTITION_METRICS = (
    "slurm_partition_jobs_pending",
    "slurm_partition_jobs_pending_nodes",
    "slurm_partition_nodes_idle",
)
NODESET_METRICS = (
    "slurm_nodeset_jobs_pending",
    "slurm_nodeset_jobs_pending_nodes",
    "slurm_nodeset_nodes_idle",
)
HELP = {
    "jobs_pending": "Pending jobs that wait for resources (held or dependent jobs excluded)",
    "jobs_pending_nodes": "Nodes asked for by the pending jobs counted in jobs_pending",
    "nodes_idle": "Nodes that are IDLE and not draining",
}


def counts(job: Job) -> bool:
    """Whether a pending job is demand that more nodes could serve."""
    return job.is_pending and job.state_reason not in UNCOUNTED_REASONS


@dataclass(frozen=True)
class Ceiling:
    """The most a NodeSet can ever offer one job: `nodes` nodes (the largest maxReplicas of
    the HPAs scaling it, `source` names them; None: nothing bounds it), each with `cpus` CPUs
    and `memory_mb` MB (its Slurm nodes' largest; None while it has none)."""

    nodes: int | None = None
    cpus: int | None = None
    memory_mb: int | None = None
    source: str = ""


def never_fits(job: Job, ceiling: Ceiling) -> str | None:
    """Why a pending job can never run on a NodeSet at its largest (a sentence naming what it
    asks and what the NodeSet offers), or None while it may."""
    nodes = max(1, job.node_count or 1)
    raw = job.raw
    if ceiling.nodes is not None and nodes > ceiling.nodes:
        return f"asks for {nodes} nodes, the NodeSet has at most {ceiling.nodes} ({ceiling.source})"
    if ceiling.cpus:
        per_task = number(raw.get("cpus_per_task")) or 0
        if per_task > ceiling.cpus:
            return f"asks for {per_task} CPUs per task, a node of the NodeSet has {ceiling.cpus}"
        if ceiling.nodes is not None and (job.cpus or 0) > ceiling.nodes * ceiling.cpus:
            return (
                f"asks for {job.cpus} CPUs, the NodeSet's {ceiling.nodes} nodes at most "
                f"({ceiling.source}) have {ceiling.nodes * ceiling.cpus}"
            )
    if ceiling.memory_mb:
        per_node = number(raw.get("memory_per_node")) or 0
        if per_node > ceiling.memory_mb:
            return (
                f"asks for {per_node} MB of memory per node, a node of the NodeSet has "
                f"{ceiling.memory_mb} MB"
            )
    return None


@dataclass
class Demand:
    """A NodeSet's pending demand: jobs that may run on it, the nodes they ask for, and the
    jobs left out because they never can (job id, why)."""

    jobs_pending: int = 0
    jobs_pending_nodes: int = 0
    never: list[tuple[int, str]] = field(default_factory=list)


def demand(pending: Iterable[Job], ceiling: Ceiling) -> Demand:
    """The counted pending jobs of a NodeSet's partition (`counts`) against its ceiling."""
    out = Demand()
    for job in pending:
        why = never_fits(job, ceiling)
        if why is not None:
            out.never.append((job.job_id, why))
            continue
        out.jobs_pending += 1
        out.jobs_pending_nodes += max(1, job.node_count or 1)
    return out


def hpa_ceiling(hpas: Iterable[JSON]) -> tuple[int | None, str]:
    """The most replicas the HPAs scaling a NodeSet may set, and which HPAs say so."""
    best: tuple[int, str] | None = None
    for hpa in hpas:
        top = (hpa.get("spec") or {}).get("maxReplicas")
        if isinstance(top, int) and (best is None or top > best[0]):
            best = (top, f"HPA {hpa['metadata']['name']} maxReplicas")
    return best if best is not None else (None, "")


@dataclass
class PartitionStats:
    jobs_pending: int = 0
    jobs_pending_nodes: int = 0
    nodes_idle: int = 0

    def value(self, metric: str) -> int:
        """`metric` is any name ending in one of the three field names."""
        for name in ("jobs_pending_nodes", "jobs_pending", "nodes_idle"):
            if metric.endswith(name):
                return int(getattr(self, name))
        raise KeyError(metric)


@dataclass
class ClusterStats:
    """One pass over one cluster's cache."""

    polls: int
    # Whether jobs and partitions were polled: without them, only nodes_idle is known.
    jobs_known: bool = False
    partitions: dict[str, PartitionStats] = field(default_factory=dict)
    # Idle nodes by (namespace, nodeset), from the Slurm node's identity comment/feature.
    nodeset_idle: dict[tuple[str, str], int] = field(default_factory=dict)
    # The counted pending jobs by partition (what a NodeSet's demand is made of).
    pending: dict[str, list[Job]] = field(default_factory=dict)
    # The largest (CPUs, memory MB) of a NodeSet's Slurm nodes, by (namespace, nodeset).
    nodeset_size: dict[tuple[str, str], tuple[int, int]] = field(default_factory=dict)


def _idle(node: Node) -> bool:
    return node.state.base == "IDLE" and not node.state.is_drain


def nodeset_of(node: Node) -> tuple[str, str] | None:
    """(namespace, nodeset) of an operator-made Slurm node: the namespace from the node's
    identity comment, the NodeSet from its feature (slurmd runs with Features=<nodeset>)."""
    try:
        ident = json.loads(node.comment) if node.comment else None
    except ValueError:
        return None
    if not isinstance(ident, dict):
        return None
    namespace, pod = ident.get("namespace"), ident.get("podName")
    if not isinstance(namespace, str) or not isinstance(pod, str):
        return None
    for feature in node.features:
        if pod.startswith(f"{feature}-") and pod[len(feature) + 1 :].isdigit():
            return (namespace, feature)
    return None


def compute(informer: SlurmInformer) -> ClusterStats:
    stats = ClusterStats(polls=informer.polls, jobs_known=informer.jobs_synced)
    parts = stats.partitions
    for name in informer.partitions:
        parts[name] = PartitionStats()
    for job in informer.jobs.values() if stats.jobs_known else ():
        if not counts(job):
            continue
        for name in csv(job.partition):
            p = parts.setdefault(name, PartitionStats())
            p.jobs_pending += 1
            p.jobs_pending_nodes += max(1, job.node_count or 1)
            stats.pending.setdefault(name, []).append(job)
    for node in informer.nodes.values():
        owner = nodeset_of(node)
        if owner is not None:
            cpus, memory = stats.nodeset_size.get(owner, (0, 0))
            stats.nodeset_size[owner] = (max(cpus, node.cpus), max(memory, node.real_memory))
        if not _idle(node):
            continue
        for name in node.partitions:
            parts.setdefault(name, PartitionStats()).nodes_idle += 1
        if owner is not None:
            stats.nodeset_idle[owner] = stats.nodeset_idle.get(owner, 0) + 1
    return stats


class SlurmMetrics:
    """Cached stats per cluster, recomputed only after the cluster's informer polled."""

    def __init__(self, clients: ClusterClients, hpas_of: HpasOf | None = None) -> None:
        self.clients = clients
        # The HPAs scaling a NodeSet (`namespace/name`), from an informer: its ceiling.
        self.hpas_of: HpasOf = hpas_of or (lambda _key: ())
        self._cache: dict[str, tuple[int, ClusterStats]] = {}
        self.computations = 0

    def ceiling(self, stats: ClusterStats, obj: JSON) -> Ceiling:
        """What the NodeSet can ever offer a job (its HPAs' maximum, its nodes' size)."""
        meta = obj["metadata"]
        nodes, source = hpa_ceiling(self.hpas_of(f"{meta['namespace']}/{meta['name']}"))
        cpus, memory = stats.nodeset_size.get((meta["namespace"], meta["name"]), (0, 0))
        return Ceiling(nodes=nodes, cpus=cpus or None, memory_mb=memory or None, source=source)

    def nodeset_demand(self, stats: ClusterStats, obj: JSON) -> Demand:
        return demand(stats.pending.get(nodeset_partition(obj), ()), self.ceiling(stats, obj))

    def cluster(self, cluster_key: str) -> ClusterStats | None:
        conn = self.clients.get(cluster_key)
        if conn is None or not conn.informer.has_synced:
            return None
        informer = conn.informer
        cached = self._cache.get(cluster_key)
        if (
            cached is not None
            and cached[0] == id(informer)
            and cached[1].polls == informer.polls
            and cached[1].jobs_known == informer.jobs_synced
        ):
            return cached[1]
        stats = compute(informer)
        self.computations += 1
        self._cache[cluster_key] = (id(informer), stats)
        return stats

    def clusters(self) -> Iterator[tuple[str, ClusterStats]]:
        for key in self.clients.keys():
            stats = self.cluster(key)
            if stats is not None:
                yield key, stats


NodeSetLister = Callable[[], Iterable[JSON]]
HpasOf = Callable[[str], Iterable[JSON]]


class Gauges(Collector):
    """The gauges on the operator's `/metrics`, read from `SlurmMetrics` at scrape time."""

    def __init__(self, metrics: SlurmMetrics, nodesets: NodeSetLister) -> None:
        self.metrics = metrics
        self.nodesets = nodesets

    def collect(self) -> Iterator[GaugeMetricFamily]:
        part = {
            m: GaugeMetricFamily(
                m,
                HELP[m.removeprefix("slurm_partition_")],
                labels=["namespace", "cluster", "partition"],
            )
            for m in PARTITION_METRICS
        }
        nset = {
            m: GaugeMetricFamily(
                m, HELP[m.removeprefix("slurm_nodeset_")], labels=["namespace", "nodeset"]
            )
            for m in NODESET_METRICS
        }
        by_cluster = dict(self.metrics.clusters())
        for key, stats in by_cluster.items():
            cluster_ns, _, cluster_name = key.partition("/")
            for name, p in stats.partitions.items():
                for m, fam in part.items():
                    if stats.jobs_known or not is_job_metric(m):
                        fam.add_metric([cluster_ns, cluster_name, name], p.value(m))
        for obj in self.nodesets():
            ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
            cluster = (obj.get("spec") or {}).get("clusterName")
            found = by_cluster.get(f"{ns}/{cluster}")
            if found is None:
                continue
            for m, fam in nset.items():
                if found.jobs_known or not is_job_metric(m):
                    fam.add_metric([ns, name], nodeset_value(self.metrics, found, obj, m))
        yield from part.values()
        yield from nset.values()


NODESET_REPLICAS = "slinky_nodeset_replicas"
CLUSTER_READY = "slinky_cluster_ready"
DRAIN_STARTED = "slinky_nodeset_drain_started_timestamp_seconds"
DRAIN_DEADLINE = "slinky_nodeset_drain_deadline_timestamp_seconds"
OBJECT_METRICS = (NODESET_REPLICAS, CLUSTER_READY, DRAIN_STARTED, DRAIN_DEADLINE)
# state label of slinky_nodeset_replicas -> where the number is (spec, or status field).
REPLICA_STATES = {
    "desired": ("spec", "replicas"),
    "current": ("status", "replicas"),
    "ready": ("status", "readyReplicas"),
    "updated": ("status", "updatedReplicas"),
    "slurm_idle": ("status", "slurmIdle"),
    "slurm_allocated": ("status", "slurmAllocated"),
    "slurm_down": ("status", "slurmDown"),
    "slurm_drain": ("status", "slurmDrain"),
}
PodsOf = Callable[[str], Iterable[JSON]]


def condemned_notes(obj: JSON, pods_of: PodsOf) -> list[JSON]:
    """The annotations of a NodeSet's condemned pods (chosen for scale-in, update or
    deletion: draining, or waiting for their jobs): one pass over its pods per scrape."""
    uid = str(obj["metadata"].get("uid") or "")
    notes = (((p.get("metadata") or {}).get("annotations") or {}) for p in pods_of(uid))
    return [n for n in notes if n.get(ANNOTATION_CONDEMNED)]


def replica_counts(obj: JSON, condemned: list[JSON]) -> dict[str, int]:
    """A NodeSet's numbers as `kubectl get nodesets` shows them, and how many of its pods
    are condemned (`condemned_notes`)."""
    counts = {
        state: int((obj.get(part) or {}).get(field) or 0)
        for state, (part, field) in REPLICA_STATES.items()
    }
    counts["desired"] = int((obj.get("spec") or {}).get("replicas", 1) or 0)
    counts["condemned"] = len(condemned)
    return counts


def drain_times(condemned: list[JSON]) -> tuple[float | None, float | None]:
    """Of a NodeSet's condemned pods (`condemned_notes`): the earliest condemnation and the
    earliest drain deadline (when the last job on that pod's node ends by its time limit),
    as Unix times; None when no pod says."""
    started: list[float] = []
    deadlines: list[float] = []
    for notes in condemned:
        for key, into in (
            (ANNOTATION_CONDEMNED_AT, started),
            (ANNOTATION_DRAIN_DEADLINE, deadlines),
        ):
            with contextlib.suppress(KeyError, ValueError):
                into.append(parse_time(str(notes[key])).timestamp())
    return (min(started, default=None), min(deadlines, default=None))


class ObjectGauges(Collector):
    """NodeSets' replicas by state and each Cluster's readiness, from the operator's caches
    (what dashboards and alerts need beside Slurm's own metrics)."""

    def __init__(self, nodesets: NodeSetLister, clusters: NodeSetLister, pods_of: PodsOf) -> None:
        self.nodesets = nodesets
        self.clusters = clusters
        self.pods_of = pods_of

    def collect(self) -> Iterator[GaugeMetricFamily]:
        replicas = GaugeMetricFamily(
            NODESET_REPLICAS,
            "NodeSet replicas by state: desired, current, ready, updated, condemned (being "
            "drained or waiting for jobs before deletion), slurm_idle/allocated/down/drain",
            labels=["namespace", "nodeset", "state"],
        )
        started = GaugeMetricFamily(
            DRAIN_STARTED,
            "When the NodeSet's longest-waiting condemned pod was condemned (its Slurm node "
            "drained); absent while no pod is",
            labels=["namespace", "nodeset"],
        )
        deadline = GaugeMetricFamily(
            DRAIN_DEADLINE,
            "The earliest drain deadline of the NodeSet's condemned pods: when the last job "
            "on that pod's Slurm node ends at the latest, by its time limit (as Slurm said "
            "when the drain began); absent while no pod is condemned",
            labels=["namespace", "nodeset"],
        )
        for obj in self.nodesets():
            meta = obj["metadata"]
            condemned = condemned_notes(obj, self.pods_of)
            for state, value in replica_counts(obj, condemned).items():
                replicas.add_metric([meta["namespace"], meta["name"], state], value)
            since, until = drain_times(condemned)
            if since is not None:
                started.add_metric([meta["namespace"], meta["name"]], since)
            if until is not None:
                deadline.add_metric([meta["namespace"], meta["name"]], until)
        ready = GaugeMetricFamily(
            CLUSTER_READY,
            "1 while the Cluster's Ready condition is True, else 0; reason: the condition's",
            labels=["namespace", "cluster", "reason"],
        )
        for obj in self.clusters():
            meta = obj["metadata"]
            cond: JSON = next(
                (
                    c
                    for c in (obj.get("status") or {}).get("conditions") or []
                    if c.get("type") == "Ready"
                ),
                {},
            )
            ok = 1.0 if cond.get("status") == "True" else 0.0
            ready.add_metric([meta["namespace"], meta["name"], str(cond.get("reason") or "")], ok)
        yield replicas
        yield started
        yield deadline
        yield ready


def is_job_metric(metric: str) -> bool:
    """Whether the metric counts jobs (known only while jobs are polled)."""
    return "_jobs_" in metric


def nodeset_partition(obj: JSON) -> str:
    """The Slurm partition of a NodeSet: the one it claimed (annotation), else
    `spec.partition.name`, else the NodeSet's own name (as the partition rule names it)."""
    meta = obj["metadata"]
    claimed = (meta.get("annotations") or {}).get(ANNOTATION_PARTITION)
    named = ((obj.get("spec") or {}).get("partition") or {}).get("name")
    return str(claimed or named or meta["name"])


def nodeset_value(metrics: SlurmMetrics, stats: ClusterStats, obj: JSON, metric: str) -> int:
    """A NodeSet's gauge: its idle nodes, or its partition's jobs that it can ever run."""
    if metric.endswith("nodes_idle"):
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        return stats.nodeset_idle.get(key, 0)
    found = metrics.nodeset_demand(stats, obj)
    return found.jobs_pending_nodes if metric.endswith("_nodes") else found.jobs_pending
