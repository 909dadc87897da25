"""One reconcile of a NodeSet, as a list of named steps:

1. `ensure_children`  — headless Service, PodDisruptionBudget, ControllerRevision;
2. `replace_finished` — pods that ended (Succeeded/Failed) are deleted and later re-created;
3. `mirror_slurm`     — Slurm node state onto pods (conditions, `pod-protect` label) and the
                        pod's identity into the Slurm node's comment;
4. `sync_cordon`      — `pod-cordon` or a cordoned Kubernetes node drains the Slurm node;
                        lifting it undrains (only drains the operator made);
5. `scale`            — out: missing ordinals in slow-start batches; in: condemn victims
                        (scaling.py order), DRAIN, delete each pod only once drained;
6. `rolling_update`   — replace old-revision pods, draining each first, never more than
                        maxUnavailable unavailable (old and new counted together);
7. `write_status`.

Every deletion of a pod whose slurmd may run jobs goes through `remove_when_drained`, which
asks Slurm and fails closed. Steps 5-6 wait while expectations from a previous reconcile
are unmet, so a stale cache never creates or deletes twice.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from slinky.api.schema import ParseError, parse
from slinky.api.v1alpha1.nodeset import NodeSetSpec, RollingUpdate
from slinky.kube import conditions, events, objects, rest
from slinky.kube.controller import DONE, Result
from slinky.kube.expectations import Expectations
from slinky.kube.informer import Informer, MultiInformer
from slinky.kube.store import BY_OWNER_UID
from slinky.operator.clients import ClusterClients, Connection
from slinky.operator.nodeset import builder, scaling, slurmcontrol
from slinky.operator.nodeset.builder import (
    ANNOTATION_CONDEMNED,
    ANNOTATION_CORDON,
    ANNOTATION_NODE_CORDON_REASON,
    LABEL_PROTECT,
    LABEL_REVISION,
    REASON_PREFIX,
)
from slinky.operator.nodeset.podcontrol import PodControl
from slinky.operator.resources import NODESETS
from slinky.slurm.models import Node

log = logging.getLogger(__name__)

JSON = dict[str, Any]
CONDEMNED_SCALE_IN = "scale-in"
CONDEMNED_UPDATE = "update"
DRAIN_RECHECK_S = 15.0
SLURM_CONDITIONS = (
    "Idle",
    "Allocated",
    "Mixed",
    "Down",
    "Drain",
    "Completing",
    "NotResponding",
    "Fail",
)


def phase(pod: JSON) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def revision_of(pod: JSON) -> str:
    return str((pod["metadata"].get("labels") or {}).get(LABEL_REVISION, ""))


def condemned(pod: JSON) -> str | None:
    return scaling.annotation(pod, ANNOTATION_CONDEMNED)


def ready_since(pod: JSON) -> dt.datetime | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready" and c.get("status") == "True":
            ts = c.get("lastTransitionTime")
            if ts:
                return dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))
            return dt.datetime.now(dt.UTC)
    return None


def slurm_conditions(node: Node) -> dict[str, tuple[bool, str]]:
    """Pod condition type -> (status, message) for a Slurm node state."""
    s = node.state
    flags = {
        "Idle": s.base == "IDLE",
        "Allocated": s.base == "ALLOCATED",
        "Mixed": s.base == "MIXED",
        "Down": s.base == "DOWN",
        "Drain": s.is_drain,
        "Completing": s.has("COMPLETING"),
        "NotResponding": s.has("NOT_RESPONDING"),
        "Fail": s.has("FAIL"),
    }
    out = {}
    for name in SLURM_CONDITIONS:
        on = flags[name]
        message = node.reason if on and name in ("Down", "Drain", "Fail") else ""
        out[f"SlurmNodeState{name}"] = (on, message)
    return out


def max_unavailable(ru: RollingUpdate | None, replicas: int) -> int:
    raw = 1 if ru is None or ru.max_unavailable is None else ru.max_unavailable
    value = cast(int | str, raw)
    if isinstance(value, str):
        pct = int(value.rstrip("%"))
        return max(1, math.floor(replicas * pct / 100))
    return max(1, int(value))


@dataclass
class View:
    """What one reconcile knows about a NodeSet."""

    obj: JSON
    spec: NodeSetSpec
    key: str
    exp_key: str
    revision: str
    conn: Connection | None
    active: list[JSON]
    terminating: list[JSON]

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    def ordinal(self, pod: JSON) -> int:
        o = builder.ordinal_of(self.name, pod["metadata"]["name"])
        return o if o is not None else 1 << 30

    def slurm_node(self, pod: JSON) -> Node | None:
        return slurmcontrol.cached_node(self.conn, pod["metadata"]["name"])


class NodeSetSync:
    def __init__(
        self,
        kube: rest.Kube,
        *,
        nodesets: MultiInformer,
        pods: MultiInformer,
        nodes: Informer,
        revisions: MultiInformer,
        clients: ClusterClients,
        recorder: events.EventRecorder,
        expectations: Expectations,
    ) -> None:
        self.kube = kube
        self.nodesets = nodesets
        self.pods = pods
        self.nodes = nodes
        self.revisions = revisions
        self.clients = clients
        self.recorder = recorder
        self.expectations = expectations
        self.podcontrol = PodControl(kube, expectations)
        self._children_done: set[tuple[str, str]] = set()

    # ------------------------------------------------------------ entry

    async def reconcile(self, key: str) -> Result:
        obj = self.nodesets.get(key)
        if obj is None or obj["metadata"].get("deletionTimestamp"):
            return DONE  # owned pods go by garbage collection; each preStop removes its node
        meta = obj["metadata"]
        try:
            spec = parse(NodeSetSpec, obj.get("spec"), "spec")
        except ParseError as e:
            await self.write_condition_only(obj, "InvalidSpec", str(e))
            return DONE
        owned = self.pods.by_index(BY_OWNER_UID, meta["uid"])
        view = View(
            obj=obj,
            spec=spec,
            key=key,
            exp_key=f"{key}/{meta['uid']}",
            revision=builder.revision_hash(spec.template),
            conn=self.clients.get(f"{meta['namespace']}/{spec.cluster_name}"),
            active=[p for p in owned if not p["metadata"].get("deletionTimestamp")],
            terminating=[p for p in owned if p["metadata"].get("deletionTimestamp")],
        )
        await self.ensure_children(view)
        requeue: list[float] = []
        if self.expectations.satisfied(view.exp_key):
            await self.replace_finished(view)
            if self.slurm_usable(view):
                await self.mirror_slurm(view)
                await self.sync_cordon(view)
            requeue += await self.scale(view)
            requeue += await self.rolling_update(view)
        else:
            requeue.append(5.0)  # backstop: observations normally arrive first
        requeue += await self.write_status(view)
        return Result(requeue_after=min(requeue)) if requeue else DONE

    def slurm_usable(self, view: View) -> bool:
        return view.conn is not None and view.conn.informer.has_synced

    # ------------------------------------------------------------ 1. children

    async def ensure_children(self, view: View) -> None:
        """Service, PDB and the ControllerRevision of the current template (once each)."""
        uid = view.obj["metadata"]["uid"]
        generation = int(view.obj["metadata"].get("generation", 1))
        children: list[tuple[str, rest.Resource, Callable[[], JSON]]] = [
            ("service", rest.SERVICES, lambda: builder.build_service(view.obj, view.spec)),
            ("pdb", rest.PDBS, lambda: builder.build_pdb(view.obj)),
            (
                f"rev-{view.revision}",
                rest.CONTROLLER_REVISIONS,
                lambda: builder.build_revision(view.obj, view.spec, view.revision, generation),
            ),
        ]
        for kind, res, build in children:
            if (uid, kind) in self._children_done:
                continue
            await self.podcontrol.create_if_absent(res, build())
            self._children_done.add((uid, kind))
        await self.prune_revisions(view)

    async def prune_revisions(self, view: View) -> None:
        """Keep `revisionHistoryLimit` old ControllerRevisions besides those in use."""
        in_use = {view.revision} | {revision_of(p) for p in view.active + view.terminating}
        owned = self.revisions.by_index(BY_OWNER_UID, view.obj["metadata"]["uid"])
        old = [
            r
            for r in owned
            if (r["metadata"].get("labels") or {}).get(LABEL_REVISION) not in in_use
        ]
        old.sort(key=lambda r: int(r.get("revision") or 0), reverse=True)
        log.debug(
            "nodeset %s: revisions owned %d, in use %s, pruning %d",
            view.key,
            len(owned),
            sorted(in_use),
            max(0, len(old) - view.spec.revision_history_limit),
        )
        for rev in old[view.spec.revision_history_limit :]:
            await self.podcontrol.delete_object(rest.CONTROLLER_REVISIONS, rev)

    # ------------------------------------------------------------ 2. finished pods

    async def replace_finished(self, view: View) -> None:
        for pod in [p for p in view.active if phase(p) in ("Succeeded", "Failed")]:
            name = pod["metadata"]["name"]
            if await self.podcontrol.delete_pod(view.exp_key, pod):
                self.recorder.event(
                    view.obj,
                    events.WARNING,
                    "PodFinished",
                    f"pod {name} ended ({phase(pod)}); replacing it",
                )
            view.active.remove(pod)
            view.terminating.append(pod)

    # ------------------------------------------------------------ 3. Slurm -> pods

    async def mirror_slurm(self, view: View) -> None:
        assert view.conn is not None
        for pod in view.active:
            node = view.slurm_node(pod)
            if node is None:
                continue
            await self._mirror_conditions(pod, node)
            protect = "true" if node.state.is_busy else None
            if (pod["metadata"].get("labels") or {}).get(LABEL_PROTECT) != protect:
                await self.podcontrol.patch_metadata(pod, labels={LABEL_PROTECT: protect})
            if (pod.get("spec") or {}).get("nodeName"):
                await slurmcontrol.set_comment(view.conn, node.name, builder.slurm_comment(pod))

    async def _mirror_conditions(self, pod: JSON, node: Node) -> None:
        existing = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
        now = conditions.now_rfc3339()
        changed = []
        for ctype, (on, message) in slurm_conditions(node).items():
            status = "True" if on else "False"
            old = existing.get(ctype)
            if old and old.get("status") == status and (old.get("message") or "") == message:
                continue
            ltt = old["lastTransitionTime"] if old and old.get("status") == status else now
            changed.append(
                {
                    "type": ctype,
                    "status": status,
                    "lastTransitionTime": ltt,
                    "reason": f"SlurmNode{ctype.removeprefix('SlurmNodeState')}",
                    "message": message,
                }
            )
        if changed:
            await self.podcontrol.patch_conditions(pod, changed)

    # ------------------------------------------------------------ 4. cordons -> Slurm

    def cordon_reason(self, pod: JSON) -> str | None:
        """The drain reason a cordon asks for, or None."""
        if scaling.annotation(pod, ANNOTATION_CORDON) == "true":
            return slurmcontrol.REASON_POD_CORDON
        node_name = (pod.get("spec") or {}).get("nodeName")
        node = self.nodes.store.get(node_name) if node_name else None
        if node and (node.get("spec") or {}).get("unschedulable"):
            why = (node["metadata"].get("annotations") or {}).get(ANNOTATION_NODE_CORDON_REASON)
            return f"{REASON_PREFIX}{why or f'Kubernetes node {node_name} cordoned'}"
        return None

    async def sync_cordon(self, view: View) -> None:
        assert view.conn is not None
        for pod in view.active:
            node = view.slurm_node(pod)
            if node is None:
                continue
            name = node.name
            reason = self.cordon_reason(pod)
            if reason and not node.state.is_drain:
                if await slurmcontrol.drain(view.conn, name, reason):
                    self.recorder.event(
                        view.obj, events.NORMAL, "Cordoned", f"Slurm node {name} drained: {reason}"
                    )
            elif (
                not reason
                and condemned(pod) is None
                and node.state.is_drain
                and slurmcontrol.is_operator_reason(node.reason)
                and await slurmcontrol.undrain(view.conn, name)
            ):
                self.recorder.event(
                    view.obj,
                    events.NORMAL,
                    "Undrained",
                    f"Slurm node {name} undrained (was: {node.reason})",
                )

    # ------------------------------------------------------------ 5. scale

    async def scale(self, view: View) -> list[float]:
        want = view.spec.replicas
        excess = len(view.active) - want
        condemned_scale_in = [p for p in view.active if condemned(p) == CONDEMNED_SCALE_IN]
        if excess <= 0:
            for pod in condemned_scale_in:
                await self.keep(view, pod)
            if excess < 0:
                return await self.scale_out(view, -excess)
            return []
        candidates = [
            scaling.Candidate(p, view.ordinal(p), view.slurm_node(p))
            for p in view.active
            if condemned(p) != CONDEMNED_UPDATE
        ]
        chosen = scaling.victims(candidates, excess)
        chosen_names = {c.pod["metadata"]["name"] for c in chosen}
        for pod in condemned_scale_in:
            if pod["metadata"]["name"] not in chosen_names:
                await self.keep(view, pod)
        requeue = []
        for c in chosen:
            if await self.remove_when_drained(
                view, c.pod, CONDEMNED_SCALE_IN, slurmcontrol.REASON_SCALE_IN
            ):
                requeue.append(DRAIN_RECHECK_S)
        return requeue

    async def scale_out(self, view: View, needed: int) -> list[float]:
        held_active = {view.ordinal(p) for p in view.active}
        held_terminating = {view.ordinal(p) for p in view.terminating}
        ordinals: list[int] = []
        waiting = False
        o = 0
        while needed > 0:
            if o in held_active:
                pass
            elif o in held_terminating:
                # Its old pod is still terminating; the name comes back when it is gone.
                waiting = True
                needed -= 1
            else:
                ordinals.append(o)
                needed -= 1
            o += 1
        conf_server = view.conn.controller_addr if view.conn else None
        created = 0
        for size in scaling.slow_start_batches(len(ordinals)):
            batch, ordinals = ordinals[:size], ordinals[size:]
            for ordinal in batch:
                for pvc in builder.build_pvcs(view.obj, view.spec, ordinal):
                    await self.podcontrol.create_if_absent(rest.PVCS, pvc)
            pods = [
                builder.build_pod(
                    view.obj, view.spec, ordinal, revision=view.revision, conf_server=conf_server
                )
                for ordinal in batch
            ]
            for pod in pods:
                if await self.podcontrol.create_pod(view.exp_key, pod):
                    created += 1
                    self.recorder.event(
                        view.obj, events.NORMAL, "Created", f"created pod {pod['metadata']['name']}"
                    )
        if created:
            log.info("nodeset %s: created %d pods", view.key, created)
        return [2.0] if waiting else []

    async def keep(self, view: View, pod: JSON) -> None:
        """A condemned pod is wanted again: undrain (unless cordoned) and un-condemn."""
        name = pod["metadata"]["name"]
        await self.podcontrol.patch_metadata(pod, annotations={ANNOTATION_CONDEMNED: None})
        if (
            view.conn is not None
            and self.cordon_reason(pod) is None
            and await slurmcontrol.undrain(view.conn, name)
        ):
            self.recorder.event(
                view.obj,
                events.NORMAL,
                "Undrained",
                f"Slurm node {name} kept and undrained: replicas went up",
            )

    async def remove_when_drained(self, view: View, pod: JSON, why: str, reason: str) -> bool:
        """Condemn, drain, and delete once drained. Returns True while still waiting."""
        name = pod["metadata"]["name"]
        if condemned(pod) != why:
            await self.podcontrol.patch_metadata(pod, annotations={ANNOTATION_CONDEMNED: why})
        scheduled = bool((pod.get("spec") or {}).get("nodeName"))
        if scheduled:  # an unscheduled pod never ran a slurmd: nothing to drain
            if view.conn is None:
                return True  # cannot ask Slurm: keep the pod (fail closed)
            if await slurmcontrol.drain(view.conn, name, reason):
                self.recorder.event(
                    view.obj, events.NORMAL, "Draining", f"draining Slurm node {name} ({reason})"
                )
            if not await slurmcontrol.is_drained(view.conn, name):
                return True
        if await self.podcontrol.delete_pod(view.exp_key, pod):
            because = "Slurm node drained" if scheduled else "never scheduled"
            self.recorder.event(
                view.obj, events.NORMAL, "Deleted", f"deleted pod {name}: {because} ({why})"
            )
            log.info("nodeset %s: deleted pod %s (%s, %s)", view.key, name, because, why)
        if why == CONDEMNED_SCALE_IN:
            await self.delete_scaled_pvcs(view, name)
        view.active.remove(pod)
        view.terminating.append(pod)
        return False

    async def delete_scaled_pvcs(self, view: View, pod_name: str) -> None:
        """persistentVolumeClaimRetentionPolicy.whenScaled: Delete."""
        if view.spec.persistent_volume_claim_retention_policy.when_scaled != "Delete":
            return
        for claim in view.spec.volume_claim_templates or []:
            cname = (claim.get("metadata") or {}).get("name")
            if cname:
                pvc = {
                    "metadata": {
                        "name": f"{cname}-{pod_name}",
                        "namespace": view.obj["metadata"]["namespace"],
                    }
                }
                await self.podcontrol.delete_object(rest.PVCS, pvc)

    # ------------------------------------------------------------ 6. rolling update

    def available(self, view: View, pod: JSON, now: dt.datetime) -> bool:
        since = ready_since(pod)
        if since is None or condemned(pod) is not None:
            return False
        return (now - since).total_seconds() >= view.spec.min_ready_seconds

    async def rolling_update(self, view: View) -> list[float]:
        strategy = view.spec.update_strategy
        if strategy.type != "RollingUpdate" or len(view.active) > view.spec.replicas:
            return []
        ru = strategy.rolling_update
        partition = ru.partition if ru else 0
        now = dt.datetime.now(dt.UTC)
        requeue: list[float] = []
        for pod in [p for p in view.active if condemned(p) == CONDEMNED_UPDATE]:
            if await self.remove_when_drained(
                view, pod, CONDEMNED_UPDATE, slurmcontrol.REASON_UPDATE
            ):
                requeue.append(DRAIN_RECHECK_S)
        old = [
            p
            for p in view.active
            if revision_of(p) != view.revision
            and view.ordinal(p) >= partition
            and condemned(p) is None
        ]
        if not old:
            return requeue
        available = sum(1 for p in view.active if self.available(view, p, now))
        allowed = max_unavailable(ru, view.spec.replicas) - max(0, view.spec.replicas - available)
        order = scaling.victims(
            [scaling.Candidate(p, view.ordinal(p), view.slurm_node(p)) for p in old], len(old)
        )
        for c in order:
            counts = self.available(view, c.pod, now)
            if counts and allowed <= 0:
                break
            if counts:
                allowed -= 1
            if await self.remove_when_drained(
                view, c.pod, CONDEMNED_UPDATE, slurmcontrol.REASON_UPDATE
            ):
                requeue.append(DRAIN_RECHECK_S)
        return requeue

    # ------------------------------------------------------------ 7. status

    async def write_status(self, view: View) -> list[float]:
        now = dt.datetime.now(dt.UTC)
        active = view.active
        ready = [p for p in active if ready_since(p) is not None]
        available = [p for p in active if self.available(view, p, now)]
        updated = [p for p in active if revision_of(p) == view.revision]
        old_status = view.obj.get("status") or {}
        current = old_status.get("currentRevision") or view.revision
        if len(updated) == len(active) == view.spec.replicas:
            current = view.revision
        idle = alloc = down = drain = 0
        for p in active:
            node = view.slurm_node(p)
            if node is None:
                continue
            state = node.state
            idle += state.base == "IDLE" and not state.is_drain
            alloc += state.base in ("ALLOCATED", "MIXED")
            down += state.base == "DOWN"
            drain += state.is_drain
        if view.conn is None:
            conn_state = (
                False,
                "ClusterNotConnected",
                f"Cluster {view.spec.cluster_name} has no live Slurm connection; "
                "scale-in and updates wait (nothing is deleted without Slurm's word)",
            )
        elif view.conn.informer.stale:
            conn_state = (
                False,
                "SlurmStale",
                f"Slurm state is stale: {view.conn.informer.last_error}",
            )
        else:
            conn_state = (True, "Connected", f"Slurm nodes of Cluster {view.spec.cluster_name}")
        conds, _ = conditions.set_condition(
            old_status.get("conditions"),
            "SlurmConnected",
            conn_state[0],
            reason=conn_state[1],
            message=conn_state[2],
            observed_generation=view.obj["metadata"].get("generation"),
        )
        status: JSON = {
            "replicas": len(active),
            "readyReplicas": len(ready),
            "availableReplicas": len(available),
            "updatedReplicas": len(updated),
            "currentReplicas": sum(1 for p in active if revision_of(p) == current),
            "currentRevision": current,
            "updateRevision": view.revision,
            "collisionCount": 0,
            "observedGeneration": view.obj["metadata"].get("generation"),
            "selector": builder.selector_string(view.spec.selector),
            "slurmIdle": idle,
            "slurmAllocated": alloc,
            "slurmDown": down,
            "slurmDrain": drain,
            "conditions": conds,
        }
        if any(old_status.get(k) != v for k, v in status.items()):
            try:
                await objects.patch_status(self.kube, NODESETS, view.obj, status)
            except rest.ApiError as e:
                if not e.not_found:
                    raise
        pending_ready = [
            view.spec.min_ready_seconds - (now - s).total_seconds()
            for p in ready
            if (s := ready_since(p)) is not None and p not in available
        ]
        return [max(0.5, min(pending_ready))] if pending_ready else []

    async def write_condition_only(self, obj: JSON, reason: str, message: str) -> None:
        old = obj.get("status") or {}
        conds, changed = conditions.set_condition(
            old.get("conditions"),
            "SlurmConnected",
            False,
            reason=reason,
            message=message,
            observed_generation=obj["metadata"].get("generation"),
        )
        if changed:
            await objects.patch_status(self.kube, NODESETS, obj, {"conditions": conds})
            self.recorder.event(obj, events.WARNING, reason, message)
