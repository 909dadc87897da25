"""What the workload controller watches, and which events bring which pod back.

- The bridge's pods (field selector on the scheduler name) that carry a job id or the
  finalizer; a deleted pod's job id is kept until its key is reconciled.
- Their placeholder jobs (the job watch): a job whose state changed, or that Slurm forgot,
  brings back every pod of the job (index job id -> pods); a cancelled job Slurm brought
  back is a key of its own (`revived-job:<id>`).
- Slurm nodes: a changed node makes the jobs on it due for a read at once, so a job that
  ends (scancel, time limit, node failure) is noticed within one Slurm informer poll.
"""

from __future__ import annotations

import time

from slinky.bridge import podcontrol
from slinky.bridge.config import BridgeConfig
from slinky.bridge.connection import SlurmConnection
from slinky.bridge.jobwatch import JobWatch
from slinky.bridge.scheduler.controller import pods_informer
from slinky.bridge.workload.sync import (
    BY_JOB,
    ORPHAN_SWEEP_S,
    ORPHANS_KEY,
    REVIVED_PREFIX,
    WorkloadSync,
    index_job,
)
from slinky.kube import events, rest
from slinky.kube.controller import Controller
from slinky.kube.informer import Handler, InformerFactory
from slinky.kube.store import key_of
from slinky.slurm.informer import SlurmEvent
from slinky.types import JSON

NAME = "bridge-workload"


def relevant(pod: JSON) -> bool:
    return podcontrol.job_id_of(pod) is not None or podcontrol.has_finalizer(pod)


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
) -> tuple[Controller, WorkloadSync, JobWatch]:
    pods = pods_informer(factory, config)
    pods.store.add_indexer(BY_JOB, index_job)

    def on_job(job_id: int) -> None:
        for pod in pods.store.by_index(BY_JOB, str(job_id)):
            ctrl.enqueue(key_of(pod))

    def on_revived(job_id: int) -> None:
        ctrl.enqueue(f"{REVIVED_PREFIX}{job_id}")

    watch = JobWatch(
        slurm.client,
        on_change=on_job,
        on_revived=on_revived,
        max_interval=job_recheck,
        settled_interval=settled_recheck,
        recent=slurm.recent_jobs,
        slurmctld=slurm.slurmctld,
    )
    sync = WorkloadSync(kube, config=config, pods=pods, slurm=slurm, watch=watch, recorder=recorder)
    ctrl = Controller(NAME, sync, workers=workers)
    sync.enqueue = ctrl.enqueue

    def remember_gone(pod: JSON) -> None:
        job_id = podcontrol.job_id_of(pod)
        if job_id is not None:
            sync.gone[key_of(pod)] = (job_id, str(pod["metadata"].get("uid") or ""))

    pods.add_handler(Handler(on_delete=remember_gone))
    ctrl.watch(
        pods,
        predicate=lambda old, new: relevant(new) or (old is not None and relevant(old)),
    )

    def on_slurm(event: SlurmEvent) -> None:
        if event.kind == "node":
            watch.node_changed(event.name)

    slurm.informer.subscribe(on_slurm)
    # A job that lost its allocation in a slurmctld crash (restored from state saved before
    # it) while the node cache never showed the allocation sends no node event: its pod ran
    # on where Slurm no longer held anything until the settled tick, a minute later.
    slurm.informer.on_node_list(watch.all_due)
    last_sweep = [0.0]

    def sweep_orphans() -> None:
        if time.monotonic() - last_sweep[0] >= ORPHAN_SWEEP_S:
            last_sweep[0] = time.monotonic()
            ctrl.enqueue(ORPHANS_KEY)

    slurm.informer.on_node_list(sweep_orphans)
    return ctrl, sync, watch
