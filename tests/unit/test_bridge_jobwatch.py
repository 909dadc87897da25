"""The job watch reads only the jobs it tracks, tells when one changed, and reads pending
jobs again at once when a Slurm node changed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from slinky.bridge import jobwatch
from slinky.bridge.jobwatch import FAST_READS, FIRST_READ_S, JobWatch, pass_looks
from slinky.slurm import errors
from slinky.slurm.models import Job
from slinky.slurm.started import SlurmctldStart


class FakeSlurm:
    """get_job and job_states: the calls the watch may make. `reads`: full reads;
    `looks`: every job asked about, either way; `state_requests`: the batched calls."""

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.reads: list[int] = []
        self.looks: list[int] = []
        self.state_requests: list[list[int]] = []

    async def job_states(self, job_ids: list[int]) -> dict[int, list[str]]:
        self.state_requests.append(list(job_ids))
        self.looks += job_ids
        return {j: self.jobs[j].state for j in job_ids if j in self.jobs}

    def set(self, job_id: int, state: str, nodes: str = "") -> None:
        self.jobs[job_id] = Job.parse({"job_id": job_id, "job_state": [state], "nodes": nodes})

    async def get_job(self, job_id: int) -> Job:
        self.reads.append(job_id)
        if job_id not in self.jobs:
            raise errors.SlurmNotFound(f"job {job_id} not found")
        return self.jobs[job_id]


async def until(check: Any, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def test_a_tracked_job_is_read_and_its_changes_reported() -> None:
    slurm = FakeSlurm()
    slurm.set(1, "PENDING")
    slurm.set(2, "RUNNING", "n1")  # not tracked: never read
    changed: list[int] = []
    watch = JobWatch(slurm, on_change=changed.append, max_interval=60.0)  # type: ignore[arg-type]
    watch.start()
    try:
        watch.track(1)
        await until(lambda: changed == [1])
        slurm.set(1, "RUNNING", "n1")
        watch.node_changed("n1")  # a node event makes pending jobs due at once
        await until(lambda: changed == [1, 1])
        assert watch.jobs[1] is not None and watch.jobs[1].nodes == "n1"
        del slurm.jobs[1]
        watch.node_changed("n1")  # and jobs on that node
        await until(lambda: changed == [1, 1, 1])
        assert watch.jobs[1] is None
        assert 2 not in slurm.reads
    finally:
        await watch.stop()


async def test_a_pending_jobs_new_reason_is_told() -> None:
    """The pod's condition says why its job waits: Slurm's reason moving from Priority to
    Resources is a change to tell (the pod said Priority for good before)."""

    def pending(reason: str) -> Job:
        return Job.parse({"job_id": 1, "job_state": ["PENDING"], "state_reason": reason})

    slurm = FakeSlurm()
    slurm.jobs[1] = pending("Priority")
    changed: list[int] = []
    watch = JobWatch(slurm, on_change=changed.append, max_interval=60.0)  # type: ignore[arg-type]
    watch.track(1)
    await watch.read(1)
    await watch.read(1)
    assert changed == [1]  # the same reason again is no change
    slurm.jobs[1] = pending("Resources")
    await watch.read(1)
    assert changed == [1, 1]


async def test_an_unchanged_running_job_waits_for_the_backstop_interval() -> None:
    slurm = FakeSlurm()
    slurm.set(1, "RUNNING", "n1")
    watch = JobWatch(slurm, on_change=lambda _: None, max_interval=60.0)  # type: ignore[arg-type]
    watch.start()
    try:
        watch.track(1)
        await until(lambda: len(slurm.reads) == 1)
        await asyncio.sleep(0.3)
        assert len(slurm.reads) == 1
        watch.node_changed("other-node")  # not its node, and it is not pending
        await asyncio.sleep(0.2)
        assert len(slurm.reads) == 1
        watch.untrack(1)
        watch.node_changed("n1")
        await asyncio.sleep(0.2)
        assert len(slurm.reads) == 1
    finally:
        await watch.stop()


async def test_a_node_list_change_without_a_node_event_reads_the_pending_jobs_again() -> None:
    slurm = FakeSlurm()
    slurm.set(1, "PENDING")
    slurm.set(2, "RUNNING", "n1")
    changed: list[int] = []
    watch = JobWatch(slurm, on_change=changed.append, max_interval=60.0)  # type: ignore[arg-type]
    watch.start()
    try:
        watch.track(1)
        watch.track(2)
        await until(lambda: sorted(changed) == [1, 2])
        reads = len(slurm.reads)
        slurm.set(1, "RUNNING", "n2")  # handed a node between two polls
        watch.pending_due()
        await until(lambda: changed.count(1) == 2)
        assert slurm.reads[reads:] == [1]  # the running job is not read again
    finally:
        await watch.stop()


async def test_a_job_just_submitted_is_read_often_before_the_reads_back_off() -> None:
    slurm = FakeSlurm()
    slurm.set(1, "PENDING")
    slurm.set(2, "PENDING")
    watch = JobWatch(slurm, on_change=lambda _: None, max_interval=60.0)  # type: ignore[arg-type]
    watch.start()
    try:
        watch.track(1, fresh=True)
        watch.track(2)
        await until(lambda: slurm.looks.count(1) >= 5 and slurm.looks.count(2) >= 3)
        assert watch._interval[1] == FIRST_READ_S  # still fast
        assert watch._interval[2] > FIRST_READ_S  # backing off
        await until(lambda: slurm.looks.count(1) > FAST_READS)
        assert watch._interval[1] > FIRST_READ_S  # its fast reads used up: backing off too
    finally:
        await watch.stop()


async def test_a_job_read_running_by_hand_is_not_read_fast_again() -> None:
    """A job allocated inside the request is read once by the scheduler: the watch then
    waits for the backstop (or a node event), not for its fast first-second reads."""
    slurm = FakeSlurm()
    slurm.set(1, "RUNNING", "n1")
    watch = JobWatch(slurm, on_change=lambda _: None, max_interval=60.0)  # type: ignore[arg-type]
    watch.track(1, fresh=True)
    await watch.read(1)
    assert watch._interval[1] == 60.0
    assert 1 not in watch._fast
    watch.node_changed("n1")  # an event still makes it due at once
    assert watch._next[1] <= asyncio.get_running_loop().time() + 0.001


async def test_an_event_during_a_read_by_hand_keeps_the_job_due() -> None:
    slurm = FakeSlurm()
    slurm.set(1, "RUNNING", "n1")
    watch = JobWatch(slurm, on_change=lambda _: None, max_interval=60.0)  # type: ignore[arg-type]
    watch.track(1)
    real = slurm.get_job

    async def get_job(job_id: int) -> Job:
        watch.node_changed("n1")  # the node changed while the request was under way
        return await real(job_id)

    slurm.get_job = get_job  # type: ignore[method-assign]
    await watch.read(1)
    assert watch._interval[1] == FIRST_READ_S  # still due soon: the event is not lost


async def test_jobs_due_together_are_asked_in_one_request_and_read_only_when_changed() -> None:
    slurm = FakeSlurm()
    for j in (1, 2, 3):
        slurm.set(j, "RUNNING", "n1")
    changed: list[int] = []
    watch = JobWatch(slurm, on_change=changed.append, max_interval=60.0)  # type: ignore[arg-type]
    watch.start()
    try:
        for j in (1, 2, 3):
            watch.track(j)
        await until(lambda: sorted(changed) == [1, 2, 3])
        assert slurm.state_requests[0] == [1, 2, 3]  # one request for the three
        reads, requests = len(slurm.reads), len(slurm.state_requests)
        slurm.set(2, "COMPLETED", "n1")
        del slurm.jobs[3]  # purged: missing from the answer, so read once on its own
        watch.node_changed("n1")
        await until(lambda: changed.count(2) == 2 and changed.count(3) == 2)
        # job 1 unchanged: its state was enough; job 3 is gone only on Slurm's own word
        assert sorted(slurm.reads[reads:]) == [2, 3]
        assert len(slurm.state_requests) == requests + 1
        assert watch.jobs[3] is None
        watch.node_changed("n1")  # gone for good: no read again
        await until(lambda: len(slurm.state_requests) == requests + 2)
        assert sorted(slurm.reads[reads:]) == [2, 3]
    finally:
        await watch.stop()


async def test_jobs_holding_their_nodes_share_one_look_a_tick() -> None:
    slurm = FakeSlurm()
    slurm.set(1, "RUNNING", "n1")
    slurm.set(2, "RUNNING", "n2")
    watch = JobWatch(  # type: ignore[arg-type]
        slurm, on_change=lambda _: None, max_interval=0.1, settled_interval=0.5
    )
    watch.start()
    try:
        watch.track(1)
        await until(lambda: 1 in watch.jobs)
        await asyncio.sleep(0.13)  # tracked at another moment
        watch.track(2)
        await until(lambda: 2 in watch.jobs)
        start = len(slurm.state_requests)
        await until(lambda: len(slurm.state_requests) >= start + 2, timeout=5)
        assert all(sorted(r) == [1, 2] for r in slurm.state_requests[start : start + 2])
    finally:
        await watch.stop()


def following_watch(slurm: FakeSlurm, revived: list[int]) -> JobWatch:
    """A watch that follows cancelled jobs on a fast settled tick, revivals into `revived`."""
    return JobWatch(  # type: ignore[arg-type]
        slurm,
        on_change=lambda _: None,
        on_revived=revived.append,
        max_interval=0.05,
        settled_interval=0.1,
    )


async def test_a_cancelled_job_is_followed_until_purged_and_a_revived_one_is_told() -> None:
    slurm = FakeSlurm()
    slurm.set(1, "CANCELLED", "n1")
    slurm.set(2, "CANCELLED", "n2")
    revived: list[int] = []
    watch = following_watch(slurm, revived)
    watch.start()
    try:
        watch.follow_cancelled(1)
        watch.follow_cancelled(2)
        assert watch.tracked == 0 and watch.following == 2
        await until(lambda: slurm.looks.count(1) >= 2)
        slurm.set(1, "RUNNING", "n1")  # slurmctld came back from older state
        del slurm.jobs[2]  # purged
        await until(lambda: revived == [1] and watch.following == 0)
        assert slurm.reads == []  # followed with state requests only
    finally:
        await watch.stop()


async def test_a_state_read_asked_before_the_cancel_is_no_revival() -> None:
    """The bench: hundreds of pods ended at once; a batched state request asked while job 1
    still ran came back just after the workload controller cancelled it, saying RUNNING:
    'cancelled earlier, live again' and a read of the job, for each. Only a look asked
    after the cancel can tell a revival."""
    slurm = FakeSlurm()
    slurm.set(1, "RUNNING", "n1")
    revived: list[int] = []
    watch = following_watch(slurm, revived)
    gate, asked = asyncio.Event(), asyncio.Event()
    states = slurm.job_states

    async def slow_states(job_ids: list[int]) -> dict[int, list[str]]:
        answer = await states(job_ids)
        asked.set()
        await gate.wait()
        return answer

    slurm.job_states = slow_states  # type: ignore[method-assign]
    watch.start()
    try:
        watch.track(1)
        await asyncio.wait_for(asked.wait(), 5)  # the look is in flight, RUNNING read
        slurm.set(1, "CANCELLED", "n1")
        watch.follow_cancelled(1)
        gate.set()
        looks = len(slurm.looks)
        await until(lambda: len(slurm.looks) >= looks + 2)  # followed on, with fresh looks
        assert revived == []
        slurm.set(1, "RUNNING", "n1")  # a real revival is still told
        await until(lambda: revived == [1])
    finally:
        await watch.stop()


async def test_a_node_event_during_a_look_is_not_lost_to_the_settled_tick() -> None:
    """A running job is being looked at (its state read says RUNNING) when a node event
    comes, for the job's end: the look must not push it back to the settled tick (scancel
    of a placeholder job was seen a minute late, at the tick)."""
    slurm = FakeSlurm()
    slurm.set(1, "RUNNING", "n1")
    changed: list[int] = []
    watch = JobWatch(  # type: ignore[arg-type]
        slurm, on_change=changed.append, max_interval=3600.0, settled_interval=3600.0
    )
    gate = asyncio.Event()
    asked = asyncio.Event()
    states = slurm.job_states

    async def slow_states(job_ids: list[int]) -> dict[int, list[str]]:
        answer = await states(job_ids)  # read before the cancel
        asked.set()
        await gate.wait()
        return answer

    watch.start()
    try:
        watch.track(1)
        await until(lambda: changed == [1])  # read in full once: RUNNING on n1
        slurm.job_states = slow_states  # type: ignore[method-assign]
        watch.node_changed("n2")  # something else: a look of job 1 starts...
        watch._schedule(1, 0.0)
        await asyncio.wait_for(asked.wait(), 5)
        slurm.set(1, "CANCELLED", "n1")
        watch.node_changed("n1")  # ...and the cancel's node event comes during it
        gate.set()
        await until(lambda: changed == [1, 1])  # seen now, not at the tick an hour away
    finally:
        await watch.stop()


async def test_node_events_every_moment_do_not_flood_slurm_with_reads_of_pending_jobs() -> None:
    """Under chaos node events come every second or faster; with 20 pending jobs each event
    restarted every job's fast full reads (a soak saw 2,700-4,900 requests/min). Now a still
    pending job costs a share of one batched state request per look, is read in full at most
    every PENDING_FULL_READ_S, and events restart its fast looks at most every
    EVENT_MIN_GAP_S; an allocation is still seen within a moment of its event."""
    slurm = FakeSlurm()
    for j in range(1, 21):
        slurm.set(j, "PENDING")
    watch = JobWatch(  # type: ignore[arg-type]
        slurm, on_change=lambda _: None, max_interval=10.0
    )
    watch.start()
    try:
        for j in range(1, 21):
            watch.track(j)
        await until(lambda: all(j in watch.jobs for j in range(1, 21)))
        await asyncio.sleep(1.2)  # past the first-second fast reads
        reads, requests = len(slurm.reads), len(slurm.state_requests)
        for _ in range(15):  # 3 s of node events, five a second
            watch.node_changed("n9")
            await asyncio.sleep(0.2)
        assert len(slurm.reads) - reads == 0  # still pending: no full read within 10 s
        assert len(slurm.state_requests) - requests <= 15  # batched: ~5 per event burst
        slurm.set(7, "RUNNING", "n9")
        watch.node_changed("n9")
        await until(lambda: (job := watch.jobs.get(7)) is not None and job.is_running, 3.0)
    finally:
        await watch.stop()


async def test_a_node_list_change_looks_at_every_tracked_job_in_one_request() -> None:
    """slurmctld came back from a crash without an allocation the bridge had read (the node
    cache never showed it, so no node event): the job is seen PENDING at the next node list,
    not at the settled tick an hour later; the look is one batched state request. (The
    settled ticks fall on whole multiples of the interval of the monotonic clock: with a
    minute, one landed inside the test now and then and asked for 1 and 3 again.)"""
    slurm = FakeSlurm()
    for j in (1, 2, 3):
        slurm.set(j, "RUNNING", f"n{j}")
    changed: list[int] = []
    watch = JobWatch(  # type: ignore[arg-type]
        slurm, on_change=changed.append, max_interval=3600.0, settled_interval=3600.0
    )
    watch.start()
    try:
        for j in (1, 2, 3):
            watch.track(j)
        await until(lambda: sorted(changed) == [1, 2, 3])
        await until(lambda: all(watch._interval.get(j) == 3600.0 for j in (1, 2, 3)))  # settled
        requests, reads = len(slurm.state_requests), len(slurm.reads)
        slurm.set(2, "PENDING")
        watch.all_due()
        await until(lambda: changed.count(2) == 2)
        assert slurm.state_requests[requests:] == [[1, 2, 3]]
        assert slurm.reads[reads:] == [2]
    finally:
        await watch.stop()


def test_the_looks_after_slurms_passes_fall_just_after_the_next_whole_seconds() -> None:
    assert pass_looks(100.0, 1_000.25) == [100.78, 101.78]
    assert pass_looks(5.0, 7.0) == [5.03, 6.03]  # on a whole second: that pass is now


def fake_wall(monkeypatch: pytest.MonkeyPatch, fraction: float) -> None:
    """The watch's wall clock reads `fraction` past a whole second now, and runs on."""
    base, m0 = 1_000_000.0 + fraction, time.monotonic()
    monkeypatch.setattr(jobwatch, "_wall", lambda: base + (time.monotonic() - m0))


@contextlib.asynccontextmanager
async def watching_one_pending_job() -> AsyncIterator[tuple[FakeSlurm, JobWatch, list[float]]]:
    """A running watch of job 1, pending and read once; `seen`: when a change was told."""
    slurm = FakeSlurm()
    slurm.set(1, "PENDING")
    seen: list[float] = []
    watch = JobWatch(  # type: ignore[arg-type]
        slurm, on_change=lambda _: seen.append(time.monotonic()), max_interval=10.0
    )
    watch.start()
    try:
        watch.track(1)
        await until(lambda: 1 in watch.jobs)
        seen.clear()
        yield slurm, watch, seen
    finally:
        await watch.stop()


async def test_an_allocation_at_slurms_next_pass_is_seen_just_after_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pending job allocated by the pass 0.8 s after a node event (slurmctld's next whole
    second) is seen just after it; the doubling looks alone (0.7 s, then 1.5 s) saw it 0.7 s
    late (a hand-over bench run)."""
    async with watching_one_pending_job() as (slurm, watch, seen):
        fake_wall(monkeypatch, 0.2)  # the node event comes 0.8 s before the whole second
        t0 = time.monotonic()
        watch.node_changed("n1")
        await asyncio.sleep(0.8)  # Slurm's pass, at the whole second
        slurm.set(1, "RUNNING", "n1")
        await until(lambda: bool(seen), 3.0)
        assert seen[0] - t0 < 1.3, seen[0] - t0


async def test_an_event_inside_the_gap_still_looks_after_the_next_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second node event within EVENT_MIN_GAP_S of the first makes no burst of looks, but
    the allocation Slurm's next pass makes is still seen just after it, not on the doubled
    interval (which had grown to 1.6 s by then)."""
    async with watching_one_pending_job() as (slurm, watch, seen):
        fake_wall(monkeypatch, 0.5)
        watch.node_changed("n1")  # the first event: looks at 0, .1, .3, .53, .7, 1.5, ...
        await asyncio.sleep(1.6)
        seen.clear()
        fake_wall(monkeypatch, 0.2)  # the second event, 0.8 s before the next pass
        t1 = time.monotonic()
        watch.node_changed("n1")
        await asyncio.sleep(0.8)
        slurm.set(1, "RUNNING", "n1")
        await until(lambda: bool(seen), 5.0)
        assert seen[0] - t1 < 1.3, seen[0] - t1


def test_a_read_taken_on_loan_is_lent_no_longer_than_its_own_age(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A loan is the lender's read, as old as it is: taken by one watch, it must not be
    lent on as a fresh read (two watches passing one read back and forth would keep it
    young for ever, and nothing would ever read the job again)."""
    now = [1000.0]
    monkeypatch.setattr(jobwatch.time, "monotonic", lambda: now[0])
    slurm = FakeSlurm()
    slurm.set(7, "RUNNING", "n1")
    recent = jobwatch.RecentReads(max_age=2.0)
    workload = JobWatch(slurm, on_change=lambda _j: None, recent=recent)  # type: ignore[arg-type]
    recent.put(7, slurm.jobs[7])  # the scheduler's read
    now[0] += 1.5
    assert workload.borrow(7) is not None
    now[0] += 1.0  # the scheduler's read is 2.5 s old now
    assert recent.get(7) is None


class RestartingSlurm(FakeSlurm):
    """FakeSlurm with diag: `start` is when slurmctld started (req_time_start)."""

    def __init__(self) -> None:
        super().__init__()
        self.start = 1000
        self.diags = 0

    async def diag(self) -> dict[str, Any]:
        self.diags += 1
        return {"req_time_start": self.start}

    def own(self, job_id: int, state: str, nodes: str, comment: str) -> None:
        self.jobs[job_id] = Job.parse(
            {"job_id": job_id, "job_state": [state], "nodes": nodes, "admin_comment": comment}
        )


def age_out(watch: JobWatch) -> None:
    """As if the last start-time answer were older than START_RECHECK_S."""
    assert watch.slurmctld is not None
    watch.slurmctld.asked_at = -float("inf")


def settled_watch(slurm: RestartingSlurm, changed: list[int]) -> JobWatch:
    return JobWatch(  # type: ignore[arg-type]
        slurm,
        on_change=changed.append,
        max_interval=3600.0,
        settled_interval=3600.0,
        slurmctld=SlurmctldStart(slurm),  # type: ignore[arg-type]
    )


async def test_a_job_id_given_to_another_job_in_the_same_state_after_a_restart_is_a_change() -> (
    None
):
    """slurmctld restarted from state saved before job 1 and gave its id to another user's
    job, RUNNING as ours was: the state answer alone says "unchanged". The restart (diag's
    start time) makes the watch read every job in full, and the other owner is a change."""
    slurm = RestartingSlurm()
    slurm.own(1, "RUNNING", "n1", "ours")
    slurm.own(2, "RUNNING", "n2", "ours too")
    changed: list[int] = []
    watch = settled_watch(slurm, changed)
    watch.start()
    try:
        watch.track(1)
        watch.track(2)
        await until(lambda: sorted(changed) == [1, 2])
        await until(lambda: all(watch._interval.get(j) == 3600.0 for j in (1, 2)))  # settled
        # Without a restart, a node list's look is one state request and no full read.
        reads, requests = len(slurm.reads), len(slurm.state_requests)
        age_out(watch)
        watch.all_due()
        await until(lambda: len(slurm.state_requests) == requests + 1)
        assert slurm.diags == 2  # asked afresh after a node list
        assert slurm.reads[reads:] == []
        slurm.start = 2000
        slurm.own(1, "RUNNING", "n3", "someone else's")
        age_out(watch)
        watch.all_due()
        await until(lambda: changed.count(1) == 2)
        assert watch.jobs[1] is not None
        assert watch.jobs[1].raw["admin_comment"] == "someone else's"
        await until(lambda: len(slurm.reads) == reads + 2)  # both read in full, once
        assert sorted(slurm.reads[reads:]) == [1, 2]
        assert changed.count(2) == 1  # the same job: no change to tell
    finally:
        await watch.stop()


async def test_a_restart_seen_at_a_pending_jobs_look_makes_every_tracked_job_due() -> None:
    """A restart noticed by the look of one job (its start-time answer aged out) makes the
    settled jobs due at once, not at their tick an hour later."""
    slurm = RestartingSlurm()
    slurm.own(1, "RUNNING", "n1", "ours")
    changed: list[int] = []
    watch = settled_watch(slurm, changed)
    watch.start()
    try:
        watch.track(1)
        await until(lambda: changed == [1] and watch._interval.get(1) == 3600.0)
        slurm.start = 2000
        slurm.own(1, "RUNNING", "n1", "someone else's")
        slurm.own(5, "PENDING", "", "ours")
        age_out(watch)
        watch.track(5)
        await until(lambda: changed.count(1) == 2)
        assert watch.jobs[1] is not None and watch.jobs[1].raw["admin_comment"] != "ours"
    finally:
        await watch.stop()


async def test_slurmctlds_start_is_asked_once_for_callers_at_the_same_time() -> None:
    slurm = RestartingSlurm()
    start = SlurmctldStart(slurm)  # type: ignore[arg-type]
    answers = await asyncio.gather(*(start.get(10.0) for _ in range(5)))
    assert answers == [1000] * 5 and slurm.diags == 1
    slurm.start = 2000
    assert await start.get(10.0) == 1000  # fresh enough for this caller
    assert await start.get(0.0) == 2000
    assert slurm.diags == 2


async def test_a_restart_one_watch_saw_makes_the_other_watchs_reads_untrusted() -> None:
    """The workload controller's watch looked first and saw slurmctld start again; the
    scheduler's watch, whose jobs wait for their settled tick, no longer vouches for what it
    read before (its callers read the job again)."""
    slurm = RestartingSlurm()
    slurm.own(1, "RUNNING", "n1", "ours")
    shared = SlurmctldStart(slurm)  # type: ignore[arg-type]
    first = JobWatch(slurm, on_change=lambda _: None, slurmctld=shared)  # type: ignore[arg-type]
    await shared.get(0.0)
    first.track(1)
    await first.read(1)
    assert first.known(1)
    slurm.start = 2000
    await shared.get(0.0)  # what the other watch's look asked
    assert not first.known(1)
    await first.read(1)
    assert first.known(1)


async def test_an_error_answer_to_diag_is_no_restart() -> None:
    slurm = RestartingSlurm()
    start = SlurmctldStart(slurm)  # type: ignore[arg-type]
    assert await start.get(0.0) == 1000

    async def refused() -> dict[str, Any]:
        raise errors.SlurmError("diag refused")

    slurm.diag = refused  # type: ignore[method-assign]
    assert await start.get(0.0) == 1000
