"""The NodeSet's status: StatefulSet-style counts, Slurm state counts, and conditions.

- `SlurmConnected`: whether the Slurm view of the Cluster can be trusted (scale-in and
  updates wait while it cannot);
- `Deleting` (only while the NodeSet is being deleted): how many pods wait to be drained
  and for which jobs.

Written only when something changed; one pass over the pods.
"""

from __future__ import annotations

import datetime as dt

from slinky.kube import conditions, events, objects, rest
from slinky.operator.nodeset import builder, pods
from slinky.operator.nodeset.view import Context, View
from slinky.operator.resources import NODESETS
from slinky.types import JSON

CONNECTED = "SlurmConnected"
DELETING = "Deleting"
CREATABLE = "PodsCreatable"


def connection_condition(view: View) -> tuple[bool, str, str]:
    if view.conn is None:
        return (
            False,
            "ClusterNotConnected",
            f"Cluster {view.spec.cluster_name} has no live Slurm connection; "
            "scale-in and updates wait (nothing is deleted without Slurm's word)",
        )
    if not view.conn.informer.has_synced:
        return (False, "SlurmNotSynced", "waiting for the first list of Slurm nodes")
    if view.conn.informer.stale:
        return (False, "SlurmStale", f"Slurm state is stale: {view.conn.informer.last_error}")
    return (True, "Connected", f"Slurm nodes of Cluster {view.spec.cluster_name}")


async def write_status(
    ctx: Context, view: View, *, deleting_message: str | None = None
) -> list[float]:
    """Write the status; returns when to look again (a pod becoming available)."""
    now = dt.datetime.now(dt.UTC)
    old_status = view.obj.get("status") or {}
    n_ready = n_available = n_updated = 0
    idle = alloc = down = drain = 0
    pending_ready: list[float] = []
    current = old_status.get("currentRevision") or view.revision
    revisions: dict[str, int] = {}
    min_ready = view.spec.min_ready_seconds
    nodes = view.conn.informer.nodes if view.conn is not None else {}
    for p in view.active.values():
        f = pods.facts(p)
        if f.ready:
            n_ready += 1
            # update.available, inlined: this loop runs over every pod on every reconcile.
            if f.condemned is None:
                since = f.ready_at or now
                left = min_ready - (now - since).total_seconds()
                if left <= 0:
                    n_available += 1
                else:
                    pending_ready.append(left)
        revisions[f.revision] = revisions.get(f.revision, 0) + 1
        node = view.slurm_node(p) if nodes else None
        if node is not None:
            state = node.state
            idle += state.base == "IDLE" and not state.is_drain
            alloc += state.base in ("ALLOCATED", "MIXED")
            down += state.base == "DOWN"
            drain += state.is_drain
    n_updated = revisions.get(view.revision, 0)
    if n_updated == len(view.active) == view.spec.replicas:
        current = view.revision
    generation = view.obj["metadata"].get("generation")
    ok, reason, message = connection_condition(view)
    conds, _ = conditions.set_condition(
        old_status.get("conditions"),
        CONNECTED,
        ok,
        reason=reason,
        message=message,
        observed_generation=generation,
    )
    address = view.conf_server or "set in the template"
    creatable = view.conf_problem or ("ControllerAddressKnown", f"slurmd --conf-server: {address}")
    conds, _ = conditions.set_condition(
        conds,
        CREATABLE,
        view.conf_problem is None,
        reason=creatable[0],
        message=creatable[1],
        observed_generation=generation,
    )
    for type_, ok_, reason_, message_ in view.conditions:
        conds, _ = conditions.set_condition(
            conds, type_, ok_, reason=reason_, message=message_, observed_generation=generation
        )
    if deleting_message is not None:
        conds, _ = conditions.set_condition(
            conds,
            DELETING,
            True,
            reason="WaitingForJobs" if view.active else "PodsDeleted",
            message=deleting_message,
            observed_generation=generation,
        )
    status: JSON = {
        "replicas": len(view.active),
        "readyReplicas": n_ready,
        "availableReplicas": n_available,
        "updatedReplicas": n_updated,
        "currentReplicas": revisions.get(current, 0),
        "currentRevision": current,
        "updateRevision": view.revision,
        "collisionCount": 0,
        "observedGeneration": generation,
        "selector": builder.selector_string(view.spec.selector),
        "slurmIdle": idle,
        "slurmAllocated": alloc,
        "slurmDown": down,
        "slurmDrain": drain,
        "conditions": conds,
    }
    if any(old_status.get(k) != v for k, v in status.items()):
        try:
            await objects.patch_status(ctx.kube, NODESETS, view.obj, status)
        except rest.ApiError as e:
            if not e.not_found:
                raise
    return [max(0.5, min(pending_ready))] if pending_ready else []


async def write_condition_only(
    ctx: Context, obj: JSON, reason: str, message: str, type_: str = CONNECTED
) -> None:
    """A NodeSet the operator cannot act on (bad spec, no controller address)."""
    old = obj.get("status") or {}
    conds, changed = conditions.set_condition(
        old.get("conditions"),
        type_,
        False,
        reason=reason,
        message=message,
        observed_generation=obj["metadata"].get("generation"),
    )
    if changed:
        await objects.patch_status(ctx.kube, NODESETS, obj, {"conditions": conds})
        ctx.recorder.event(obj, events.WARNING, reason, message)
