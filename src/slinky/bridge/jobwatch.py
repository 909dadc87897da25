"""Watching the placeholder jobs the bridge owns, and only those.

slurmrestd has no watch, and the job list is the one thing never to read on a hot path: it
holds every job of every user (upstream read it on every scheduling attempt: 1.4 s at ~900
jobs). So each tracked job is read on its own (`GET /job/<id>`), on a schedule of its own:

- a job just submitted is read every 50 ms for its first second (at most 32 jobs at
  once), since Slurm allocates it at its next pass, within a second; a job still pending
  is then read less often (doubling up to `max_interval`);
- a Slurm node event (the Slurm informer's update_time deltas, one small request per poll
  for the whole cluster) makes every pending job and every job on that node due at once: an
  allocation or an ending job changes its node, so it is noticed within one informer poll;
- a job that did not change is read again at `max_interval` at most, the backstop.

The cost per pod is a handful of small reads, whatever else Slurm holds. `on_change` is
called (on the event loop, must not block) with the job id whenever a read shows a job
whose state or nodes changed, or that Slurm no longer knows.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from slinky.background import BackgroundLoop
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.models import Job, expand_hostlist

log = logging.getLogger(__name__)

FIRST_READ_S = 0.05
CONCURRENT_READS = 8
# slurmctld allocates a submitted job at its next scheduling pass, 0.2-0.9 s after the
# submission on the test bed (a pass about once a second; probed with an idle slurmctld and
# free nodes), so reads doubling from 50 ms noticed it up to ~0.75 s late. A job just
# submitted is read every FIRST_READ_S for its first FAST_READS reads (about one second)
# instead; at most FAST_JOBS jobs at once, so a burst of thousands of waiting jobs does not
# turn into thousands of reads per second.
FAST_READS = 20
FAST_JOBS = 32


def _significant(job: Job | None) -> tuple[tuple[str, ...], str] | None:
    return None if job is None else (tuple(job.state), job.nodes)


class JobWatch(BackgroundLoop):
    def __init__(
        self,
        client: SlurmClient,
        *,
        on_change: Callable[[int], None],
        max_interval: float = 10.0,
    ) -> None:
        self.client = client
        self.on_change = on_change
        self.max_interval = max_interval
        # Last read of each tracked job; None: Slurm does not know it (purged or never was).
        self.jobs: dict[int, Job | None] = {}
        self._next: dict[int, float] = {}  # job id -> when to read it (monotonic)
        self._interval: dict[int, float] = {}
        self._fast: dict[int, int] = {}  # job id -> fast reads left (see FAST_READS)
        self._wake = asyncio.Event()
        self.reads = 0

    def task_name(self) -> str:
        return "placeholder job watch"

    # ------------------------------------------------------------ what to watch

    def track(self, job_id: int, *, soon: bool = False, fresh: bool = False) -> None:
        """Watch `job_id` (idempotent); `soon`: read it now and then back off again;
        `fresh`: just submitted, read it often at first (see FAST_READS)."""
        if fresh and job_id not in self._next and len(self._fast) < FAST_JOBS:
            self._fast[job_id] = FAST_READS
        if job_id not in self._next or soon:
            self._interval[job_id] = FIRST_READ_S
            self._schedule(job_id, FIRST_READ_S)

    def untrack(self, job_id: int) -> None:
        self._next.pop(job_id, None)
        self._interval.pop(job_id, None)
        self._fast.pop(job_id, None)
        self.jobs.pop(job_id, None)

    @property
    def tracked(self) -> int:
        return len(self._next)

    def node_changed(self, node: str) -> None:
        """A Slurm node changed: read its jobs and every pending job now."""
        for job_id in list(self._next):
            job = self.jobs.get(job_id)
            if job is None or job.is_pending or node in expand_hostlist(job.nodes):
                self._interval[job_id] = FIRST_READ_S
                self._schedule(job_id, 0.0)

    def pending_due(self) -> None:
        """Slurm nodes changed in a way the node events may not show: read every pending
        job now."""
        for job_id in list(self._next):
            job = self.jobs.get(job_id)
            if job is None or job.is_pending:
                self._interval[job_id] = FIRST_READ_S
                self._schedule(job_id, 0.0)

    def _schedule(self, job_id: int, delay: float) -> None:
        """Read `job_id` in `delay` seconds, unless a read is due earlier already."""
        at = time.monotonic() + delay
        if at < self._next.get(job_id, float("inf")):
            self._next[job_id] = at
            self._wake.set()

    # ------------------------------------------------------------ reading

    async def read(self, job_id: int) -> Job | None:
        """Read one job now (None: Slurm does not know it). Only a tracked job's change is
        told to `on_change`: a caller reading a job it does not track acts on the answer
        itself, and telling it again would bring it back to read the job once more, for
        ever (a finished pod's cancelled job was read ~350 times a second that way)."""
        self.reads += 1
        due_before = self._next.get(job_id)
        try:
            job: Job | None = await self.client.get_job(job_id)
        except errors.SlurmNotFound:
            job = None
        if job_id not in self._next:
            return job
        known, before = job_id in self.jobs, self.jobs.get(job_id)
        self.jobs[job_id] = job
        if (job is None or not job.is_pending) and self._next[job_id] == due_before:
            # Allocated or ended, and no event made it due while it was read: nothing
            # to catch early, back to the slow backstop.
            self._fast.pop(job_id, None)
            self._interval[job_id] = self.max_interval
            self._next[job_id] = time.monotonic() + self.max_interval
        if not known or _significant(before) != _significant(job):
            self.on_change(job_id)
        return job

    async def _read_due(self, due: list[int], limit: asyncio.Semaphore) -> None:
        async def one(job_id: int) -> None:
            async with limit:
                if job_id not in self._next:
                    return
                try:
                    job = await self.read(job_id)
                except errors.SlurmError as e:
                    log.info("job %d: cannot read it (%s); trying again later", job_id, e)
                    self._schedule(job_id, self.max_interval)
                    return
                if job_id not in self._next:
                    return
                interval = min(self._interval.get(job_id, FIRST_READ_S) * 2, self.max_interval)
                fast = self._fast.pop(job_id, 0)
                if job is None or not job.is_pending:
                    interval = self.max_interval
                elif fast > 1:
                    self._fast[job_id] = fast - 1
                    interval = FIRST_READ_S
                self._interval[job_id] = interval
                self._next[job_id] = time.monotonic() + interval

        await asyncio.gather(*(one(j) for j in due))

    async def run(self) -> None:
        limit = asyncio.Semaphore(CONCURRENT_READS)
        while True:
            now = time.monotonic()
            due = [j for j, at in self._next.items() if at <= now]
            if due:
                for job_id in due:  # not due again while being read
                    self._next[job_id] = now + self.max_interval
                await self._read_due(due, limit)
                continue
            wait = min((at - now for at in self._next.values()), default=self.max_interval)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(wait, 0.0))
