"""What must always hold between the bridge's pods and their placeholder jobs, judged from
one snapshot at a time: the pods of the managed namespace as the apiserver lists them, then
every job as Slurm lists it (in that order: a pod seen bound was bound before its job was
read, so the job already shows its allocation).

Each invariant has a grace period: the bridge repairs some states itself (a replaced job is
cancelled just after its successor is submitted; a pod's job is cancelled soon after the pod
finished), and may be down for a while under chaos. A breach counts once it lasted longer
than that; at the end of the soak, after the settle period, any breach counts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.soak_work import JOB_PREFIX
from slinky.bridge import placeholder, podcontrol
from slinky.bridge.groups import PODGROUP_LABEL
from slinky.slurm.models import Job, expand_hostlist
from slinky_testbed import dev_bridge

JSON = dict[str, Any]


@dataclass(frozen=True)
class Snapshot:
    at: float
    pods: list[JSON]  # the managed namespace, listed first
    jobs: list[Job]  # every job Slurm knows, listed after the pods

    def placeholders(self) -> list[tuple[Job, placeholder.Comment]]:
        """Our bridge's placeholder jobs (any state)."""
        out = []
        for job in self.jobs:
            comment = placeholder.read_comment(str(job.raw.get("admin_comment") or ""))
            if comment is not None and comment.scheduler == dev_bridge.SCHEDULER_NAME:
                out.append((job, comment))
        return out

    def live_pods(self) -> dict[str, JSON]:
        """Pods not finished (terminal, or every container ended for good), by UID."""
        return {str(p["metadata"]["uid"]): p for p in self.pods if not podcontrol.has_ended(p)}


def _names(pods: dict[str, str]) -> str:
    return ", ".join(sorted(pods))


def duplicate_jobs(s: Snapshot) -> dict[str, str]:
    """A pod named by two or more live placeholder jobs."""
    named: dict[str, list[Job]] = {}
    for job, comment in s.placeholders():
        if job.is_finished:
            continue
        for key, uid in comment.pods.items():
            named.setdefault(uid or key, []).append(job)
    return {
        pod: "pod "
        + pod
        + " named by live jobs "
        + ", ".join(f"{j.job_id} ({'+'.join(j.state)})" for j in jobs)
        for pod, jobs in named.items()
        if len(jobs) > 1
    }


def orphaned_jobs(s: Snapshot) -> dict[str, str]:
    """A live placeholder job none of whose pods is still there and unfinished."""
    live = s.live_pods()
    by_key = {f"{p['metadata']['namespace']}/{p['metadata']['name']}": p for p in s.pods}
    out = {}
    for job, comment in s.placeholders():
        if job.is_finished:
            continue
        if any(uid in live if uid else key in by_key for key, uid in comment.pods.items()):
            continue
        what = []
        for key, uid in comment.pods.items():
            pod = by_key.get(key)
            if pod is None or (uid and pod["metadata"]["uid"] != uid):
                what.append(f"{key} gone")
            else:
                what.append(f"{key} {pod['status'].get('phase')}")
        out[f"job {job.job_id}"] = (
            f"job {job.job_id} {'+'.join(job.state)} on {job.nodes or '-'} names " + "; ".join(what)
        )
    return out


def misbound_pods(s: Snapshot) -> dict[str, str]:
    """A bound, unfinished pod whose node is not where Slurm allocated its job (or whose job
    pends, or that has no job at all); a gang's pod i must sit on the job's i-th node."""
    jobs = {j.job_id: j for j in s.jobs}
    out = {}
    for pod in s.pods:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        node = spec.get("nodeName")
        if not node or podcontrol.has_ended(pod):
            continue
        key = f"{meta['namespace']}/{meta['name']}"
        job_id = podcontrol.job_id_of(pod)  # the label, or the Binding's annotation
        if job_id is None:
            out[key] = f"pod {key} bound to {node} without a placeholder job"
            continue
        job = jobs.get(job_id)
        if job is None:
            continue  # Slurm forgot it: `pods_outliving_jobs` judges that
        allocated = expand_hostlist(job.nodes)
        rank = group_rank(pod)
        if job.is_pending:
            out[key] = f"pod {key} bound to {node} while its job {job.job_id} is PENDING"
        elif node not in allocated:
            out[key] = f"pod {key} bound to {node}; its job {job.job_id} has {job.nodes}"
        elif rank is not None and (rank >= len(allocated) or allocated[rank] != node):
            out[key] = (
                f"gang pod {key} (rank {rank}) bound to {node}; job {job.job_id} lists {job.nodes}"
            )
    return out


def group_rank(pod: JSON) -> int | None:
    """The rank of a soak gang's pod (its name ends in -<rank>), None for a single pod."""
    meta = pod["metadata"]
    if not (meta.get("labels") or {}).get(PODGROUP_LABEL):
        return None
    return int(meta["name"].rsplit("-", 1)[1])


def pods_outliving_jobs(s: Snapshot) -> dict[str, str]:
    """A bound pod that still runs though its job ended in Slurm or Slurm forgot it."""
    jobs = {j.job_id: j for j in s.jobs}
    out = {}
    for pod in s.pods:
        meta = pod["metadata"]
        if (
            (pod.get("status") or {}).get("phase") != "Running"
            or meta.get("deletionTimestamp")
            or podcontrol.containers_ended(pod)  # nothing runs: its job was given back
        ):
            continue
        label = podcontrol.job_id_of(pod)
        if label is None:
            continue
        job = jobs.get(label)
        if job is None or job.is_finished:
            state = "unknown to Slurm" if job is None else "+".join(job.state)
            out[f"{meta['namespace']}/{meta['name']}"] = (
                f"pod {meta['namespace']}/{meta['name']} Running on "
                f"{(pod.get('spec') or {}).get('nodeName')}; its job {label} is {state}"
            )
    return out


def pods_without_allocation(s: Snapshot) -> dict[str, str]:
    """A Running pod (a container still runs) bound to node N whose own placeholder job is
    not RUNNING on N: nothing in Slurm holds N for what the pod runs. Stricter than
    `pods_outliving_jobs` (a job still PENDING, or moved, counts) and with less grace."""
    jobs = {j.job_id: j for j in s.jobs}
    out = {}
    for pod in s.pods:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        node = spec.get("nodeName")
        if (
            not node
            or (pod.get("status") or {}).get("phase") != "Running"
            or podcontrol.containers_ended(pod)
        ):
            continue
        key = f"{meta['namespace']}/{meta['name']}"
        job_id = podcontrol.job_id_of(pod)
        job = jobs.get(job_id) if job_id is not None else None
        if job_id is None:
            why = "has no placeholder job"
        elif job is None:
            why = f"its job {job_id} is unknown to Slurm"
        elif not job.is_running:
            why = f"its job {job_id} is {'+'.join(job.state)}"
        elif node not in expand_hostlist(job.nodes):
            why = f"its job {job_id} runs on {job.nodes}"
        else:
            continue
        out[key] = f"pod {key} Running on {node}; {why}"
    return out


def jobs_cancelled_under_their_pods(s: Snapshot) -> dict[str, str]:
    """A job CANCELLED by someone other than its own pod's end: a batch job (it has no pod;
    nothing of ours may cancel it), or a placeholder job cancelled while a pod it names is
    still bound to it and running (the bridge cancels a pod's job once that pod ended or was
    deleted, never under it; a cancel from another pod's action shows so)."""
    by_uid = {str(p["metadata"]["uid"]): p for p in s.pods}
    out = {}
    placeholders = {job.job_id: comment for job, comment in s.placeholders()}
    for job in s.jobs:
        if "CANCELLED" not in job.state:
            continue
        comment = placeholders.get(job.job_id)
        if comment is None:
            if job.name.startswith(JOB_PREFIX):
                out[f"job {job.job_id}"] = f"batch job {job.job_id} ({job.name}) CANCELLED"
            continue
        for key, uid in comment.pods.items():
            pod = by_uid.get(uid)
            if (
                pod is None
                or podcontrol.job_id_of(pod) != job.job_id
                or pod["metadata"].get("deletionTimestamp")
                or podcontrol.has_ended(pod)
                or podcontrol.containers_ended(pod)
            ):
                continue
            out[f"job {job.job_id}"] = (
                f"placeholder job {job.job_id} CANCELLED while its pod {key} is "
                f"{(pod.get('status') or {}).get('phase')} on "
                f"{(pod.get('spec') or {}).get('nodeName') or '-'}"
            )
    return out


@dataclass(frozen=True)
class Invariant:
    name: str
    grace_s: float
    breaches: Callable[[Snapshot], dict[str, str]]  # breach key -> evidence
    # A breach that began soon after a kill -9 of slurmctld may be Slurm's: it came back from
    # state saved before an allocation the bridge had read and bound a pod on. The bridge
    # must repair it (delete the pod) within this long.
    grace_after_crash_s: float = 0.0


INVARIANTS = (
    Invariant("duplicate placeholder jobs", 60, duplicate_jobs),
    Invariant("orphaned placeholder jobs", 90, orphaned_jobs),
    Invariant("pods bound where Slurm did not allocate", 0, misbound_pods, 30),
    Invariant("pods running without a live job", 90, pods_outliving_jobs),
    Invariant("pods running without their own allocation", 30, pods_without_allocation, 30),
    # A snapshot lists pods before jobs: a pod that ended in between has its job cancelled
    # by the bridge before the job listing; the next snapshot shows the pod ended.
    Invariant("jobs cancelled but not by their own pod", 15, jobs_cancelled_under_their_pods),
)
CRASH_WINDOW_S = 30.0  # a breach first seen this soon after a slurmctld kill -9 is "after" it


@dataclass
class Breach:
    invariant: str
    key: str
    first_seen: float
    last_seen: float
    evidence: str


class InvariantWatch:
    """Follows each invariant over the snapshots; a breach is recorded once it outlasted the
    invariant's grace period (or at the final snapshot)."""

    def __init__(self, slurmctld_kills: list[float] | None = None) -> None:
        self.seen: dict[tuple[str, str], float] = {}
        self.breaches: dict[tuple[str, str], Breach] = {}
        self.samples = 0
        self.slurmctld_kills = slurmctld_kills if slurmctld_kills is not None else []

    def allowed_until(self, inv: Invariant, first: float, now: float) -> float:
        """Until when a breach first seen at `first` may last. After a slurmctld kill -9 the
        bridge gets `grace_after_crash_s` from the *last* kill so far (while slurmctld is down
        again nothing can be repaired: a second kill restarts the clock)."""
        until = first + inv.grace_s
        if not inv.grace_after_crash_s:
            return until
        if not any(0 <= first - t <= CRASH_WINDOW_S for t in self.slurmctld_kills):
            return until
        last = max(t for t in self.slurmctld_kills if t <= now)
        return max(until, last + inv.grace_after_crash_s)

    def sample(self, s: Snapshot, *, final: bool = False) -> None:
        self.samples += 1
        for inv in INVARIANTS:
            now = inv.breaches(s)
            for key, evidence in now.items():
                first = self.seen.setdefault((inv.name, key), s.at)
                if not final and s.at < self.allowed_until(inv, first, s.at):
                    continue
                breach = self.breaches.get((inv.name, key))
                if breach is None:
                    self.breaches[(inv.name, key)] = Breach(inv.name, key, first, s.at, evidence)
                else:
                    breach.last_seen = s.at
            for k in [k for k in self.seen if k[0] == inv.name and k[1] not in now]:
                del self.seen[k]
