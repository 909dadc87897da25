"""The job watch reads only the jobs it tracks, tells when one changed, and reads pending
jobs again at once when a Slurm node changed."""

from __future__ import annotations

import asyncio
from typing import Any

from slinky.bridge.jobwatch import FAST_READS, FIRST_READ_S, JobWatch
from slinky.slurm import errors
from slinky.slurm.models import Job


class FakeSlurm:
    """get_job only: the one call the watch may make."""

    def __init__(self) -> None:
        self.jobs: dict[int, Job] = {}
        self.reads: list[int] = []

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
        await until(lambda: slurm.reads.count(1) >= 5 and slurm.reads.count(2) >= 3)
        assert watch._interval[1] == FIRST_READ_S  # still fast
        assert watch._interval[2] > FIRST_READ_S  # backing off
        await until(lambda: slurm.reads.count(1) > FAST_READS)
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
