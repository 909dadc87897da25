"""The workload controller's rules against fakes of the apiserver and slurmrestd: what a
finished, deleted or running pod does to its placeholder job, and what it costs Slurm."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from slinky.bridge import placeholder
from slinky.bridge.jobwatch import FIRST_READ_S, JobWatch, RecentReads
from slinky.bridge.labels import FINALIZER, SLURM_JOBID, SLURM_JOBID_ANNOTATION
from slinky.bridge.workload.sync import (
    ADOPT_AFTER_S,
    BY_JOB,
    ORPHANS_KEY,
    REVIVED_PREFIX,
    UNCONFIRMED_PREFIX,
    WorkloadSync,
    index_job,
    unconfirmed,
)
from slinky.kube import rest
from slinky.kube.controller import DONE, Controller
from slinky.kube.store import Store
from slinky.slurm import errors
from slinky.slurm.models import Job
from slinky.slurm.started import SlurmctldStart
from tests.unit.test_bridge_groups import CONFIG
from tests.unit.test_bridge_scheduler_sync import FakeKube, FakeSlurm, make_pod

JSON = dict[str, Any]


class CountingSlurm(FakeSlurm):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[int] = []

    async def get_job(self, job_id: int) -> Job:
        self.reads.append(job_id)
        return await super().get_job(job_id)


class Kube(FakeKube):
    """Deletes are recorded; reads answer from the pod store."""

    def __init__(self, pods: Store) -> None:
        super().__init__(pods)
        self.deleted: list[str] = []

    async def get(self, _res: Any, name: str, ns: str | None = None) -> JSON:
        pod = self.pods.get(f"{ns}/{name}")
        if pod is None:
            raise rest.ApiError(404, "NotFound", name)
        return pod

    async def delete(self, _res: Any, name: str, ns: str, **_kw: Any) -> JSON:
        self.deleted.append(f"{ns}/{name}")
        return {}


def setup(phase: str = "Running") -> tuple[WorkloadSync, CountingSlurm, Kube, Store, list[int]]:
    """One bound pod `ns/p` with the finalizer and a RUNNING job 7 naming it."""
    slurm = CountingSlurm()
    pods = Store({BY_JOB: index_job})
    pod = make_pod("p", "u1")
    pod["metadata"]["labels"][SLURM_JOBID] = "7"
    pod["metadata"]["finalizers"] = [FINALIZER]
    pod["spec"]["nodeName"] = "n1"
    pod["status"]["phase"] = phase
    pods.upsert(pod)
    slurm.jobs[7] = {
        "job_id": 7,
        "job_state": ["RUNNING"],
        "nodes": "n1",
        "admin_comment": placeholder.admin_comment([pod], CONFIG),
    }
    kube = Kube(pods)
    changed: list[int] = []
    sync = WorkloadSync(
        kube,  # type: ignore[arg-type]
        config=CONFIG,
        pods=SimpleNamespace(store=pods),  # type: ignore[arg-type]
        slurm=SimpleNamespace(  # type: ignore[arg-type]
            client=slurm,
            informer=SimpleNamespace(poke=lambda: None),
            slurmctld=SlurmctldStart(slurm),  # type: ignore[arg-type]
        ),
        watch=JobWatch(slurm, on_change=changed.append),  # type: ignore[arg-type]
        recorder=SimpleNamespace(event=lambda *a, **k: None),  # type: ignore[arg-type]
    )
    return sync, slurm, kube, pods, changed


async def test_a_finished_pod_left_in_place_costs_slurm_nothing_once_settled() -> None:
    sync, slurm, _kube, pods, changed = setup(phase="Succeeded")
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7]
    assert pods.get("ns/p")["metadata"]["finalizers"] == []  # type: ignore[index]
    reads = len(slurm.reads)
    for _ in range(5):  # the finalizer's removal, a resync: the pod comes back, as it stays
        await sync.reconcile("ns/p")
    assert len(slurm.reads) == reads
    assert changed == []  # nothing re-queues the pod
    assert sync.watch.tracked == 0


async def test_a_job_read_for_a_cancel_is_not_reported_back_as_a_change() -> None:
    """The loop behind the flood: a read of a job the watch does not track told the
    controller "changed", which reconciled the pod, which read the job again."""
    sync, slurm, _kube, _pods, changed = setup()
    assert await sync.watch.read(7) is not None
    slurm.jobs.clear()  # purged by Slurm
    assert await sync.watch.read(7) is None
    assert changed == []
    sync.watch.track(7)
    await sync.watch.read(7)
    assert changed == [7]  # a tracked job still says what it became


async def test_a_deleted_pods_job_whose_cancel_failed_is_cancelled_on_the_retry() -> None:
    sync, slurm, _kube, pods, _changed = setup()
    pods.delete("ns/p")
    sync.gone["ns/p"] = (7, "u1")
    slurm.refuse_cancel = True
    with contextlib.suppress(errors.SlurmUnavailable):  # the controller retries with backoff
        await sync.reconcile("ns/p")
    assert slurm.cancelled == []
    slurm.refuse_cancel = False
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7]
    assert sync.gone == {}


async def test_a_deleted_pods_job_is_cancelled_when_a_new_pod_of_its_name_came_first() -> None:
    """A StatefulSet-style pod made again under the same name before the deletion was
    reconciled: the key finds the new pod in the cache, and the old pod's job must not wait
    for the orphan sweep (a minute or more, and only after slurmctld restarted)."""
    sync, slurm, _kube, pods, _changed = setup()
    pods.delete("ns/p")
    sync.gone["ns/p"] = (7, "u1")
    again = make_pod("p", "u2")  # same name, new UID, not scheduled yet
    pods.upsert(again)
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7]
    assert sync.gone == {}


async def test_a_bound_pod_whose_job_is_pending_again_or_suspended_is_deleted() -> None:
    """A requeue (an admin's, or a slurmctld restart that lost the allocation) or a suspend
    leaves the pod running where Slurm thinks nothing runs: the node would be booked twice."""
    for state in ("PENDING", "SUSPENDED"):
        sync, slurm, kube, _pods, _changed = setup()
        slurm.jobs[7]["job_state"] = [state]
        await sync.reconcile("ns/p")
        assert kube.deleted == ["ns/p"], state
        assert slurm.cancelled == []  # cancelled once the pod stopped (pod_finished)


async def test_an_unbound_pod_whose_job_slurm_lost_is_left_to_the_scheduler() -> None:
    sync, slurm, kube, pods, _changed = setup()
    pods.get("ns/p")["spec"]["nodeName"] = ""  # type: ignore[index]
    del slurm.jobs[7]  # a slurmctld crash lost the submission
    await sync.reconcile("ns/p")
    assert kube.deleted == []
    pods.get("ns/p")["spec"]["nodeName"] = "n1"  # type: ignore[index]
    await sync.reconcile("ns/p")  # bound: it runs without a job, so it goes
    assert kube.deleted == ["ns/p"]


async def test_a_cancelled_job_slurm_brought_back_is_cancelled_again_unless_its_pod_runs() -> None:
    sync, slurm, _kube, pods, _changed = setup(phase="Succeeded")
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7]
    slurm.jobs[7]["job_state"] = ["RUNNING"]  # slurmctld restarted from older state
    await sync.reconcile(f"{REVIVED_PREFIX}7")
    assert slurm.cancelled == [7, 7]

    sync, slurm, _kube, pods, _changed = setup()  # its pod still runs: not an orphan
    await sync.reconcile(f"{REVIVED_PREFIX}7")
    assert slurm.cancelled == []
    pods.delete("ns/p")
    await sync.reconcile(f"{REVIVED_PREFIX}7")
    assert slurm.cancelled == [7]


async def test_a_just_bound_pod_is_not_deleted_on_a_read_of_its_job_from_before_allocation() -> (
    None
):
    """The watch read the job while it pended; the scheduler bound the pod once Slurm
    allocated it: the old read must not make the pod look like it runs without its job."""
    sync, slurm, kube, _pods, _changed = setup()
    slurm.jobs[7]["job_state"] = ["PENDING"]
    sync.watch.track(7)
    await sync.watch.read(7)  # cached: PENDING
    slurm.jobs[7]["job_state"] = ["RUNNING"]  # allocated; the pod was bound meanwhile
    await sync.reconcile("ns/p")
    assert kube.deleted == []


def test_a_job_allocated_as_its_user_but_never_marked_as_ours_is_unconfirmed() -> None:
    """The scheduler stopped between the allocation (mark in `comment`) and writing
    admin_comment: no pod was bound to it, so it is cancelled at the next start."""
    mark = placeholder.admin_comment([make_pod("p", "u1")], CONFIG)
    assert unconfirmed(Job.parse({"job_id": 1, "comment": mark}), CONFIG)
    assert not unconfirmed(Job.parse({"job_id": 2, "comment": mark, "admin_comment": mark}), CONFIG)
    assert not unconfirmed(Job.parse({"job_id": 3, "comment": "a user's note"}), CONFIG)
    other = placeholder.admin_comment([make_pod("p", "u1")], replace(CONFIG, cluster_id="other"))
    assert not unconfirmed(Job.parse({"job_id": 4, "comment": other}), CONFIG)


async def test_a_pod_that_only_carries_the_job_id_in_a_label_does_not_keep_the_job_alive() -> None:
    """A forger's pod (another namespace, the bridge's scheduler named, the label patched
    in) is not a pod of the job: the real pod's end cancels it, and its end deletes only
    pods its admin_comment names."""
    sync, slurm, kube, pods, _changed = setup(phase="Succeeded")
    forger = make_pod("forged", "u9")
    forger["metadata"]["namespace"] = "elsewhere"
    forger["metadata"]["labels"][SLURM_JOBID] = "7"
    pods.upsert(forger)
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7]
    slurm.jobs[7]["job_state"] = ["CANCELLED"]
    sync.watch.jobs.pop(7, None)
    await sync.reconcile("elsewhere/forged")
    assert kube.deleted == []


async def test_an_allocation_never_marked_as_ours_is_cancelled_once_no_scheduler_can_mark_it() -> (
    None
):
    """Found at start: a young one may be being marked right now (the scheduler of another
    replica), so it is looked at again after the grace; an old one is cancelled."""
    sync, slurm, _kube, _pods, _changed = setup()
    mark = placeholder.admin_comment([make_pod("x", "ux")], CONFIG)
    now = time.time()
    for job_id, age in ((20, 5.0), (21, 600.0)):
        slurm.jobs[job_id] = {
            "job_id": job_id,
            "job_state": ["RUNNING"],
            "nodes": "n2",
            "comment": mark,
            "submit_time": {"set": True, "number": int(now - age)},
        }
    queued: list[str] = []
    sync.enqueue = queued.append
    await sync.cancel_orphans()
    assert sorted(queued) == [f"{UNCONFIRMED_PREFIX}20", f"{UNCONFIRMED_PREFIX}21"]
    young = await sync.reconcile(f"{UNCONFIRMED_PREFIX}20")
    assert young.requeue_after is not None and 50 <= young.requeue_after <= 56
    await sync.reconcile(f"{UNCONFIRMED_PREFIX}21")
    assert slurm.cancelled == [21]


async def test_a_job_slurm_revived_for_a_pod_that_ended_long_ago_is_cancelled_by_the_sweep() -> (
    None
):
    """The soak: pod p75 Succeeded (left in place), its job cancelled; slurmctld was killed
    -9 and came back with the job RUNNING from saved state, and no process followed it any
    more (the bridge had been restarted): the job held kwok-1 for 27 minutes and a gang
    waited behind it. The sweep after slurmctld's node list cancels it; a running pod's job
    is kept."""
    sync, slurm, _kube, pods, _changed = setup(phase="Succeeded")
    running = make_pod("q", "u2")
    running["metadata"]["labels"][SLURM_JOBID] = "8"
    running["spec"]["nodeName"] = "n2"
    running["status"]["phase"] = "Running"
    pods.upsert(running)
    slurm.jobs[8] = {
        "job_id": 8,
        "job_state": ["RUNNING"],
        "nodes": "n2",
        "admin_comment": placeholder.admin_comment([running], CONFIG),
    }
    await sync.reconcile(ORPHANS_KEY)
    assert slurm.cancelled == [7]


async def test_a_finished_pods_job_id_given_to_another_job_is_not_cancelled() -> None:
    """The watch holds job 7 as the pod's, RUNNING; slurmctld restarted from older state
    and gave 7 to another user's job, RUNNING too. The pod ends: its cancel reads the job
    first and leaves the other user's job alone."""
    sync, slurm, _kube, pods, _changed = setup()
    await sync.reconcile("ns/p")  # running: the watch reads and keeps job 7
    assert 7 in sync.watch.jobs and slurm.cancelled == []
    slurm.jobs[7] = {"job_id": 7, "job_state": ["RUNNING"], "nodes": "n1", "user_id": "1234"}
    pod = pods.get("ns/p")
    assert pod is not None
    pod["status"]["phase"] = "Succeeded"
    pods.upsert(pod)
    await sync.reconcile("ns/p")
    assert slurm.cancelled == []
    assert pods.get("ns/p")["metadata"]["finalizers"] == []  # type: ignore[index]


def aged(sync: WorkloadSync) -> None:
    """As if the last answer about slurmctld's start were a sweep's time ago (a minute)."""
    sync.slurm.slurmctld.asked_at = -float("inf")


async def test_the_sweep_lists_the_jobs_only_after_slurmctld_started_again() -> None:
    """slurmctld returns its node list whenever a node changed, which in a burst is every
    poll: each sweep read the whole job list (every job of every user), 3.6 s of slurmrestd
    in a 500-pod burst. One small `diag` tells whether slurmctld started since (its stats'
    start); only then is the list read."""
    sync, slurm, _kube, _pods, _changed = setup(phase="Succeeded")
    await sync.cancel_orphans()  # at start
    assert slurm.lists == 1 and slurm.cancelled == [7]
    aged(sync)
    await sync.reconcile(ORPHANS_KEY)  # a node changed: slurmctld is the same
    assert slurm.lists == 1 and slurm.diags == 2  # one small request per look
    slurm.jobs[7]["job_state"] = ["RUNNING"]  # back from state saved before the cancel
    slurm.started += 60  # kill -9 and back
    slurm.refuse_cancel = True  # the sweep fails halfway: made again at the next chance
    aged(sync)
    with pytest.raises(errors.SlurmUnavailable):
        await sync.reconcile(ORPHANS_KEY)
    slurm.refuse_cancel = False
    diags = slurm.diags
    aged(sync)
    await sync.reconcile(ORPHANS_KEY)
    assert slurm.lists == 3 and slurm.cancelled == [7, 7]
    assert slurm.diags == diags + 1  # asked once for a sweep that lists


def pending_job(job_id: int, comment: str) -> JSON:
    return {"job_id": job_id, "job_state": ["PENDING"], "nodes": "", "admin_comment": comment}


async def test_a_nudge_writes_a_pending_jobs_admin_comment_back_unchanged() -> None:
    """A cancelled job freed its node: a pending job of ours gets its own admin_comment
    written again, which starts Slurm's scheduling pass."""
    sync, slurm, _kube, _pods, _ = setup(phase="Succeeded")
    ours = placeholder.admin_comment([make_pod("w", "u2")], CONFIG)
    slurm.jobs[8] = pending_job(8, ours)
    sync.watch.track(8)
    sync.watch.jobs[8] = slurm.job(8)
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7]
    assert slurm.updates == [(8, {"admin_comment": ours})]


async def test_a_nudge_goes_to_the_next_pending_job_when_the_first_has_started_since() -> None:
    """The hand-over bench: Slurm's pass started job 8 just before the cancel freed another
    node; the nudge found 8 no longer pending and gave up, and the freed node stood idle 7 s
    until Slurm's next pass. Job 9, still pending, takes the nudge."""
    sync, slurm, _kube, _pods, _ = setup(phase="Succeeded")
    comments = {j: placeholder.admin_comment([make_pod(f"w{j}", f"u{j}")], CONFIG) for j in (8, 9)}
    for j, comment in comments.items():
        slurm.jobs[j] = pending_job(j, comment)
        sync.watch.track(j)
        sync.watch.jobs[j] = slurm.job(j)
    slurm.allocate(8, "n2")  # started by Slurm; the watch has not seen it yet
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7]
    assert slurm.updates == [(9, {"admin_comment": comments[9]})]


async def test_a_groups_pods_ending_together_cancel_its_job_once() -> None:
    """The gang bench: eight pods of one job ended at once and each sent its own DELETE."""
    sync, slurm, _kube, pods, _ = setup(phase="Succeeded")
    first = pods.get("ns/p")
    assert first is not None
    others = []
    for i in range(3):
        other = make_pod(f"q{i}", f"u{i + 2}")
        other["metadata"]["labels"][SLURM_JOBID] = "7"
        other["metadata"]["finalizers"] = [FINALIZER]
        other["spec"]["nodeName"] = f"n{i + 2}"
        other["status"]["phase"] = "Succeeded"
        pods.upsert(other)
        others.append(other)
    slurm.jobs[7]["admin_comment"] = placeholder.admin_comment([first, *others], CONFIG)
    cancel = slurm.cancel_job

    async def slow_cancel(job_id: int) -> None:
        await asyncio.sleep(0.01)  # the DELETE's round trip: the others read the job meanwhile
        await cancel(job_id)

    slurm.cancel_job = slow_cancel  # type: ignore[method-assign]
    await asyncio.gather(*(sync.reconcile(k) for k in ["ns/p", "ns/q0", "ns/q1", "ns/q2"]))
    assert slurm.cancelled == [7]
    assert all(p["metadata"]["finalizers"] == [] for p in [first, *others])


async def test_a_nudge_never_writes_a_cached_comment_onto_a_job_that_took_its_id() -> None:
    """The watch still holds a pending job of ours read before slurmctld restarted from an
    older state save and gave its id to another job. Writing the cached admin_comment on
    that job would make it ours, and the node Slurm gives it our pod's: nothing is written."""
    sync, slurm, _kube, _pods, _ = setup(phase="Succeeded")
    ours = placeholder.admin_comment([make_pod("w", "u2")], CONFIG)
    sync.watch.track(8)
    sync.watch.jobs[8] = Job.parse(pending_job(8, ours))  # read before the restart
    others = [make_pod(f"h-{i}", f"v{i}") for i in range(2)]
    theirs = placeholder.admin_comment(others, CONFIG)
    slurm.jobs[8] = pending_job(8, theirs)
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7]
    assert slurm.jobs[8]["admin_comment"] == theirs, "another job's admin_comment overwritten"
    assert slurm.updates == []


async def test_a_bound_pod_whose_job_id_was_given_to_another_job_loses_its_pod() -> None:
    """The chaos soak's gang: bound on job 7; slurmctld, killed, came back from state saved
    before job 7 and gave 7 to another pod's job, RUNNING elsewhere. The pod runs where no
    job of its own holds the node: it goes (as when Slurm lost its job); the other job is
    never cancelled."""
    sync, slurm, kube, _pods, changed = setup()
    sync.watch.track(7)
    await sync.watch.read(7)  # the watch's read of the pod's own job 7
    other = make_pod("other", "u2")
    slurm.jobs[7] = {
        "job_id": 7,
        "job_state": ["RUNNING"],  # the same state: only the comment tells the change
        "nodes": "n2",
        "admin_comment": placeholder.admin_comment([other], CONFIG),
    }
    changed.clear()
    await sync.watch.read(7)
    assert changed == [7], "a read of another job under the same id is a change"
    await sync.reconcile("ns/p")
    assert kube.deleted == ["ns/p"]
    assert slurm.cancelled == []


async def test_a_bound_pods_job_under_a_changed_bridge_identity_is_still_its_own() -> None:
    """The bridge's scheduler name or cluster id changed while the pod ran: its job's
    comment still names the pod by name and UID, so the pod stays (no config change ever
    takes a running pod for one that lost its job)."""
    sync, slurm, kube, pods, _changed = setup()
    pod = pods.get("ns/p")
    assert pod is not None
    slurm.jobs[7]["admin_comment"] = placeholder.admin_comment(
        [pod], replace(CONFIG, cluster_id="before-the-change")
    )
    await sync.reconcile("ns/p")
    assert kube.deleted == []
    assert slurm.cancelled == []


async def test_a_bound_pod_is_not_deleted_on_a_stale_read_of_another_job() -> None:
    """Only a fresh read may say the id names another job: a cached one may be of a job the
    id named before the pod's."""
    sync, slurm, kube, _pods, _changed = setup()
    sync.watch.track(7)
    slurm.jobs[7]["admin_comment"] = placeholder.admin_comment([make_pod("old", "u0")], CONFIG)
    await sync.watch.read(7)  # cached: another job's comment
    pod = _pods.get("ns/p")
    slurm.jobs[7]["admin_comment"] = placeholder.admin_comment([pod], CONFIG)  # type: ignore[list-item]
    await sync.reconcile("ns/p")
    assert kube.deleted == []


async def test_a_job_the_scheduler_just_read_is_not_read_again_for_its_pod() -> None:
    """The workload controller looks at a pod as soon as it is labelled, a moment after the
    scheduler read the pod's job: that read is lent (half the job reads of a 500-pod burst
    were these), and only for a while."""
    sync, slurm, _kube, _pods, _changed = setup()
    recent = RecentReads()
    scheduler_watch = JobWatch(slurm, on_change=lambda _: None, recent=recent)  # type: ignore[arg-type]
    sync.watch = JobWatch(slurm, on_change=lambda _: None, recent=recent)  # type: ignore[arg-type]
    scheduler_watch.adopt(7, await slurm.get_job(7))  # as the scheduler does, allocating it
    slurm.reads.clear()
    assert await sync.reconcile("ns/p") is not None
    assert slurm.reads == [] and sync.watch.jobs[7] is not None  # kept as its own read
    # Its state is looked at soon all the same (an end since that read sent its node event
    # while this watch did not follow the job).
    assert sync.watch._next[7] <= time.monotonic() + FIRST_READ_S
    # An older read is not lent: the job is read.
    sync.watch.untrack(7)
    recent.max_age = 0.0
    await sync.job(7)
    assert slurm.reads == [7]


def test_a_job_slurm_no_longer_knows_is_not_lent_as_it_was() -> None:
    recent = RecentReads()
    recent.put(7, Job.parse({"job_id": 7, "job_state": ["RUNNING"]}))
    assert recent.get(7) is not None
    recent.put(7, None)
    assert recent.get(7) is None


def bound_by_annotation_only(pods: Store) -> None:
    """`ns/p` as bound by a scheduler whose label and finalizer after the binding were never
    written: the job id only in the annotation its Binding carried."""
    pod = pods.get("ns/p")
    assert pod is not None
    pod["metadata"]["labels"].pop(SLURM_JOBID)
    pod["metadata"]["finalizers"] = []
    pod["metadata"]["annotations"] = {SLURM_JOBID_ANNOTATION: "7"}
    pods.upsert(pod)


async def test_a_pod_bound_without_its_label_gets_it_and_the_finalizer_after_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sync, slurm, kube, pods, _changed = setup()
    bound_by_annotation_only(pods)
    first = await sync.reconcile("ns/p")
    # The scheduler labels such a pod just after binding it: not written twice at once.
    assert first.requeue_after == ADOPT_AFTER_S and kube.writes == []
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + ADOPT_AFTER_S)
    assert await sync.reconcile("ns/p") == DONE
    pod = pods.get("ns/p")
    assert pod is not None and pod["metadata"]["labels"][SLURM_JOBID] == "7"
    assert pod["metadata"]["finalizers"] == [FINALIZER] and slurm.cancelled == []
    assert sync.unlabelled_since == {}


async def test_a_pod_bound_without_its_label_that_ended_has_its_job_cancelled() -> None:
    """No finalizer and no label: not a pod settled earlier, whose job was cancelled before
    the finalizer went; its job is cancelled now."""
    sync, slurm, _kube, pods, _changed = setup(phase="Succeeded")
    bound_by_annotation_only(pods)
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7]


async def test_a_job_id_annotation_on_a_pod_not_bound_names_no_job() -> None:
    sync, slurm, kube, pods, _changed = setup()
    bound_by_annotation_only(pods)
    pod = pods.get("ns/p")
    assert pod is not None
    pod["spec"].pop("nodeName")
    pods.upsert(pod)
    assert await sync.reconcile("ns/p") == DONE
    assert kube.writes == [] and slurm.reads == [] and slurm.cancelled == []


async def test_a_failed_adoption_does_not_keep_a_pod_whose_job_ended_running(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sync, slurm, kube, pods, _changed = setup()
    bound_by_annotation_only(pods)
    await sync.reconcile("ns/p")
    now = time.monotonic()
    monkeypatch.setattr(time, "monotonic", lambda: now + ADOPT_AFTER_S)

    async def refuse(*_a: Any, **_k: Any) -> JSON:
        raise rest.ApiError(500, "InternalError", "webhook down")

    kube.patch = refuse  # type: ignore[method-assign]
    slurm.jobs[7]["job_state"] = ["CANCELLED"]  # scancel
    sync.watch.jobs.pop(7, None)
    await sync.reconcile("ns/p")
    assert kube.deleted == ["ns/p"]  # the job's end still deletes the pod


async def test_an_ended_gang_pod_and_its_running_sibling_do_not_wake_each_other_for_ever() -> None:
    """The CI wedge: a gang pod that ended (finalizer gone, label kept) untracked the job its
    running sibling still held; the sibling took the job back from the scheduler's recent read
    (which renewed that read's age) and told both pods "changed"; so on, through a work queue
    that never ran dry, with no request between: the event loop never turned again (no
    Lease renewal, no probe, no SIGTERM). Real controller and work queue; a guard ends the
    spin so that the test can fail instead of hanging."""
    slurm = CountingSlurm()
    pods = Store({BY_JOB: index_job})
    ended, running = make_pod("g-1", "u1"), make_pod("g-0", "u0")
    for pod, node in ((ended, "kwok-0"), (running, "n1")):
        pod["metadata"]["labels"][SLURM_JOBID] = "7"
        pod["spec"]["nodeName"] = node
    ended["status"]["phase"] = "Succeeded"
    running["metadata"]["finalizers"] = [FINALIZER]
    running["status"]["phase"] = "Running"
    pods.upsert(ended)
    pods.upsert(running)
    slurm.jobs[7] = {
        "job_id": 7,
        "job_state": ["RUNNING"],
        "nodes": "kwok-0,n1",
        "admin_comment": placeholder.admin_comment([running, ended], CONFIG),
    }
    recent = RecentReads()
    recent.put(7, Job.parse(slurm.jobs[7]))  # the scheduler read it a moment ago

    def on_change(job_id: int) -> None:
        for p in pods.by_index(BY_JOB, str(job_id)):
            ctrl.enqueue(f"ns/{p['metadata']['name']}")

    sync = WorkloadSync(
        Kube(pods),  # type: ignore[arg-type]
        config=CONFIG,
        pods=SimpleNamespace(store=pods),  # type: ignore[arg-type]
        slurm=SimpleNamespace(  # type: ignore[arg-type]
            client=slurm,
            informer=SimpleNamespace(poke=lambda: None),
            slurmctld=SlurmctldStart(slurm),  # type: ignore[arg-type]
        ),
        watch=JobWatch(slurm, on_change=on_change, recent=recent),  # type: ignore[arg-type]
        recorder=SimpleNamespace(event=lambda *a, **k: None),  # type: ignore[arg-type]
    )
    reconciles = 0

    class Guarded:
        async def reconcile(self, key: str) -> Any:
            nonlocal reconciles
            reconciles += 1
            if reconciles > 200:
                raise RuntimeError("spinning")  # retried with backoff: the loop turns again
            return await sync.reconcile(key)

    ctrl = Controller("workload-test", Guarded(), workers=1)
    runner = asyncio.create_task(ctrl.run())
    try:
        ctrl.enqueue("ns/g-1")
        ctrl.enqueue("ns/g-0")
        for _ in range(20):
            await asyncio.sleep(0.01)
    finally:
        runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await runner
    assert reconciles < 10
    assert sync.watch.tracked == 1  # the running pod's job is still followed
    assert slurm.cancelled == []


async def test_a_settled_gang_pod_does_not_stop_the_following_of_a_job_its_sibling_cancelled() -> (
    None
):
    """The last pod of a gang to end cancels the job, which is then followed until Slurm
    purges it (a revival is cancelled again); the pod that ended first coming back must not
    end that following."""
    sync, slurm, _kube, pods, _changed = setup(phase="Succeeded")
    sync.watch.on_revived = lambda _job_id: None
    first = make_pod("q", "u2")
    first["metadata"]["labels"][SLURM_JOBID] = "7"
    first["spec"]["nodeName"] = "n2"
    first["status"]["phase"] = "Succeeded"
    pods.upsert(first)
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7] and sync.watch.is_following(7)
    await sync.reconcile("ns/q")
    assert sync.watch.is_following(7)
