"""The scale-in rule, top to bottom: which pods go, how they are drained, the fail-closed
question "is this Slurm node drained?", and the deletion.

1. Victims (`victims`): most disposable first — pods already condemned, for a scale-in or
   an update (so a scale-in never drains more nodes than it removes), then not yet
   scheduled, not ready, Slurm node IDLE before busy, lower `pod-deletion-cost`, earlier
   `pod-deadline`, cordoned, higher ordinal.
   Nothing is condemned while the Slurm view of the Cluster is not synced: the order depends
   on which nodes are busy.
2. Drain: the Slurm node is set DRAIN with a reason starting `slurm-operator: `.
3. Condemn: a pod that has to wait gets the `condemned` annotation saying why, so a restart
   of the operator resumes the same removal instead of choosing new victims, with
   `condemned-at` (when) and `drain-deadline`: when the last job on its node ends at the
   latest, by its time limit, read from Slurm once right after the drain (the pass's one
   job list; nothing new starts on a draining node). Dashboards and the stuck-draining alert
   read them; `slinky_nodeset_drain_duration_seconds` is observed at the deletion.
4. Drained? (`check_drained`): the cache only says when to ask; the authoritative
   `GET /node` is made only for a node the cache already shows drained or absent (one full
   `GET /nodes` instead when many pods go in one pass). Only a
   definite answer counts: DRAIN with no job ALLOCATED, MIXED or COMPLETING, or "no such node"
   (200 without the node, or Slurm's invalid-node error). Anything else — a bare HTTP 404,
   5xx, a refused token, a connection error, an informer that has not synced — is "not
   drained", and the pod stays.
5. Out of the partition (`leave_partition`, NodeSets with their own Slurm partition only):
   a pod's node is no longer written into the partition from its condemnation on; a drained
   one is taken out of it now if still there, and its Slurm node is deleted by the operator
   once it has been out for `partition.STATE_SAVE_S` (slurmctld must have saved the
   partition without it first, or a kill -9 then leaves state it cannot start from).
6. Delete: with the pod's UID as precondition, then (whenScaled: Delete) its PVCs.

The same path removes pods for a rolling update (`update.py`) and when the NodeSet itself is
deleted (`finalize`: every pod, reason `slurm-operator: nodeset deleted`, before the
finalizer goes).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import enum
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import Histogram

from slinky.kube import conditions, events, rest
from slinky.operator.clients import Connection
from slinky.operator.nodeset import partition, pods, slurmcontrol
from slinky.operator.nodeset.builder import (
    ANNOTATION_CONDEMNED,
    ANNOTATION_CONDEMNED_AT,
    ANNOTATION_CORDON,
    ANNOTATION_DEADLINE,
    ANNOTATION_DELETION_COST,
    ANNOTATION_DRAIN_DEADLINE,
)
from slinky.operator.nodeset.view import Context, View, belongs_to
from slinky.slurm import errors
from slinky.slurm.models import Node, expand_hostlist
from slinky.types import JSON

log = logging.getLogger(__name__)

T = TypeVar("T")

CONDEMNED_SCALE_IN = "scale-in"
CONDEMNED_UPDATE = "update"
CONDEMNED_DELETED = "nodeset deleted"
DRAIN_RECHECK_S = 15.0  # backstop; a Slurm event normally wakes the NodeSet first
FRESH_VIEW_S = 0.5  # backstop while waiting for a fast poll; its events normally come first
SLURM_CALLS_IN_FLIGHT = 16  # per reconcile: concurrent drains / drained checks
DRAIN_DURATION = Histogram(
    "slinky_nodeset_drain_duration_seconds",
    "From a NodeSet pod's condemnation (its Slurm node set to DRAIN) to its deletion once "
    "Slurm said drained; 0 for a node drained at the first check. reason: scale-in, "
    "update or nodeset deleted",
    ["namespace", "nodeset", "reason"],
    buckets=(1, 10, 60, 300, 900, 1800, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 3 * 86400),
)
LIST_INSTEAD_OF_GETS = 32  # above this many authoritative reads in one pass, list once
FAR_FUTURE = dt.datetime.max.replace(tzinfo=dt.UTC)


# ------------------------------------------------------------ 1. victims


def deletion_cost(pod: JSON) -> int:
    try:
        return int(pods.annotation(pod, ANNOTATION_DELETION_COST) or 0)
    except ValueError:
        return 0


def deadline(pod: JSON) -> dt.datetime:
    raw = pods.annotation(pod, ANNOTATION_DEADLINE)
    if not raw:
        return FAR_FUTURE
    try:
        parsed = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return FAR_FUTURE
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class Candidate:
    pod: JSON
    ordinal: int
    node: Node | None

    def sort_key(self) -> tuple[Any, ...]:
        pod = self.pod
        busy = self.node is not None and self.node.state.is_busy
        return (
            pods.condemned(pod) is None,  # condemned first
            pods.node_name(pod) is not None,
            pods.is_ready(pod),
            busy,
            deletion_cost(pod),
            deadline(pod),
            pods.annotation(pod, ANNOTATION_CORDON) != "true",
            -self.ordinal,
        )


def victims(candidates: list[Candidate], count: int) -> list[Candidate]:
    """The `count` pods to remove, most disposable first."""
    if count <= 0:
        return []
    return sorted(candidates, key=Candidate.sort_key)[:count]


def candidates(view: View, pod_list: Iterable[JSON]) -> list[Candidate]:
    return [Candidate(p, view.ordinal(p), view.slurm_node(p)) for p in pod_list]


def scale_in_victims(view: View, excess: int) -> list[JSON]:
    """The pods a scale-in by `excess` removes, most disposable first: pods an update is
    replacing among them (condemned already, their nodes drained or draining)."""
    return [c.pod for c in victims(candidates(view, view.active.values()), excess)]


# ------------------------------------------------------------ 4. drained?


class Drained(enum.Enum):
    """The answer to "may this pod go?". Only DRAINED and ABSENT say yes."""

    DRAINED = "drained"
    ABSENT = "no such Slurm node"
    BUSY = "jobs still run"
    NOT_DRAIN = "not drained"
    FOREIGN = "Slurm node belongs to another pod"
    UNKNOWN = "cannot ask Slurm"
    PARTITION = "its Slurm node leaves the NodeSet's partition first"

    @property
    def safe(self) -> bool:
        return self in (Drained.DRAINED, Drained.ABSENT)


Snapshot = dict[str, Node]


async def check_drained(
    conn: Connection | None, name: str, *, namespace: str, snapshot: Snapshot | None = None
) -> Drained:
    """Authoritative, fail-closed check made right before deleting pod `name`. `snapshot`:
    slurmctld's full node list fetched for this pass (one request instead of one per node
    when many pods go at once); without it the node is read with `GET /node/<name>`."""
    if conn is None or conn.informer.stale or not conn.informer.has_synced:
        return Drained.UNKNOWN
    cached = conn.informer.nodes.get(name)
    if cached is not None and not cached.state.is_drained:
        # The cache is enough to say "wait"; only a "yes" needs Slurm's word.
        return Drained.BUSY if cached.state.is_drain else Drained.NOT_DRAIN
    if snapshot is not None:
        listed = snapshot.get(name)
        if listed is None:
            return Drained.ABSENT
        node = listed
    else:
        try:
            node = await conn.client.get_node(name)
        except errors.SlurmNotFound:
            return Drained.ABSENT
        except errors.SlurmError as e:
            log.info("node %s: cannot check drain state (%s); treating as not drained", name, e)
            return Drained.UNKNOWN
    if not belongs_to(node, namespace, name):
        return Drained.FOREIGN
    if node.state.is_drained:
        return Drained.DRAINED
    return Drained.BUSY if node.state.is_drain else Drained.NOT_DRAIN


# ------------------------------------------------------------ 2-5. condemn, drain, delete


class JobEnds:
    """When the jobs on each Slurm node end at the latest (Slurm's `end_time` of a running
    job: its start plus its time limit), read at most once per removal step and only when
    a pod is condemned: one `GET /jobs` made after the drains (not the informer's cache,
    which may predate a job that started just before). None when Slurm cannot be read
    (the pod's deadline is then written by a later pass)."""

    def __init__(self, conn: Connection | None) -> None:
        self.conn = conn
        self._read: asyncio.Task[dict[str, int] | None] | None = None

    async def deadline(self, node: str, now: dt.datetime) -> dt.datetime | None:
        if self.conn is None:
            return None
        if self._read is None:
            self._read = asyncio.ensure_future(self._ends(self.conn))
        ends = await asyncio.shield(self._read)
        if ends is None:
            return None
        end = ends.get(node)
        return now if end is None else dt.datetime.fromtimestamp(end, dt.UTC)

    @staticmethod
    async def _ends(conn: Connection) -> dict[str, int] | None:
        try:
            jobs, _ = await conn.client.list_jobs()
        except errors.SlurmError as e:
            log.info("cannot list Slurm jobs for drain deadlines (%s); next pass", e)
            return None
        ends: dict[str, int] = {}
        for job in jobs or []:
            holds = not job.is_pending and (not job.is_finished or "COMPLETING" in job.state)
            if not holds or not job.end_time:
                continue
            for node in expand_hostlist(job.nodes):
                ends[node] = max(ends.get(node, 0), job.end_time)
        return ends


def condemnation(pod: JSON, why: str, deadline: dt.datetime | None) -> dict[str, str | None]:
    """The annotations that condemn `pod` (or bring it up to date): why, since when (kept
    from the first condemnation), and the drain deadline once known."""
    out: dict[str, str | None] = {}
    if pods.condemned(pod) != why:
        out[ANNOTATION_CONDEMNED] = why
    if pods.annotation(pod, ANNOTATION_CONDEMNED_AT) is None:
        out[ANNOTATION_CONDEMNED_AT] = conditions.now_rfc3339()
    if deadline is not None and pods.annotation(pod, ANNOTATION_DRAIN_DEADLINE) is None:
        out[ANNOTATION_DRAIN_DEADLINE] = deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
    return out


def drain_seconds(pod: JSON, now: dt.datetime) -> float:
    """How long the pod has been condemned; 0 when it never was (drained at once)."""
    since = pods.annotation(pod, ANNOTATION_CONDEMNED_AT)
    if since is None:
        return 0.0
    try:
        return max(0.0, (now - pods.parse_time(since)).total_seconds())
    except ValueError:
        return 0.0


async def removal_verdict(
    ctx: Context, view: View, pod: JSON, reason: str, snapshot: Snapshot | None
) -> Drained:
    """Drain the pod's Slurm node and say whether the pod may go (an unscheduled pod never
    ran a slurmd: nothing to drain)."""
    if pods.node_name(pod) is None:
        return Drained.ABSENT
    return await drain_and_check(ctx, view, pod, reason, snapshot)


async def leave_partition(
    ctx: Context, view: View, pod_list: list[JSON], verdicts: list[Drained]
) -> list[Drained]:
    """Drained pods of a NodeSet with its own partition: their nodes leave the partition,
    and once out of it long enough (`partition.STATE_SAVE_S`) the operator deletes each
    Slurm node before its pod (the pod's preStop then finds none). Until then the pod
    waits (`PARTITION`), its NodeSet looked at again when the wait ends."""
    names = {pods.name(p) for p, v in zip(pod_list, verdicts, strict=True) if v is Drained.DRAINED}
    partitions = ctx.partitions
    if partitions is None or not names or view.conn is None:
        return verdicts
    owns = partitions.claimed(view) is not None
    free_in = await partitions.release(view, names)
    out = list(verdicts)
    deletes: dict[int, Callable[[], Awaitable[Drained]]] = {}
    for i, pod in enumerate(pod_list):
        name = pods.name(pod)
        if name not in names:
            continue
        wait = free_in.get(name)
        if wait is None or wait > 0:
            view.recheck.append(partition.RETRY_S if wait is None else wait)
            out[i] = Drained.PARTITION
        elif owns:
            deletes[i] = functools.partial(delete_slurm_node, ctx, view, name)
    deleted = await bounded(list(deletes.values()), SLURM_CALLS_IN_FLIGHT)
    for i, verdict in zip(deletes, deleted, strict=True):
        out[i] = verdict
    return out


async def delete_slurm_node(ctx: Context, view: View, name: str) -> Drained:
    """Delete a drained node's Slurm record (Slurm refuses while a job holds it)."""
    assert view.conn is not None
    try:
        await view.conn.client.delete_node(name)
    except errors.SlurmNotFound:
        return Drained.ABSENT
    except errors.SlurmError as e:
        log.info("nodeset %s: Slurm node %s not deleted (%s); its pod waits", view.key, name, e)
        return Drained.BUSY if isinstance(e, errors.SlurmNodeBusy) else Drained.UNKNOWN
    view.conn.informer.poke()
    ctx.recorder.event(
        view.obj,
        events.NORMAL,
        "SlurmNodeDeleted",
        f"Slurm node {name} deleted (drained, and out of the NodeSet's partition); its pod "
        "goes next",
        action="Delete",
    )
    return Drained.DRAINED


async def settle(
    ctx: Context,
    view: View,
    pod: JSON,
    verdict: Drained,
    *,
    why: str,
    scaled: bool,
    job_ends: JobEnds,
) -> Drained:
    """Delete the pod when `verdict` is safe; otherwise condemn it (a restarted operator
    resumes this removal instead of choosing anew). `scaled`: the pod goes because replicas
    went down (its PVCs follow `whenScaled`)."""
    name = pods.name(pod)
    if not verdict.safe:
        deadline = None
        # Only after Slurm answered about this node (not while it cannot be asked: the
        # deadline waits for a pass where it can, and costs that pass nothing).
        answered = verdict in (Drained.BUSY, Drained.NOT_DRAIN)
        if answered and pods.annotation(pod, ANNOTATION_DRAIN_DEADLINE) is None:
            deadline = await job_ends.deadline(name, dt.datetime.now(dt.UTC))
        changes = condemnation(pod, why, deadline)
        if changes:
            await ctx.podcontrol.patch_metadata(pod, annotations=changes)
        return verdict
    scheduled = pods.node_name(pod) is not None
    if await ctx.podcontrol.delete_pod(view.exp_key, pod):
        because = "Slurm node drained" if scheduled else "never scheduled"
        ctx.recorder.event(
            view.obj, events.NORMAL, "Deleted", f"deleted pod {name}: {because} ({why})"
        )
        log.info("nodeset %s: deleted pod %s (%s, %s)", view.key, name, because, why)
        if scheduled:
            DRAIN_DURATION.labels(view.namespace, view.name, why).observe(
                drain_seconds(pod, dt.datetime.now(dt.UTC))
            )
    if scaled:
        await delete_scaled_pvcs(ctx, view, name)
    view.moved(pod)
    return verdict


async def drain_and_check(
    ctx: Context, view: View, pod: JSON, reason: str, snapshot: Snapshot | None
) -> Drained:
    name = pods.name(pod)
    if not view.slurm_ready or view.conn is None:
        return Drained.UNKNOWN  # cannot ask Slurm: keep the pod (fail closed)
    if view.foreign(pod):
        return Drained.FOREIGN
    if await slurmcontrol.drain(view.conn, name, reason, namespace=view.namespace):
        ctx.recorder.event(
            view.obj, events.NORMAL, "Draining", f"draining Slurm node {name} ({reason})"
        )
    return await check_drained(view.conn, name, namespace=view.namespace, snapshot=snapshot)


async def snapshot_for(view: View, pod_list: list[JSON]) -> Snapshot | None:
    """One full node list when more than LIST_INSTEAD_OF_GETS pods need Slurm's word
    (their cache shows the node drained or absent); None (per-node reads) otherwise or when
    the list fails."""
    if view.conn is None or not view.slurm_ready:
        return None
    nodes = view.conn.informer.nodes
    asking = 0
    for pod in pod_list:
        cached = nodes.get(pods.name(pod))
        asking += pods.node_name(pod) is not None and (cached is None or cached.state.is_drained)
    if asking <= LIST_INSTEAD_OF_GETS:
        return None
    try:
        listed, _ = await view.conn.client.list_nodes()
    except errors.SlurmError as e:
        log.info("nodeset %s: cannot list Slurm nodes (%s); asking node by node", view.key, e)
        return None
    return {n.name: n for n in listed or []}


async def remove_all(
    ctx: Context,
    view: View,
    pod_list: list[JSON],
    why: str,
    reason: str,
    *,
    scaled: bool = False,
) -> dict[str, Drained]:
    """Remove pods through the drain-before-delete path, concurrently and bounded: drain and
    check each (`removal_verdict`), take the drained ones out of the NodeSet's partition
    (`leave_partition`), then delete those that may go and condemn the others (`settle`).
    Returns the verdicts of the pods that still wait, by pod name. `scaled`: the pods go
    because replicas went down (the scale-in step)."""
    snapshot = await snapshot_for(view, pod_list)
    for pod in pod_list:
        if pods.condemned(pod) != why:
            view.acted_on.add(pods.name(pod))  # its cached dict predates what this pass writes
    view.leaving |= {pods.name(p) for p in pod_list}
    verdicts = await bounded(
        [functools.partial(removal_verdict, ctx, view, p, reason, snapshot) for p in pod_list],
        SLURM_CALLS_IN_FLIGHT,
    )
    verdicts = await leave_partition(ctx, view, pod_list, verdicts)
    job_ends = JobEnds(view.conn)
    results = await bounded(
        [
            functools.partial(settle, ctx, view, p, v, why=why, scaled=scaled, job_ends=job_ends)
            for p, v in zip(pod_list, verdicts, strict=True)
        ],
        SLURM_CALLS_IN_FLIGHT,
    )
    waiting = {pods.name(p): v for p, v in zip(pod_list, results, strict=True) if not v.safe}
    if waiting:
        view.waits.append(f"{len(waiting)} pods wait to be drained ({why})")
    return waiting


async def bounded(calls: list[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Run the calls concurrently, at most `limit` at a time, results in order."""
    gate = asyncio.Semaphore(limit)

    async def one(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    return list(await asyncio.gather(*(one(c) for c in calls)))


async def keep(ctx: Context, view: View, pod: JSON, *, cordon_reason: str | None) -> None:
    """A condemned pod is wanted again: undrain (unless cordoned) and un-condemn."""
    name = pods.name(pod)
    view.acted_on.add(name)
    await ctx.podcontrol.patch_metadata(
        pod,
        annotations={
            ANNOTATION_CONDEMNED: None,
            ANNOTATION_CONDEMNED_AT: None,
            ANNOTATION_DRAIN_DEADLINE: None,
        },
    )
    if (
        view.conn is not None
        and cordon_reason is None
        and await slurmcontrol.undrain(view.conn, name, namespace=view.namespace)
    ):
        ctx.recorder.event(
            view.obj,
            events.NORMAL,
            "Undrained",
            f"Slurm node {name} kept and undrained: replicas went up",
        )


async def delete_scaled_pvcs(ctx: Context, view: View, pod_name: str) -> None:
    """persistentVolumeClaimRetentionPolicy.whenScaled: Delete."""
    if view.spec.persistent_volume_claim_retention_policy.when_scaled != "Delete":
        return
    for claim in view.spec.volume_claim_templates or []:
        cname = (claim.get("metadata") or {}).get("name")
        if cname:
            pvc = {"metadata": {"name": f"{cname}-{pod_name}", "namespace": view.namespace}}
            await ctx.podcontrol.delete_object(rest.PVCS, pvc)


# ------------------------------------------------------------ the step


async def scale_in(
    ctx: Context, view: View, excess: int, cordon_reason: Callable[[JSON], str | None]
) -> list[float]:
    """Remove `excess` pods (or keep condemned ones when replicas went back up)."""
    condemned_now = [p for p in view.active.values() if pods.condemned(p) == CONDEMNED_SCALE_IN]
    if excess <= 0:
        for pod in condemned_now:
            await keep(ctx, view, pod, cordon_reason=cordon_reason(pod))
        return []
    if not view.slurm_ready:
        # The order depends on which nodes are busy: do not choose on a guess.
        unscheduled = [p for p in view.active.values() if pods.node_name(p) is None]
        chosen_pods = victims(candidates(view, unscheduled), excess)
        await remove_all(
            ctx, view, [c.pod for c in chosen_pods], CONDEMNED_SCALE_IN, "", scaled=True
        )
        view.waits.append("scale-in waits for the Slurm view of the Cluster")
        return [DRAIN_RECHECK_S]
    if not view.slurm_fresh("scale-in"):
        return [FRESH_VIEW_S]  # which nodes are busy, as of now: wait for one fast poll
    chosen = scale_in_victims(view, excess)
    chosen_names = {pods.name(p) for p in chosen}
    for pod in condemned_now:
        if pods.name(pod) not in chosen_names:
            await keep(ctx, view, pod, cordon_reason=cordon_reason(pod))
    # Pods an update was replacing keep its condemnation: should replicas go back up before
    # they are gone, the update carries on with them (nothing undrained and drained again).
    replacing = [p for p in chosen if pods.condemned(p) == CONDEMNED_UPDATE]
    others = [p for p in chosen if pods.condemned(p) != CONDEMNED_UPDATE]
    waiting = await remove_all(
        ctx, view, others, CONDEMNED_SCALE_IN, slurmcontrol.REASON_SCALE_IN, scaled=True
    )
    waiting |= await remove_all(
        ctx, view, replacing, CONDEMNED_UPDATE, slurmcontrol.REASON_UPDATE, scaled=True
    )
    return [DRAIN_RECHECK_S] if waiting else []


# ------------------------------------------------------------ NodeSet deletion


async def finalize(ctx: Context, view: View) -> dict[str, Drained]:
    """The NodeSet is being deleted: drain every node and delete each pod once drained.
    Returns the pods that still wait (empty: the finalizer may go)."""
    return await remove_all(
        ctx, view, list(view.active.values()), CONDEMNED_DELETED, slurmcontrol.REASON_DELETED
    )
