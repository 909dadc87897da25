"""One reconcile of a Kubernetes node (key: the Node's name), as named steps:

1. `forget_deleted`   — the Node is gone: if the bridge registered a Slurm node for it, drain
                        that node and delete it once no job runs there; `forget_renamed`
                        does the same when the Node's slurm-nodename label changed;
2. `sync_registration` — labelled `external-node`: register it in Slurm (EXTERNAL, NodeAddr,
                        CPUs, RealMemory, partitions as features, each partition checked
                        first); a change is applied by draining, deleting once idle and
                        registering again; label removed: drain, then delete once idle;
                        an idle node Slurm left NOT_RESPONDING is made anew (`remake`);
3. `sync_taint`       — the managed-node taint on exactly the nodes Slurm knows;
4. `sync_health`      — a cordoned node drains its Slurm node (reason `slurm-bridge: ...`),
                        and so does a NotReady one or one with a condition of `nodeHealth`
                        True when the bridge registered that Slurm node (the rule of
                        `slinky.kube.nodehealth`; a NodeSet pod's node is the operator's to
                        drain by its own flags); healthy again undrains only drains the
                        bridge made.

Managed means "Slurm knows the node", read from the Slurm informer's cache: a node Slurm does
not know and that is not labelled costs no Slurm request at all.
"""

from __future__ import annotations

import logging
import time

from slinky.bridge.config import BridgeConfig
from slinky.bridge.connection import SlurmConnection
from slinky.bridge.labels import REASON_PREFIX
from slinky.bridge.nodes import registration, slurmcontrol, taints
from slinky.bridge.nodes.registration import Registration, RegistrationProblem
from slinky.kube import events, nodehealth, rest
from slinky.kube.controller import DONE, Result
from slinky.kube.informer import Informer
from slinky.slurm.models import Node
from slinky.types import JSON

log = logging.getLogger(__name__)

# What drains a Slurm node the bridge did not register (a real slurmd's, a NodeSet pod's).
CORDON_ONLY = nodehealth.NodeHealth(not_ready=False)
# How often a drained-but-busy Slurm node is looked at again (job ends also trigger it,
# through the Slurm informer; this is the backstop).
DRAIN_RECHECK_S = 10.0
# A partition that does not exist yet may be created by an admin: look again this often.
PROBLEM_RECHECK_S = 30.0
# How long a node the bridge created may be missing from the Slurm informer's cache before
# the bridge believes the cache (a few polls).
CREATED_GRACE_S = 10.0


class NodeSync:
    """The node controller's reconciler; see the module docstring for its steps."""

    def __init__(
        self,
        kube: rest.Kube,
        *,
        config: BridgeConfig,
        nodes: Informer,
        slurm: SlurmConnection,
        registered: dict[str, str],
        recorder: events.EventRecorder,
    ) -> None:
        self.kube = kube
        self.config = config
        self.nodes = nodes
        self.slurm = slurm
        # Kubernetes node name -> Slurm node name, for the Slurm nodes the bridge registered
        # (kept current from Slurm events by the controller).
        self.registered = registered
        self.recorder = recorder
        # Slurm node name -> when the bridge created it; until the Slurm informer has seen
        # the new node, a reconcile must not take its absence from the cache for "missing".
        self.created: dict[str, float] = {}

    async def reconcile(self, key: str) -> Result:
        """Bring Slurm and the Node in line with each other, step by step."""
        node = self.nodes.store.get(key)
        if node is None:
            return await self.forget_deleted(key)
        result = await self.forget_renamed(node)
        if result is not None:
            return result
        result = await self.sync_registration(node)
        if result is not None:
            return result
        slurm_node = slurmcontrol.cached(self.slurm, registration.slurm_name(node))
        if slurm_node is not None:
            ours = registration.registered_for(slurm_node, self.config.cluster_id) == key
            await self.sync_health(node, slurm_node, registered=ours)
        return await self.sync_taint(node, managed=slurm_node is not None)

    # ------------------------------------------------------------ 1. deleted Nodes

    async def forget_deleted(self, name: str) -> Result:
        """The Node is gone from the cache: confirmed by the apiserver, its Slurm node goes."""
        slurm_name = self.registered.get(name)
        if slurm_name is None:
            return DONE
        try:  # the cache says the Node is gone; make sure before touching Slurm
            await self.kube.get(rest.NODES, name)
            return DONE
        except rest.ApiError as e:
            if not e.not_found:
                raise
        return await self.deregister(slurm_name, why=f"Kubernetes node {name} was deleted")

    async def forget_renamed(self, node: JSON) -> Result | None:
        """The Node names another Slurm node now (its slurm-nodename label changed): the Slurm
        node the bridge registered under the old name goes as a deleted Node's would, before
        anything is registered under the new one. None: carry on."""
        name = str(node["metadata"]["name"])
        old = self.registered.get(name)
        new = registration.slurm_name(node)
        if old is None or old == new:
            return None
        why = f"Kubernetes node {name} is now Slurm node {new}"
        result = await self.deregister(old, why=why, node=node)
        return None if result == DONE else result

    async def deregister(self, slurm_name: str, *, why: str, node: JSON | None = None) -> Result:
        """Drain, then delete once no job runs there (the job ends on its own terms)."""
        if slurmcontrol.cached(self.slurm, slurm_name) is None:
            return DONE
        if await slurmcontrol.drain(self.slurm, slurm_name, f"{REASON_PREFIX}{why}"):
            log.info("slurm node %s: drained (%s)", slurm_name, why)
            return Result(requeue_after=1.0)
        if not await slurmcontrol.remove_when_drained(self.slurm, slurm_name):
            return Result(requeue_after=DRAIN_RECHECK_S)
        log.info("slurm node %s: deleted (%s)", slurm_name, why)
        if node is not None:
            self.recorder.event(
                node, events.NORMAL, "Deregistered", f"Slurm node {slurm_name} deleted: {why}"
            )
        return DONE

    # ------------------------------------------------------------ 2. registration

    async def sync_registration(self, node: JSON) -> Result | None:
        """None: carry on with taint and cordon. A Result: stop here for now."""
        name = str(node["metadata"]["name"])
        slurm_name = registration.slurm_name(node)
        current = slurmcontrol.cached(self.slurm, slurm_name)
        ours = registration.registered_for(current, self.config.cluster_id) == name
        if not registration.wants_external(node):
            if ours:
                return await self.deregister(
                    slurm_name,
                    why=f"Kubernetes node {name} is no longer an external node",
                    node=node,
                )
            return None
        try:
            want = registration.desired(node, self.config.partition, self.config.cluster_id)
        except RegistrationProblem as p:
            if current is not None and not ours:
                return None  # someone else's Slurm node: nothing for the bridge to register
            self.recorder.event(node, events.WARNING, p.reason, p.message)
            return Result(requeue_after=PROBLEM_RECHECK_S)
        if current is None:
            created = self.created.get(want.name)
            if created is not None and time.monotonic() - created < CREATED_GRACE_S:
                return Result(requeue_after=self.config.slurm_poll_interval)
            return await self.register(node, want)
        self.created.pop(want.name, None)
        if not ours:
            # A real slurmd (or an admin) made this node: it is managed, but not ours to
            # register or remove; unless it is our own interrupted registration.
            if want.adoptable(current):
                await slurmcontrol.mark(self.slurm, want)
                log.info("slurm node %s: marked as registered for node %s", want.name, name)
            return None
        if want.needs_new_node(current):
            fresh = await slurmcontrol.live(self.slurm, want.name)
            if fresh is None:
                return await self.register(node, want)
            if want.needs_new_node(fresh):
                return await self.reregister(node, want, fresh)
            self.slurm.informer.poke()  # already done; the cache has not caught up yet
        elif slurmcontrol.stuck_unresponsive(current) and await slurmcontrol.remake(
            self.slurm, want
        ):
            message = (
                f"Slurm node {want.name} was NOT_RESPONDING (Slurm sent it an RPC no slurmd "
                "answers, e.g. a job suspend) and took no jobs: registered it anew"
            )
            log.info("slurm node %s: %s", want.name, message)
            self.recorder.event(node, events.NORMAL, "Reregistered", message)
        return None

    async def partitions_missing(self, node: JSON, want: Registration) -> bool:
        """Whether a partition of `want` is missing in Slurm (a Warning event names each)."""
        missing = await slurmcontrol.missing_partitions(self.slurm, want.features)
        for partition in missing:
            self.recorder.event(
                node,
                events.WARNING,
                "PartitionNotFound",
                f"Slurm partition {partition} does not exist; node not registered in Slurm "
                f"as {want.name} (annotation scheduler.slinky.slurm.net/external-node-partitions)",
            )
        return bool(missing)

    async def register(self, node: JSON, want: Registration) -> Result | None:
        """Create the EXTERNAL Slurm node, once every partition it names exists."""
        if await self.partitions_missing(node, want):
            return Result(requeue_after=PROBLEM_RECHECK_S)
        await slurmcontrol.register(self.slurm, want)
        self.created[want.name] = time.monotonic()
        log.info("slurm node %s: registered: %s", want.name, want.node_conf())
        self.recorder.event(
            node, events.NORMAL, "Registered", f"registered in Slurm: {want.node_conf()}"
        )
        # The taint follows once the Slurm informer has seen the node (its event requeues).
        return DONE

    async def reregister(self, node: JSON, want: Registration, current: Node) -> Result:
        """CPUs, memory and NodeAddr cannot change on a Slurm node: drain it, delete it once
        idle, and create it again."""
        why = (
            f"Kubernetes node {want.kube_node} changed (CPUs {current.cpus}->{want.cpus}, "
            f"memory {current.real_memory}->{want.real_memory} MiB, partitions "
            f"{','.join(current.features) or '-'}->{','.join(want.features) or '-'}); "
            "registering it again"
        )
        if await self.partitions_missing(node, want):
            return Result(requeue_after=PROBLEM_RECHECK_S)
        result = await self.deregister(want.name, why=why)
        if result != DONE:
            return result
        return await self.register(node, want) or DONE

    # ------------------------------------------------------------ 3. taint

    async def sync_taint(self, node: JSON, *, managed: bool) -> Result:
        """Set or remove the managed-node taint as `managed` says."""
        wanted = taints.wanted_taints(
            node,
            managed=managed,
            scheduler_name=self.config.scheduler_name,
            policy=self.config.managed_node_taint,
        )
        if wanted is None:
            return DONE
        meta = node["metadata"]
        # The resourceVersion makes this a compare-and-swap: a concurrent change of the taint
        # list (the node lifecycle controller's, an admin's) answers 409, and the reconcile
        # runs again on the newer Node.
        try:
            await self.kube.patch(
                rest.NODES,
                meta["name"],
                {
                    "metadata": {"resourceVersion": meta["resourceVersion"]},
                    "spec": {"taints": wanted},
                },
            )
        except rest.ApiError as e:
            if e.conflict:
                return Result(requeue=True)
            raise
        log.info("node %s: managed-node taint %s", meta["name"], "set" if managed else "removed")
        return DONE

    # ------------------------------------------------------------ 4. node health <-> drain

    async def sync_health(self, node: JSON, slurm_node: Node, *, registered: bool) -> None:
        """A problem (a cordon; NotReady or a watched condition on a node the bridge
        registered): drain the Slurm node; none: undo a drain the bridge made."""
        name = str(node["metadata"]["name"])
        problem = nodehealth.problem(
            node,
            self.config.node_health if registered else CORDON_ONLY,
            cordon_reason=f"Kubernetes node {name} is unschedulable (cordoned)",
        )
        if problem:
            reason = f"{REASON_PREFIX}{problem}"
            if await slurmcontrol.drain(self.slurm, slurm_node.name, reason):
                log.info("slurm node %s: drained: %s", slurm_node.name, reason)
                self.recorder.event(
                    node, events.NORMAL, "SlurmNodeDrained", f"{slurm_node.name}: {problem}"
                )
        elif await slurmcontrol.undrain(self.slurm, slurm_node.name):
            log.info("slurm node %s: undrained (node %s healthy)", slurm_node.name, name)
            self.recorder.event(
                node, events.NORMAL, "SlurmNodeUndrained", f"{slurm_node.name}: node healthy"
            )
