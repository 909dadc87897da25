"""A waiting pod's excluded nodes after submission: managed nodes change while its job waits.

`excluded_nodes` is computed when the job is submitted, so a managed node added (or
relabelled, or tainted) later that the pod must not land on would not be in it:

1. while the job is pending, its `excluded_nodes` follow the nodes: a change of a managed
   node brings back the pods that wait on a job, and a job whose list differs from what the
   pod's constraints say now is updated (one request, and only for jobs of ours that wait:
   the scheduler's job -> pod index);
2. that update can lose the race against Slurm allocating the new node, so the pod's
   constraints are checked again against the allocated node before binding: a pod is never
   bound to a node they reject. Its job ran nothing (no kubelet started the pod), so it is
   replaced: a new job is submitted, the pod is relabelled with it and annotated with the
   job it replaces, and only then is the old one cancelled. Each step is safe to repeat
   after a crash: a replacement submitted but not on the pod yet is found in Slurm by its
   admin_comment before another is made (one read of the job list, only on this rare path),
   and the job named by the annotation is cancelled on the pod's next pass.

Pure decisions here; the requests are the scheduler's (`SchedulerSync`).
"""

from __future__ import annotations

from typing import Any

from slinky.bridge import constraints
from slinky.slurm.models import Job, expand_hostlist
from slinky.types import JSON


def excluded_of(job: Job) -> set[str]:
    """The nodes a job excludes, as Slurm reports them (a host list or a list of names)."""
    raw = job.raw.get("excluded_nodes")
    text = ",".join(str(x) for x in raw) if isinstance(raw, list) else str(raw or "")
    return {n for n in expand_hostlist(text) if n and n != "(null)"}


def stale_exclusion(job: Job, where: constraints.Placement) -> list[str] | None:
    """The list a pending job's `excluded_nodes` should become, or None when it is right
    (or when no node fits at all: excluding every node would only get the job refused;
    the check at binding keeps the pod off a node it must not use)."""
    if not job.is_pending or where.impossible:
        return None
    want = sorted(where.excluded)
    return None if set(want) == excluded_of(job) else want


def allows(pod: JSON, node: JSON, *, scheduler_name: str) -> bool:
    """Whether the pod's constraints take this Kubernetes node now."""
    return constraints.selects(pod, node) and not constraints.untolerated(
        pod, node, scheduler_name=scheduler_name
    )


def placement_relevant(old: JSON | None, new: JSON) -> bool:
    """A Node change that may change which pods it takes: added, labels or taints."""
    if old is None:
        return True

    def seen(node: JSON) -> tuple[Any, Any]:
        return (node.get("metadata") or {}).get("labels"), (node.get("spec") or {}).get("taints")

    return seen(old) != seen(new)
