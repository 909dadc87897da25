"""What the scheduler watches, and which events bring which pod back.

- Pods that name the bridge's scheduler (a field selector: the cache holds no other pod),
  while they wait for a node; the queue hands them out in priority order.
- Its placeholder jobs (the job watch): a job whose state or nodes changed brings back the
  pod waiting on it.
- Slurm nodes (the Slurm informer's deltas): a changed node makes the pending jobs and the
  jobs on it due for a read at once, which is how an allocation is noticed within a poll;
  so does a node list that changed without a node event (a node handed from a cancelled job
  to a waiting one between two polls looks the same before and after).
- Kubernetes Nodes, for the Slurm node -> Kubernetes node mapping (index on the Slurm name)
  and the pods' constraints; a Node or Slurm node that changes brings back the pods that no
  managed node could take, and a Node added, relabelled or retainted (or a Slurm node added
  or removed) brings back the pods that wait on a job, whose excluded_nodes may have to
  follow (see `exclusion`).
"""

from __future__ import annotations

from slinky.bridge.config import BridgeConfig
from slinky.bridge.connection import SlurmConnection
from slinky.bridge.jobwatch import JobWatch
from slinky.bridge.namespaces import ManagedNamespaces
from slinky.bridge.nodes.controller import BY_SLURM_NAME, index_slurm_name
from slinky.bridge.scheduler import exclusion
from slinky.bridge.scheduler.queue import PriorityWorkQueue, pod_rank
from slinky.bridge.scheduler.sync import SchedulerSync
from slinky.kube import events, rest
from slinky.kube.controller import Controller
from slinky.kube.informer import Informer, InformerFactory
from slinky.slurm.informer import SlurmEvent
from slinky.types import JSON

NAME = "bridge-scheduler"


def pods_informer(factory: InformerFactory, config: BridgeConfig) -> Informer:
    """The bridge's pods, in every namespace (shared by the scheduler and the workload
    controller when they run in one process)."""
    return factory.informer(rest.PODS, field_selector=f"spec.schedulerName={config.scheduler_name}")


def build(
    kube: rest.Kube,
    factory: InformerFactory,
    slurm: SlurmConnection,
    recorder: events.EventRecorder,
    config: BridgeConfig,
    *,
    workers: int = 4,
    job_recheck: float = 10.0,
    settled_recheck: float = 60.0,
    own_namespace: str = "",
) -> tuple[Controller, SchedulerSync, JobWatch]:
    pods = pods_informer(factory, config)
    nodes = factory.informer(rest.NODES, indexers={BY_SLURM_NAME: index_slurm_name})

    def on_job(job_id: int) -> None:
        for key in sync.ledger.waiters(job_id):
            ctrl.enqueue(key)

    watch = JobWatch(
        slurm.client,
        on_change=on_job,
        max_interval=job_recheck,
        settled_interval=settled_recheck,
        recent=slurm.recent_jobs,
        slurmctld=slurm.slurmctld,
    )
    namespaces = ManagedNamespaces(kube, factory, config, own_namespace)
    sync = SchedulerSync(
        kube,
        config=config,
        pods=pods,
        nodes=nodes,
        slurm=slurm,
        watch=watch,
        recorder=recorder,
        is_managed=namespaces.managed,
    )
    queue = PriorityWorkQueue(NAME, rank=lambda key: pod_rank(pods.store.get(key)))
    ctrl = Controller(NAME, sync, workers=workers, queue=queue)
    sync.gangs.enqueue = ctrl.enqueue

    def waits(old: JSON | None, new: JSON) -> bool:
        return sync.schedulable(new) or (old is not None and sync.schedulable(old))

    ctrl.watch(pods, predicate=waits)
    # A pod of ours that turns terminal (or goes) frees its node for the pods held for it.
    ctrl.watch(pods, mapper=sync.released)
    # A node that changes may now take a pod that no node could take.
    ctrl.watch(nodes, mapper=lambda _node: list(sync.unfit))
    # A node added, relabelled or retainted changes what a waiting job must exclude.
    ctrl.watch(
        nodes,
        mapper=lambda _node: sync.ledger.waiting_pods(),
        predicate=exclusion.placement_relevant,
    )

    def on_slurm(event: SlurmEvent) -> None:
        if event.kind == "node":
            watch.node_changed(event.name)
            for key in list(sync.unfit):
                ctrl.enqueue(key)
            if event.type in ("ADDED", "DELETED"):
                for key in sync.ledger.waiting_pods():
                    ctrl.enqueue(key)

    slurm.informer.subscribe(on_slurm)
    # A node handed from a cancelled job to a waiting one between two polls shows no node
    # event; slurmctld's update_time still says a node changed.
    slurm.informer.on_node_list(watch.pending_due)
    return ctrl, sync, watch
