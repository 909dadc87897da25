"""One reconcile of a NodeSet, as a list of named steps:

1. `ensure_children`  — headless Service, PodDisruptionBudget, ControllerRevision (re-created
                        when deleted; the Service follows `serviceName`);
2. `replace_finished` — pods that ended (Succeeded/Failed) are deleted and later re-created;
   `replace_unregistered` — so are pods whose slurmd registration slurmctld lost;
   `replace_unreachable` — and Ready pods whose idle Slurm node has not responded for long;
   `forget_departed` — Slurm nodes that outlived their pod (its preStop could not delete
                        them) are deleted;
   `check_autoscaler` — the `Autoscaling` condition (an HPA that cannot scale from 0);
3. `scalein.scale_in` or `scale_out` — remove victims through the drain-before-delete path
                        (scalein.py), or create missing ordinals in slow-start batches;
4. `update.rolling_update` — the rolling update rule (update.py);
5. `mirror.mirror_slurm` / `mirror.sync_cordon` — state both ways for the pods that stay
                        (mirror.py);
6. `partition.Partitions.sync` — the NodeSet's Slurm partition (partition.py);
7. `status.write_status` — status.py.

A NodeSet being deleted runs `finalize` instead: the jobs queued in its partition run first
(`partition.Partitions.queued_jobs`), then every pod leaves through the same path
(`scalein.finalize`), still mirroring Slurm onto the pods that wait, and the finalizer goes
only when none is left and the NodeSet's partition is deleted.

Pods are built from the Cluster object's `spec.controller` (the `--conf-server` of slurmd),
never from whether a Slurm connection happens to be up; that address is part of the pod
revision, so changing it rolls the pods. Steps 2-5 wait while expectations from a previous
reconcile are unmet, so a stale cache never creates or deletes twice.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Mapping

from slinky.api.schema import ParseError, parse
from slinky.api.v1alpha1.cluster import ClusterSpec
from slinky.api.v1alpha1.nodeset import NodeSetSpec
from slinky.background import Backoff
from slinky.kube import conditions, events, objects, rest
from slinky.kube.controller import DONE, Result
from slinky.kube.expectations import Expectations
from slinky.kube.informer import Informer, MultiInformer
from slinky.kube.nodehealth import NodeHealth
from slinky.kube.store import BY_OWNER_UID
from slinky.operator.clients import ClusterClients, Connection
from slinky.operator.nodeset import (
    builder,
    mirror,
    partition,
    placement,
    pods,
    scalein,
    status,
    update,
)
from slinky.operator.nodeset.podcontrol import PodControl
from slinky.operator.nodeset.view import Context, Placement, View, belongs_to
from slinky.operator.resources import FINALIZER, NODESETS
from slinky.slurm import errors
from slinky.slurm.models import expand_hostlist
from slinky.types import JSON

log = logging.getLogger(__name__)

ANNOTATION_SKIP_DRAIN = partition.ANNOTATION_SKIP_DRAIN
WAITING_FOR_TERMINATING_S = 2.0
REGISTERED = "SlurmNodesRegistered"
AUTOSCALING = "Autoscaling"
RESPONDING = "SlurmNodesResponding"
BY_HPA_TARGET = "hpa-target"


def cleared(view: View, ctype: str, reason: str, message: str) -> None:
    """A problem condition of the NodeSet that is over: set True, but only where it was
    written before (a NodeSet that never had the problem does not carry the condition)."""
    if conditions.find((view.obj.get("status") or {}).get("conditions"), ctype) is not None:
        view.conditions.append((ctype, True, reason, message))


def hpa_target(hpa: JSON) -> list[str]:
    """`namespace/name` of the NodeSet an HPA scales, if it scales one."""
    ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
    api = str(ref.get("apiVersion") or "")
    if ref.get("kind") != "NodeSet" or not api.startswith("slinky.slurm.net/"):
        return []
    return [f"{hpa['metadata'].get('namespace')}/{ref.get('name')}"]


REGISTERING_RECHECK_S = 10.0
# A Service (or PDB) of the NodeSet's name that someone else made is asked for again so often.
FOREIGN_RECHECK_S = 300.0
GONE_REASON = f"{builder.REASON_PREFIX}its pod is gone"  # a node set DOWN by forget_departed
CREATES_IN_FLIGHT = 64  # a batch of 2,048 at once only makes a loaded apiserver time out


def slow_start_batches(total: int, initial: int = 1) -> list[int]:
    """Batch sizes 1, 2, 4, ... summing to `total` (client-go's slowStartBatch)."""
    out = []
    size = initial
    left = total
    while left > 0:
        n = min(size, left)
        out.append(n)
        left -= n
        size *= 2
    return out


class NoControllerAddress(Exception):
    """No `--conf-server` can be given to slurmd: no pod is created."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def conf_server(cluster: JSON | None, namespace: str, spec: NodeSetSpec) -> str | None:
    """slurmd's `--conf-server`: `cluster`'s `spec.controller`. None when the template
    already sets the flag. Raises NoControllerAddress when neither says where it is."""
    if builder.template_sets_conf_server(spec.template):
        return None
    if cluster is None:
        raise NoControllerAddress(
            "ClusterNotFound",
            f"Cluster {namespace}/{spec.cluster_name} (spec.clusterName) not found; "
            "no pod is created until it exists",
        )
    try:
        cspec = parse(ClusterSpec, cluster.get("spec"), "spec")
    except ParseError as e:
        raise NoControllerAddress(
            "ClusterInvalid", f"Cluster {namespace}/{spec.cluster_name}: {e}"
        ) from None
    if cspec.controller is None:
        raise NoControllerAddress(
            "NoControllerAddress",
            f"Cluster {namespace}/{spec.cluster_name} has no spec.controller and the "
            "slurmd container sets no --conf-server; set spec.controller {host, port}",
        )
    return f"{cspec.controller.host}:{cspec.controller.port}"


def revision(obj: JSON, spec: NodeSetSpec, cluster: JSON | None) -> str:
    """The revision the NodeSet's pods should be at: the hash of what they are built from.
    Without a controller address there is no new revision to roll to: the pods stay at the
    status' updateRevision rather than be replaced by pods that cannot be built."""
    service = builder.service_name(obj, spec)
    try:
        server = conf_server(cluster, obj["metadata"]["namespace"], spec)
    except NoControllerAddress:
        pending = (obj.get("status") or {}).get("updateRevision")
        return str(pending or builder.revision_hash(spec.template, None, service))
    return builder.revision_hash(spec.template, server, service)


class NodeSetSync:
    def __init__(
        self,
        kube: rest.Kube,
        *,
        nodesets: MultiInformer,
        clusters: MultiInformer,
        pods: MultiInformer,
        services: MultiInformer,
        pdbs: MultiInformer,
        nodes: Informer,
        revisions: MultiInformer,
        clients: ClusterClients,
        recorder: events.EventRecorder,
        expectations: Expectations,
        hpas: MultiInformer | None = None,
        node_health: NodeHealth | None = None,
        gres_resources: Mapping[str, str] | None = None,
        placement_config: Placement | None = None,
    ) -> None:
        self.hpas = hpas
        self.nodesets = nodesets
        self.clusters = clusters
        self.pods = pods
        self.services = services
        self.pdbs = pdbs
        self.revisions = revisions
        self.clients = clients
        self.partitions = partition.Partitions()
        # NodeSet UIDs some pod of which registered in Slurm (this process saw it), and the
        # backoff of replacing pods that lost their registration.
        self.registered_once: set[str] = set()
        # ns/name -> when a child the operator would create was found made by someone else
        # (the slurm chart's one slurmd Service for every NodeSet): not asked again sooner
        # than FOREIGN_RECHECK_S (the informer sees only the operator's own).
        self.foreign: dict[str, float] = {}
        self.replacing: dict[str, tuple[Backoff, float]] = {}
        self.rescuing: dict[str, tuple[Backoff, float]] = {}
        self.ctx = Context(
            kube=kube,
            podcontrol=PodControl(kube, expectations),
            recorder=recorder,
            nodes=nodes,
            expectations=expectations,
            node_health=node_health or NodeHealth(),
            gres_resources=dict(
                builder.DEFAULT_GRES_RESOURCES if gres_resources is None else gres_resources
            ),
            placement=placement_config or Placement(),
            partitions=self.partitions,
        )

    # ------------------------------------------------------------ entry

    async def reconcile(self, key: str) -> Result:
        obj = self.nodesets.get(key)
        if obj is None:
            for informer in self.clients.informers():
                informer.demand(key, False)
                informer.want_partitions(key, False)
            return DONE
        meta = obj["metadata"]
        if meta.get("deletionTimestamp") and not objects.has_finalizer(obj, FINALIZER):
            return DONE
        try:
            spec = parse(NodeSetSpec, obj.get("spec"), "spec")
        except ParseError as e:
            await status.write_condition_only(self.ctx, obj, "InvalidSpec", str(e))
            return DONE
        if not meta.get("deletionTimestamp") and not objects.has_finalizer(obj, FINALIZER):
            obj = await objects.add_finalizer(self.ctx.kube, NODESETS, obj, FINALIZER)
            meta = obj["metadata"]
        view = self.view_of(key, obj, spec)
        try:
            if view.deleting:
                return await self.finalize(view)
            return await self.sync(view)
        finally:
            self.demand_fast_polls(view)

    def view_of(self, key: str, obj: JSON, spec: NodeSetSpec) -> View:
        meta = obj["metadata"]
        owned = self.pods.by_index(BY_OWNER_UID, meta["uid"])
        server: str | None = None
        conf_problem: tuple[str, str] | None = None
        try:
            server = self.conf_server(meta["namespace"], spec)
        except NoControllerAddress as e:
            conf_problem = (e.reason, e.message)
        cluster = self.clusters.get(f"{meta['namespace']}/{spec.cluster_name}")
        active: dict[str, JSON] = {}
        terminating: dict[str, JSON] = {}
        for p in map(self.ctx.podcontrol.as_written, owned):
            f = pods.facts(p)
            (terminating if f.deleting else active)[f.name] = p
        return View(
            obj=obj,
            spec=spec,
            key=key,
            exp_key=f"{key}/{meta['uid']}",
            revision=revision(obj, spec, cluster),
            conf_server=server,
            conn=self.clients.get(f"{meta['namespace']}/{spec.cluster_name}"),
            active=active,
            terminating=terminating,
            conf_problem=conf_problem,
        )

    def conf_server(self, namespace: str, spec: NodeSetSpec) -> str | None:
        return conf_server(self.clusters.get(f"{namespace}/{spec.cluster_name}"), namespace, spec)

    async def sync(self, view: View) -> Result:
        await self.ensure_children(view)
        requeue: list[float] = []
        if self.ctx.expectations.satisfied(view.exp_key):
            await self.replace_finished(view)
            requeue += await self.replace_unregistered(view)
            requeue += await self.replace_unreachable(view)
            await self.forget_departed(view)
            if (recheck := mirror.recheck_in(view)) is not None:
                requeue.append(recheck)
            self.check_autoscaler(view)
            if mirror.registering(view):
                view.waits.append("new slurmd registering")
                requeue.append(REGISTERING_RECHECK_S)  # ends the fast polls after the window
            excess = len(view.active) - view.spec.replicas
            requeue += await scalein.scale_in(
                self.ctx, view, excess, lambda p: mirror.cordon_reason(self.ctx, p)
            )
            if excess < 0:
                requeue += await self.scale_out(view, -excess)
            if view.conf_problem is None:
                requeue += await update.rolling_update(self.ctx, view)
            if view.slurm_ready:
                # After the removals: a pod whose job just ended is deleted first, not
                # after its Slurm state was mirrored onto it.
                await mirror.mirror_slurm(self.ctx, view)
                await mirror.sync_cordon(self.ctx, view)
                await placement.sync_placement(self.ctx, view)
        else:
            requeue.append(5.0)  # backstop: observations normally arrive first
            if any(pods.condemned(p) for p in view.active.values()):
                # Nothing is decided now, but condemned pods still wait on Slurm: keep
                # polling fast, so their drain is seen as soon as the cache catches up.
                view.waits.append("condemned pods wait to be drained")
        if outcome := await self.partitions.sync(self.ctx, view):
            view.conditions.append(
                (partition.CONDITION, outcome.ok, outcome.reason, outcome.message)
            )
            if not outcome.ok:
                requeue.append(partition.RETRY_S)
            if outcome.recheck is not None:
                requeue.append(outcome.recheck)
        requeue += await status.write_status(self.ctx, view)
        requeue += view.recheck
        return Result(requeue_after=min(requeue)) if requeue else DONE

    def demand_fast_polls(self, view: View) -> None:
        """Poll Slurm fast while this NodeSet waits on it, slowly otherwise."""
        if view.conn is not None:
            view.conn.informer.demand(view.key, bool(view.waits))

    # ------------------------------------------------------------ 1. children

    async def ensure_children(self, view: View) -> None:
        """Service, PDB and the ControllerRevision of the current template; re-created when
        deleted (their informers enqueue the NodeSet)."""
        ns = view.namespace
        uid = view.obj["metadata"]["uid"]
        generation = int(view.obj["metadata"].get("generation", 1))
        service = builder.build_service(view.obj, view.spec)
        pdb = builder.build_pdb(view.obj)
        revision = builder.build_revision(
            view.obj, view.spec, view.revision, generation, view.conf_server
        )
        children: list[tuple[MultiInformer, rest.Resource, JSON]] = [
            (self.services, rest.SERVICES, service),
            (self.pdbs, rest.PDBS, pdb),
        ]
        if view.conf_problem is None:
            children.append((self.revisions, rest.CONTROLLER_REVISIONS, revision))
        for informer, res, want in children:
            key = f"{ns}/{want['metadata']['name']}"
            have = informer.get(key)
            if have is not None and have["metadata"].get("deletionTimestamp") is None:
                continue
            if time.monotonic() - self.foreign.get(f"{res.kind}/{key}", -math.inf) < (
                FOREIGN_RECHECK_S
            ):
                continue
            if await self.ctx.podcontrol.create_if_absent(res, want):
                log.info("nodeset %s: created %s %s", view.key, res.kind, want["metadata"]["name"])
                self.foreign.pop(f"{res.kind}/{key}", None)
            elif have is None and await self.made_by_another(res, want):
                self.foreign[f"{res.kind}/{key}"] = time.monotonic()
        await self.prune_revisions(view, uid)

    async def made_by_another(self, res: rest.Resource, want: JSON) -> bool:
        """Whether the object `want` names exists and is not the operator's (one read, after
        a create found it there while the informer did not show it)."""
        meta = want["metadata"]
        try:
            have = await self.ctx.kube.get(res, meta["name"], meta.get("namespace"))
        except rest.ApiError as e:
            if e.not_found:
                return False
            raise
        labels = have["metadata"].get("labels") or {}
        return labels.get(builder.LABEL_MANAGED_BY) != builder.MANAGER

    async def prune_revisions(self, view: View, uid: str) -> None:
        """Keep `revisionHistoryLimit` old ControllerRevisions besides those in use."""
        in_use = {view.revision} | {
            pods.revision_of(p) for p in (*view.active.values(), *view.terminating.values())
        }
        owned = self.revisions.by_index(BY_OWNER_UID, uid)
        old = [
            r
            for r in owned
            if (r["metadata"].get("labels") or {}).get(builder.LABEL_REVISION) not in in_use
        ]
        old.sort(key=lambda r: int(r.get("revision") or 0), reverse=True)
        for rev in old[view.spec.revision_history_limit :]:
            await self.ctx.podcontrol.delete_object(rest.CONTROLLER_REVISIONS, rev)

    # ------------------------------------------------------------ 2. finished pods

    async def replace_finished(self, view: View) -> None:
        for pod in [p for p in view.active.values() if pods.phase(p) in ("Succeeded", "Failed")]:
            if await self.ctx.podcontrol.delete_pod(view.exp_key, pod):
                self.ctx.recorder.event(
                    view.obj,
                    events.WARNING,
                    "PodFinished",
                    f"pod {pods.name(pod)} ended ({pods.phase(pod)}); replacing it",
                )
            view.moved(pod)

    async def replace_unregistered(self, view: View) -> list[float]:
        """Pods whose slurmd Slurm does not know past the deadline (`mirror.unregistered`)
        are named in the condition `SlurmNodesRegistered`. In a NodeSet some of whose pods
        did register (so slurmd can), or that itself carries the Slurm state conditions the
        mirror wrote while its node existed, such a pod lost its registration: it is deleted (Slurm
        confirms it has no such node, so no job can be on it) and made again, at most once
        per backoff period (60 s doubling to 15 min), so a slurmd that cannot register is
        not replaced in a loop. A NodeSet none of whose pods ever registered (kwok, a broken
        image or address) only gets the condition."""
        uid = str(view.obj["metadata"]["uid"])
        lost = mirror.unregistered(view)
        known = view.conn.informer.nodes if view.conn is not None else {}
        if any(pods.name(p) in known for p in view.active.values()):
            self.registered_once.add(uid)
        if not lost:
            self.replacing.pop(uid, None)
            cleared(view, REGISTERED, "Registered", "every Ready pod is a Slurm node")
            return []
        ordered = sorted(pods.name(p) for p in lost)
        names = ", ".join(ordered[:10]) + (
            f" and {len(ordered) - 10} more" if len(ordered) > 10 else ""
        )
        # Registered once: seen by this process, or (an operator restarted since) a pod
        # that carries the Slurm state conditions mirrored from its node.
        if uid not in self.registered_once:
            lost_replaceable = [p for p in lost if mirror.was_slurm_node(p)]
        else:
            lost_replaceable = lost
        replace = bool(lost_replaceable)
        message = (
            f"Ready for over {mirror.REGISTRATION_DEADLINE_S:.0f}s with no Slurm node: {names}"
            + (
                " (slurmctld lost their registration; replaced)"
                if replace
                else " (check the slurmd log: its --conf-server, slurm.key and the network to "
                "slurmctld)"
            )
        )
        view.conditions.append((REGISTERED, False, "SlurmNodeNotRegistered", message))
        backoff, due = self.replacing.get(uid, (Backoff(60.0, 900.0), 0.0))
        if not replace or view.conn is None:
            return []
        if (left := due - time.monotonic()) > 0:
            return [max(left, 0.5)]  # no event comes when the backoff ends
        self.replacing[uid] = (backoff, time.monotonic() + backoff.next())
        for pod in lost_replaceable:
            name = pods.name(pod)
            verdict = await scalein.check_drained(view.conn, name, namespace=view.namespace)
            if verdict != scalein.Drained.ABSENT:
                continue
            if await self.ctx.podcontrol.delete_pod(view.exp_key, pod):
                self.ctx.recorder.event(
                    view.obj,
                    events.WARNING,
                    "SlurmNodeNotRegistered",
                    f"pod {name} has been Ready for over {mirror.REGISTRATION_DEADLINE_S:.0f}s "
                    f"but Slurm has no node {name} (slurmctld lost its registration); "
                    "replacing the pod",
                )
                log.warning("nodeset %s: pod %s has no Slurm node; replacing it", view.key, name)
            view.moved(pod)
        return []

    async def forget_departed(self, view: View) -> None:
        """Delete the Slurm nodes that outlived their pod (`mirror.departed`), each after a
        fresh read confirms it (`mirror.outlived`; Slurm itself refuses to delete a node with
        jobs); one whose ended jobs wait COMPLETING on the gone slurmd is set DOWN first
        (`mirror.only_completing`). A pod of that name made later registers anew."""
        departed = mirror.departed(view)
        if not departed:
            return
        # Out of the NodeSet's partition first, and deleted once slurmctld saved that.
        free_in = await self.partitions.release(view, {n.name for n in departed})
        for cached in departed:
            assert view.conn is not None  # departed() found none without a connection
            name = cached.name
            try:
                node = await view.conn.client.get_node(name)
                if mirror.outlived(node, view.namespace):
                    if (wait := free_in[name]) is None or wait > 0:
                        view.recheck.append(partition.RETRY_S if wait is None else wait)
                        continue
                    await view.conn.client.delete_node(name)
                    reason, action, done = "SlurmNodeDeleted", "Delete", "deleted"
                elif mirror.only_completing(node, view.namespace):
                    # Deleted at a later pass, once Slurm has ended the COMPLETING jobs.
                    await view.conn.client.update_node(name, state="DOWN", reason=GONE_REASON)
                    reason, action, done = (
                        "SlurmNodeDown",
                        "Down",
                        "set DOWN to end its jobs' COMPLETING",
                    )
                else:
                    continue
            except errors.SlurmError as e:
                if not isinstance(e, errors.SlurmNotFound):
                    log.warning("nodeset %s: Slurm node %s outlived its pod: %s", view.key, name, e)
                continue
            view.conn.informer.poke()
            message = (
                f"Slurm node {name} ({node.state}) outlived its pod (slurmctld "
                f"was down when the pod stopped, or restarted from older state); {done}"
            )
            self.ctx.recorder.event(view.obj, events.NORMAL, reason, message, action=action)
            log.info("nodeset %s: %s", view.key, message)

    async def replace_unreachable(self, view: View) -> list[float]:
        """Pods Ready whose own Slurm node has been NOT_RESPONDING without jobs past the
        deadline (`mirror.unreachable`: IDLE, or DOWN by slurmctld for not responding) are
        named in the condition `SlurmNodesResponding` and replaced (at most once per backoff
        period): Slurm confirms, right before, that the node is still so and this pod's, so
        no job is on it. A node with jobs is left to Slurm (SlurmdTimeout)."""
        uid = str(view.obj["metadata"]["uid"])
        stuck = mirror.unreachable(view)
        if not stuck:
            self.rescuing.pop(uid, None)
            cleared(view, RESPONDING, "Responding", "every Ready pod's Slurm node responds")
            return []
        names = ", ".join(sorted(pods.name(p) for p in stuck))
        view.conditions.append(
            (
                RESPONDING,
                False,
                "SlurmNodeNotResponding",
                f"Ready for over {mirror.REGISTRATION_DEADLINE_S:.0f}s while Slurm says their "
                f"nodes, without jobs, do not respond: {names} (slurmctld pings an old address, or "
                "slurmd hangs); replaced",
            )
        )
        backoff, due = self.rescuing.get(uid, (Backoff(60.0, 900.0), 0.0))
        if view.conn is None:
            return []
        if (left := due - time.monotonic()) > 0:
            return [max(left, 0.5)]
        self.rescuing[uid] = (backoff, time.monotonic() + backoff.next())
        for pod in stuck:
            name = pods.name(pod)
            try:
                node = await view.conn.client.get_node(name)
            except errors.SlurmError:
                continue
            if not mirror.unresponsive_without_jobs(node) or not belongs_to(
                node, view.namespace, name
            ):
                continue
            if await self.ctx.podcontrol.delete_pod(view.exp_key, pod):
                self.ctx.recorder.event(
                    view.obj,
                    events.WARNING,
                    "SlurmNodeNotResponding",
                    f"pod {name} is Ready but its Slurm node (no jobs) has not responded for over "
                    f"{mirror.REGISTRATION_DEADLINE_S:.0f}s; replacing the pod (a new slurmd "
                    "registers anew)",
                )
                log.warning(
                    "nodeset %s: Slurm node %s does not respond; replacing its pod", view.key, name
                )
            view.moved(pod)
        return []

    def check_autoscaler(self, view: View) -> None:
        """An HPA does not scale up a NodeSet at 0 replicas that it did not scale to 0
        itself: Kubernetes disables scaling of such a target (HPA condition ScalingActive
        False, ScalingDisabled), and it scales from 0 only with minReplicas 0 and the
        HPAScaleToZero feature gate. The condition `Autoscaling` says so and what to do,
        instead of the queue growing while nothing happens."""
        if self.hpas is None:
            return
        stuck = []
        if view.spec.replicas == 0:
            for hpa in self.hpas.by_index(BY_HPA_TARGET, view.key):
                active = conditions.find(
                    (hpa.get("status") or {}).get("conditions"), "ScalingActive"
                )
                minimum = int((hpa.get("spec") or {}).get("minReplicas", 1))
                if minimum >= 1 or (active or {}).get("reason") == "ScalingDisabled":
                    stuck.append((str(hpa["metadata"]["name"]), minimum))
        if stuck:
            names = ", ".join(sorted(n for n, _ in stuck))
            how = (
                "set the HPA's minReplicas to 0 (feature gate HPAScaleToZero) and "
                if any(m >= 1 for _, m in stuck)
                else ""
            )
            view.conditions.append(
                (
                    AUTOSCALING,
                    False,
                    "HPACannotScaleFromZero",
                    f"HorizontalPodAutoscaler {names} does not scale this NodeSet up from "
                    "replicas 0: Kubernetes scales a target at 0 only when the HPA itself "
                    "scaled it there (minReplicas 0, feature gate HPAScaleToZero); "
                    f"{how}set the NodeSet's replicas to 1 once, the HPA takes it from there",
                )
            )
        else:
            cleared(view, AUTOSCALING, "Scalable", "no autoscaler is stuck")

    # ------------------------------------------------------------ 4. scale out

    async def scale_out(self, view: View, needed: int) -> list[float]:
        if view.conf_problem is not None:
            return []  # no slurmd without its --conf-server; the status says why
        held_active = {view.ordinal(p) for p in view.active.values()}
        held_terminating = {view.ordinal(p) for p in view.terminating.values()}
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
        created = 0
        for size in slow_start_batches(len(ordinals)):
            batch, ordinals = ordinals[:size], ordinals[size:]
            results = await scalein.bounded(
                [functools.partial(self.create_one, view, o) for o in batch],
                min(size, CREATES_IN_FLIGHT),
            )
            created += sum(results)
            if not all(results):
                break  # like slowStartBatch: a failed batch stops the scale-out
        if created:
            log.info("nodeset %s: created %d pods", view.key, created)
        return [WAITING_FOR_TERMINATING_S] if waiting else []

    async def create_one(self, view: View, ordinal: int) -> bool:
        for pvc in builder.build_pvcs(view.obj, view.spec, ordinal):
            await self.ctx.podcontrol.create_if_absent(rest.PVCS, pvc)
        pod = builder.build_pod(
            view.obj,
            view.spec,
            ordinal,
            revision=view.revision,
            conf_server=view.conf_server,
            gres_resources=self.ctx.gres_resources,
        )
        if not await self.ctx.podcontrol.create_pod(view.exp_key, pod):
            return False
        self.ctx.recorder.event(
            view.obj, events.NORMAL, "Created", f"created pod {pod['metadata']['name']}"
        )
        return True

    # ------------------------------------------------------------ deletion

    async def finalize(self, view: View) -> Result:
        """Every pod leaves through the drain-before-delete path; then the finalizer goes.
        The annotation `delete-without-drain: "true"` skips the wait (jobs are killed)."""
        if (view.obj["metadata"].get("annotations") or {}).get(ANNOTATION_SKIP_DRAIN) == "true":
            self.ctx.recorder.event(
                view.obj,
                events.WARNING,
                "DeletedWithoutDrain",
                f"{ANNOTATION_SKIP_DRAIN}=true: pods are deleted now, running jobs are lost",
            )
            await objects.remove_finalizer(self.ctx.kube, NODESETS, view.obj, FINALIZER)
            return DONE
        if queued := await self.partitions.queued_jobs(self.ctx, view):
            await status.write_status(self.ctx, view, deleting_message=queued)
            return Result(requeue_after=scalein.DRAIN_RECHECK_S)
        waiting = await scalein.finalize(self.ctx, view)
        if view.slurm_ready and self.ctx.expectations.satisfied(view.exp_key):
            # The pods that wait keep showing their Slurm node (and the busy label).
            await mirror.mirror_slurm(self.ctx, view)
        if not waiting and view.slurm_ready:
            await self.forget_departed(view)  # the nodes of pods deleted by hand meanwhile
            if view.recheck:
                message = (
                    "every pod is gone; the Slurm nodes of pods deleted by hand leave the "
                    "partition before they are deleted"
                )
                await status.write_status(self.ctx, view, deleting_message=message)
                return Result(requeue_after=min(view.recheck))
        if not waiting and not await self.partitions.delete(self.ctx, view):
            message = (
                f"every pod is gone; Slurm partition {partition.partition_name(view)} could "
                "not be deleted yet (Slurm refuses while jobs are queued in it: cancel them, "
                f'or annotate {ANNOTATION_SKIP_DRAIN}="true" to leave the partition behind)'
            )
            await status.write_status(self.ctx, view, deleting_message=message)
            return Result(requeue_after=partition.RETRY_S)
        if not waiting:
            await objects.remove_finalizer(self.ctx.kube, NODESETS, view.obj, FINALIZER)
            log.info("nodeset %s: every pod drained and deleted; finalizer removed", view.key)
            return DONE
        message = await self.waiting_message(view, waiting)
        await status.write_status(self.ctx, view, deleting_message=message)
        return Result(requeue_after=min([scalein.DRAIN_RECHECK_S, *view.recheck]))

    async def waiting_message(self, view: View, waiting: dict[str, scalein.Drained]) -> str:
        """ "2 pods wait: cpu-0 (jobs 12, 13), cpu-1 (cannot ask Slurm)"."""
        jobs = await self.jobs_on(view.conn, set(waiting)) if view.conn else {}
        parts = []
        for name in sorted(waiting):
            ids = jobs.get(name)
            why = f"jobs {', '.join(map(str, sorted(ids)))}" if ids else waiting[name].value
            parts.append(f"{name} ({why})")
        return (
            f"{len(waiting)} pods wait to be drained before deletion: {'; '.join(parts)}. "
            "To delete now and kill their jobs: annotate the NodeSet "
            f'{ANNOTATION_SKIP_DRAIN}="true"'
        )

    @staticmethod
    async def jobs_on(conn: Connection | None, names: set[str]) -> dict[str, set[int]]:
        """Running jobs by node, for the names given (one job list, only while a deletion
        waits)."""
        if conn is None:
            return {}
        try:
            jobs, _ = await conn.client.list_jobs()
        except errors.SlurmError:
            return {}
        out: dict[str, set[int]] = {}
        for job in jobs or []:
            if job.is_finished or job.is_pending:
                continue
            for node in expand_hostlist(job.nodes):
                if node in names:
                    out.setdefault(node, set()).add(job.job_id)
        return out
