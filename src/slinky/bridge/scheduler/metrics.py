"""The scheduler's metrics (single pods and groups alike), and the age of a pod they measure
from."""

from __future__ import annotations

import datetime as dt
import time

from prometheus_client import Counter, Gauge, Histogram

from slinky.types import JSON

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
SUBMIT_LATENCY = Histogram(
    "slurm_bridge_submit_latency_seconds",
    "From pod creation to its placeholder job's submission",
    buckets=_LATENCY_BUCKETS,
)
BIND_LATENCY = Histogram(
    "slurm_bridge_bind_latency_seconds",
    "From pod creation to its binding to the node Slurm allocated",
    buckets=_LATENCY_BUCKETS,
)
PODS_PENDING = Gauge(
    "slurm_bridge_pods_pending",
    "Pods whose placeholder job Slurm has not allocated yet, or that no managed node can take",
)
PODS_BOUND = Counter("slurm_bridge_pods_bound_total", "Pods bound to the node Slurm allocated")
EXCLUSION_UPDATES = Counter(
    "slurm_bridge_excluded_nodes_updates_total",
    "Pending placeholder jobs whose excluded_nodes were updated after managed nodes changed",
)
REPLACEMENTS = Counter(
    "slurm_bridge_job_replacements_total",
    "Placeholder jobs replaced because Slurm allocated a node the pod's constraints reject",
)
JOBS_CREATED = Counter(
    "slurm_bridge_placeholder_jobs_total",
    "Placeholder jobs made, by how: allocated inside the request (a node was free) or "
    "submitted to wait for Slurm's scheduling pass",
    ["how"],
)
IMMEDIATE_REFUSED = Counter(
    "slurm_bridge_immediate_allocations_refused_total",
    "Requests to allocate a placeholder job at once that Slurm refused (the job was then "
    "submitted): the node looked free in the cache but was taken, or a job of higher "
    "priority waits",
)
SLURM_ERRORS = Counter(
    "slurm_bridge_slurm_errors_total",
    "Slurm refusals and failures seen by the scheduler, by reason",
    ["reason"],
)


def pod_age(pod: JSON) -> float | None:
    created = (pod.get("metadata") or {}).get("creationTimestamp")
    if not created:
        return None
    try:
        at = dt.datetime.strptime(str(created), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None
    return max(0.0, time.time() - at.timestamp())
