"""Watching the placeholder jobs the bridge owns, and only those.

slurmrestd has no watch, and the job list is the one thing never to read on a hot path: it
holds every job of every user (upstream read it on every scheduling attempt: 1.4 s at ~900
jobs). So the watch asks about its own jobs only, in as few requests as it can:

- the jobs due for a look are asked together, in one `GET /jobs/state/?job_id=..&job_id=..`
  (slurmctld's light job-state call; a job it no longer knows is left out of the answer,
  and is then read once on its own, see below); a full `GET /job/<id>` is made for a job
  whose state changed (or was never read), as only that read tells the nodes, and for a
  pending job (its reason and excluded nodes are what the scheduler acts on);
- a job just submitted is looked at every 50 ms for its first second (at most 32 jobs at
  once), since Slurm allocates it at its next pass, within a second; a job still pending is
  then looked at less often (doubling up to `max_interval`);
- a Slurm node event (the Slurm informer's update_time deltas, one small request per poll
  for the whole cluster) makes every pending job and every job on that node due at once: an
  allocation or an ending job changes its node, so it is noticed within one informer poll;
  pending jobs are also looked at just after the next two whole seconds, when slurmctld's
  scheduling pass runs (PASS_LOOK_AFTER_S);
- a job that holds its nodes (or is gone) is looked at every `settled_interval`, all such
  jobs on one shared tick, so they cost one request a minute together, however many;
- a job id alone is never identity: slurmctld restarted from state saved before its last
  submissions gives their ids to new jobs, possibly in the same state, and the state answer
  names no owner. So a read is trusted only while the slurmctld that answered it still runs
  (`SlurmctldStart`, diag's start time, asked with the looks at most every START_CHECK_S,
  and afresh after slurmctld returned its node list, which it does at every restart): when
  it started again, every tracked job is read in full, and a job under another owner is a
  change (`_significant`);
- a job missing from a batched answer (or whose entry did not parse) is read on its own
  before it is taken for gone: only slurmctld's own "not found" says that;
- a job the bridge cancelled is followed on that tick until Slurm purges it: a slurmctld
  that crashed right after acknowledging the cancel comes back with the job live again,
  and `on_revived` is told, so it is cancelled again (cleanup is continuous, not only at
  start-up).

`on_change` is called (on the event loop, must not block) with the job id whenever a tracked
job's state or nodes changed, or Slurm no longer knows it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable

from slinky.background import BackgroundLoop
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.models import TERMINAL_JOB_STATES, Job, expand_hostlist
from slinky.slurm.started import SlurmctldStart

log = logging.getLogger(__name__)

FIRST_READ_S = 0.05
CONCURRENT_READS = 8
STATES_PER_REQUEST = 100  # job ids in one jobs/state query (the URL stays a few KB)
# slurmctld allocates a submitted job at its next scheduling pass, 0.2-0.9 s after the
# submission on the test bed (a pass about once a second; probed with an idle slurmctld and
# free nodes), so reads doubling from 50 ms noticed it up to ~0.75 s late. A job just
# submitted is looked at every FIRST_READ_S for its first FAST_READS looks (about one
# second) instead; at most FAST_JOBS jobs at once.
FAST_READS = 20
FAST_JOBS = 32
# How long a cancelled job is followed at most (Slurm purges it after MinJobAge, 300 s by
# default, which ends the following earlier).
FOLLOW_CANCELLED_S = 900.0
# A pending job still pending in the batched state answer is read in full (for its reason)
# at most this often; and a node event restarts a job's fast looks at most this often.
# Under chaos, node events came every second and every pending job was read in full several
# times after each (bursts of 2,700-4,900 requests/min in a 30-minute soak).
PENDING_FULL_READ_S = 10.0
EVENT_MIN_GAP_S = 2.0
# slurmctld runs the scheduling pass an event asks for (a job update, a job's end) at the
# next whole second of its clock: its background loop ticks on the second (a hand-over bench
# run logged all 29 allocations of pending jobs at .000-.003). Doubling looks from a node
# event (0, 0.1, 0.3, 0.7, 1.5 s) saw an allocation made 0.8 s after the event 0.7 s late,
# and the next pod started that much later. So the looks after a node event also fall just
# after the next two whole seconds of the wall clock (the same clock as slurmctld's, within
# NTP's milliseconds; a skewed one only loses this shortcut); they do not count as steps of
# the doubling, and an event inside EVENT_MIN_GAP_S still moves them (batched: all pending
# jobs are looked at together on the second).
PASS_LOOK_AFTER_S = 0.03
PASS_LOOKS = 2
# How old an answer about slurmctld's start the looks take (one diag request at most this
# often while jobs are tracked); after slurmctld returned its node list (a change, or a
# restart), at most START_RECHECK_S.
START_CHECK_S = 10.0
START_RECHECK_S = 5.0  # a busy cluster returns its node list at every poll
_UNREAD = -1  # `_read_under` of a job never read in full


def _significant(job: Job | None) -> tuple[tuple[str, ...], str, str, str] | None:
    """What of a job the pods follow: its state, its nodes and, while it is pending, Slurm's
    reason (the pod's PodScheduled condition names it; a CI run saw it stay Priority after
    Slurm had moved on to Resources); and whose job it is (admin_comment): slurmctld
    restarted from state saved before its last submissions gives their ids to new jobs,
    and a read of another job under the same id, even in the same state, is a change."""
    if job is None:
        return None
    return (
        tuple(job.state),
        job.nodes,
        job.state_reason if job.is_pending else "",
        str(job.raw.get("admin_comment") or ""),
    )


def _wall() -> float:
    """The wall clock (slurmctld's passes start on its whole seconds); a seam for tests."""
    return time.time()


def pass_looks(monotonic_now: float, wall_now: float) -> list[float]:
    """When (monotonic) to look just after slurmctld's next PASS_LOOKS scheduling passes,
    which start on the whole seconds of the wall clock."""
    to_second = math.ceil(wall_now) - wall_now
    return [monotonic_now + to_second + i + PASS_LOOK_AFTER_S for i in range(PASS_LOOKS)]


# A read another watch of the process made this recently is taken instead of a read of
# one's own (`JobWatch.borrow`).
RECENT_S = 2.0


class RecentReads:
    """The jobs the watches of one process read lately, shared between them: the scheduler
    reads each job it allocates, and the workload controller, which looks at the pod as
    soon as it is labelled, read the same job again a moment later (half the job reads of a
    500-pod burst)."""

    def __init__(self, max_age: float = RECENT_S) -> None:
        self.max_age = max_age
        self._reads: dict[int, tuple[float, Job]] = {}  # job id -> (monotonic, read)

    def put(self, job_id: int, job: Job | None) -> None:
        """A read of `job_id` (None: Slurm does not know it, nothing to lend)."""
        now = time.monotonic()
        self._reads.pop(job_id, None)
        if job is not None:
            self._reads[job_id] = (now, job)
        # Oldest first (insertion order): what is too old to lend is dropped, and no more.
        while self._reads:
            oldest = next(iter(self._reads))
            if now - self._reads[oldest][0] < self.max_age:
                break
            del self._reads[oldest]

    def forget(self, job_id: int) -> None:
        self._reads.pop(job_id, None)

    def get(self, job_id: int) -> Job | None:
        entry = self._reads.get(job_id)
        if entry is None or time.monotonic() - entry[0] >= self.max_age:
            return None
        return entry[1]


class JobWatch(BackgroundLoop):
    def __init__(
        self,
        client: SlurmClient,
        *,
        on_change: Callable[[int], None],
        on_revived: Callable[[int], None] | None = None,
        max_interval: float = 10.0,
        settled_interval: float = 60.0,
        recent: RecentReads | None = None,
        slurmctld: SlurmctldStart | None = None,
    ) -> None:
        self.client = client
        self.recent = recent
        # When the slurmctld that answers now started (None: not checked; every read is
        # trusted, as with a slurmrestd that cannot tell).
        self.slurmctld = slurmctld
        self._start: int | None = None  # its last answer
        self._start_recheck = False  # all_due: ask it afresh at the next look
        # Job id -> the slurmctld start known when its last full read was asked: a read
        # made under an earlier slurmctld may be another job's now.
        self._read_under: dict[int, int | None] = {}
        self.on_change = on_change
        self.on_revived = on_revived
        self.max_interval = max_interval
        self.settled_interval = max(settled_interval, max_interval)
        # Last read of each tracked job; None: Slurm does not know it (purged or never was).
        self.jobs: dict[int, Job | None] = {}
        self._next: dict[int, float] = {}  # job id -> when to look at it (monotonic)
        self._interval: dict[int, float] = {}
        self._fast: dict[int, int] = {}  # job id -> fast looks left (see FAST_READS)
        self._following: dict[int, float] = {}  # cancelled job id -> give up (monotonic)
        self._cancelled_at: dict[int, float] = {}  # cancelled job id -> when (monotonic)
        self._read_at: dict[int, float] = {}  # job id -> last full read (monotonic)
        self._evented: dict[int, float] = {}  # job id -> last look a node event asked for
        self._pass_looks: dict[int, list[float]] = {}  # job id -> looks after Slurm's passes
        self._wake = asyncio.Event()
        self.reads = 0  # full reads (GET /job/<id>)
        self.state_requests = 0  # jobs/state requests
        self._batched = True  # False: slurmrestd has no jobs/state (one read per job)

    def task_name(self) -> str:
        return "placeholder job watch"

    # ------------------------------------------------------------ what to watch

    def track(self, job_id: int, *, soon: bool = False, fresh: bool = False) -> None:
        """Watch `job_id` (idempotent); `soon`: look at it now and then back off again;
        `fresh`: just submitted, look at it often at first (see FAST_READS)."""
        self._following.pop(job_id, None)
        if fresh and job_id not in self._next and len(self._fast) < FAST_JOBS:
            self._fast[job_id] = FAST_READS
        if job_id not in self._next or soon:
            self._interval[job_id] = FIRST_READ_S
            self._schedule(job_id, FIRST_READ_S)

    def untrack(self, job_id: int) -> None:
        self._next.pop(job_id, None)
        self._interval.pop(job_id, None)
        self._fast.pop(job_id, None)
        self._following.pop(job_id, None)
        self._cancelled_at.pop(job_id, None)
        self._read_at.pop(job_id, None)
        self._evented.pop(job_id, None)
        self._pass_looks.pop(job_id, None)
        self._read_under.pop(job_id, None)
        self.jobs.pop(job_id, None)

    def given_again(self, job_id: int) -> None:
        """Slurm has just given `job_id` to a job the caller made: whatever was read under
        that id is an earlier job's (slurmctld, restarted from a state save older than that
        job, gives its ids again). Forgotten, here and in the reads lent between watches, so
        that nothing takes the new job for the old one."""
        self.untrack(job_id)
        if self.recent is not None:
            self.recent.forget(job_id)

    def follow_cancelled(self, job_id: int) -> None:
        """The bridge cancelled `job_id`: no longer tracked, but looked at on the settled
        tick until Slurm purges it; if it is ever live again, `on_revived` is told."""
        self.untrack(job_id)
        if self.on_revived is None:
            return
        self._cancelled_at[job_id] = time.monotonic()
        self._following[job_id] = self._cancelled_at[job_id] + FOLLOW_CANCELLED_S
        self._next[job_id] = self._settled_tick()
        self._wake.set()

    @property
    def tracked(self) -> int:
        return len(self._next) - len(self._following)

    def is_following(self, job_id: int) -> bool:
        """Whether `job_id` is a job the bridge cancelled, followed until Slurm purges it."""
        return job_id in self._following

    @property
    def following(self) -> int:
        return len(self._following)

    def node_changed(self, node: str) -> None:
        """A Slurm node changed: look at its jobs and every pending job now."""
        for job_id in list(self._next):
            if job_id in self._following:
                continue
            job = self.jobs.get(job_id)
            if job is None or job.is_pending:
                self._look_soon(job_id)
            elif node in expand_hostlist(job.nodes):
                self._schedule(job_id, 0.0)  # once: an ending job frees its node

    def pending_due(self) -> None:
        """Slurm nodes changed in a way the node events may not show: look at every pending
        job now."""
        for job_id in list(self._next):
            if job_id in self._following:
                continue
            job = self.jobs.get(job_id)
            if job is None or job.is_pending:
                self._look_soon(job_id)

    def all_due(self) -> None:
        """Slurm's nodes changed in a way no node event may show (slurmctld came back from a
        crash without an allocation the bridge had read, or a node went from one job to
        the next between two polls): look at every tracked job now, in one batched state
        request; only those whose state changed are read in full (all of them when
        slurmctld started again: asked afresh, as this is when a restart shows)."""
        self._start_recheck = True
        for job_id in list(self._next):
            if job_id not in self._following:
                self._schedule(job_id, 0.0)

    def _look_soon(self, job_id: int) -> None:
        """Look now, then often for a moment (Slurm's pass follows the event within about a
        second); fast looks already under way for an event a moment ago are left to run."""
        now = time.monotonic()
        passes = pass_looks(now, _wall())
        self._pass_looks[job_id] = passes
        if now - self._evented.get(job_id, -math.inf) < EVENT_MIN_GAP_S:
            self._schedule(job_id, passes[0] - now)  # only the look after Slurm's pass
            return
        self._evented[job_id] = now
        self._interval[job_id] = FIRST_READ_S
        self._schedule(job_id, 0.0)

    def _schedule(self, job_id: int, delay: float) -> None:
        """Look at `job_id` in `delay` seconds, unless a look is due earlier already."""
        at = time.monotonic() + delay
        if at < self._next.get(job_id, float("inf")):
            self._next[job_id] = at
            self._wake.set()

    def _settled_tick(self) -> float:
        """The next shared tick of the settled jobs: they are looked at together."""
        step = self.settled_interval
        return math.ceil((time.monotonic() + 1e-3) / step) * step

    # ------------------------------------------------------------ reading

    async def read(self, job_id: int) -> Job | None:
        """Read one job now (None: Slurm does not know it). Only a tracked job's change is
        told to `on_change`: a caller reading a job it does not track acts on the answer
        itself, and telling it again would bring it back to read the job once more, for
        ever (a finished pod's cancelled job was read ~350 times a second that way)."""
        self.reads += 1
        self._read_at[job_id] = time.monotonic()
        due_before = self._next.get(job_id)
        under = self._latest_start()
        try:
            job: Job | None = await self.client.get_job(job_id)
        except errors.SlurmNotFound:
            job = None
        if job_id not in self._next or job_id in self._following:
            return job
        self._read_under[job_id] = under
        self._record(job_id, job)
        if (job is None or not job.is_pending) and self._next[job_id] == due_before:
            # Allocated or ended, and no event made it due while it was read: nothing
            # to catch early, back to the slow backstop.
            self._settle(job_id)
        return job

    def adopt(self, job_id: int, job: Job, *, lend: bool = True) -> None:
        """Track `job_id`, which the caller has just read as `job` (a job it allocated):
        kept as a read of the watch's own, so the watch does not read it again at once (a
        second request per job in a burst); a pending one is looked at as a job just
        submitted (`track(fresh=True)`); `lend`: offered to the other watches as a read
        made now (not for a read on loan, which is as old as its lender's)."""
        self.track(job_id, fresh=True)
        self._read_at[job_id] = time.monotonic()
        self._read_under[job_id] = self._latest_start()
        self._record(job_id, job, lend=lend)
        if not job.is_pending:
            self._settle(job_id)

    def known(self, job_id: int) -> bool:
        """Whether the watch holds a read of `job_id` made under the slurmctld that runs now
        (as far as the looks know): one to act on; else the caller reads it."""
        if job_id not in self.jobs:
            return False
        return self._read_under.get(job_id, _UNREAD) == self._latest_start()

    def _latest_start(self) -> int | None:
        """slurmctld's start as last told to any reader of the process (the watches share
        one `SlurmctldStart`: the other watch's look may have seen a restart first)."""
        return self.slurmctld.value if self.slurmctld is not None else None

    def _settle(self, job_id: int) -> None:
        self._fast.pop(job_id, None)
        self._pass_looks.pop(job_id, None)
        self._interval[job_id] = self.settled_interval
        self._next[job_id] = self._settled_tick()

    def borrow(self, job_id: int, *, track: bool = True) -> Job | None:
        """A read of `job_id` another watch of the process made within RECENT_S, or None;
        `track`: kept as a read of this watch's own (see `adopt`), with a look at its state
        in FIRST_READ_S (one batched `jobs/state` for every job due): a node event for an
        end between that read and now went by while this watch did not follow the job."""
        job = self.recent.get(job_id) if self.recent is not None else None
        if job is not None and track:
            self.adopt(job_id, job, lend=False)
            self._schedule(job_id, FIRST_READ_S)
        return job

    def _record(self, job_id: int, job: Job | None, *, lend: bool = True) -> None:
        """Keep what a read showed of a tracked job; tell `on_change` when it changed."""
        known, before = job_id in self.jobs, self.jobs.get(job_id)
        self.jobs[job_id] = job
        if self.recent is not None and lend:
            self.recent.put(job_id, job)
        if not known or _significant(before) != _significant(job):
            self.on_change(job_id)

    async def _states(self, due: list[int]) -> dict[int, list[str]] | None:
        """The states of the due jobs (None: read each job instead)."""
        if not self._batched:
            return None
        out: dict[int, list[str]] = {}
        for i in range(0, len(due), STATES_PER_REQUEST):
            self.state_requests += 1
            try:
                out.update(await self.client.job_states(due[i : i + STATES_PER_REQUEST]))
            except errors.SlurmEndpointMissing:
                log.info("slurmrestd has no jobs/state: placeholder jobs are read one by one")
                self._batched = False
                return None
        return out

    def _unchanged(self, job_id: int, state: list[str] | None) -> bool:
        """Whether the state answer says nothing new about a tracked job. A pending job is
        read in full now and then all the same (PENDING_FULL_READ_S): its reason is what the
        pod's condition says."""
        if not self.known(job_id):
            # Never read in full (its nodes and comment are not known), or read from an
            # earlier slurmctld: the id may be another job's now.
            return False
        job = self.jobs[job_id]
        if state is None:
            return job is None
        if job is None or tuple(job.state) != tuple(state):
            return False
        if job.is_pending:
            return time.monotonic() - self._read_at.get(job_id, -math.inf) < PENDING_FULL_READ_S
        return True

    async def _look(self, due: list[int], limit: asyncio.Semaphore) -> None:
        # When each job would be looked at again if nothing happened while it was read; a
        # node event during the read makes it due earlier, and that must stand (else an
        # ending job seen by that event waits for the settled tick).
        unmoved = {job_id: self._next[job_id] for job_id in due if job_id in self._next}
        asked_at = time.monotonic()
        try:
            await self._check_start(set(due))
            states = await self._states(due)
        except errors.SlurmError as e:
            log.info("jobs %s: cannot read their states (%s); trying again later", due, e)
            for job_id in due:
                if job_id in self._next:
                    self._next[job_id] = time.monotonic() + self.max_interval
            return

        async def one(job_id: int) -> None:
            if job_id not in self._next:
                return
            if job_id in self._following:
                if self._cancelled_at.get(job_id, 0.0) >= asked_at:
                    # Asked while the job still ran, answered after the cancel: says
                    # nothing about a revival (the bench saw hundreds of false alarms).
                    self._next[job_id] = self._settled_tick()
                    return
                self._follow(job_id, None if states is None else states.get(job_id))
                return
            job: Job | None
            if states is not None and self._unchanged(job_id, states.get(job_id)):
                job = self.jobs[job_id]
            else:
                # Changed, never read, read from an earlier slurmctld, or missing from the
                # answer (only slurmctld's own "not found" to a read of it says gone).
                async with limit:
                    try:
                        job = await self.read(job_id)
                    except errors.SlurmError as e:
                        log.info("job %d: cannot read it (%s); trying again later", job_id, e)
                        self._schedule(job_id, self.max_interval)
                        return
            if job_id in self._next and self._next[job_id] >= unmoved.get(job_id, 0.0):
                self._reschedule(job_id, job)

        await asyncio.gather(*(one(j) for j in due))

    async def _check_start(self, looking: set[int]) -> None:
        """Ask when slurmctld started (an answer up to START_CHECK_S old; START_RECHECK_S
        after `all_due`); when it started again, every tracked job is read in full: those
        `looking` in this look (`_unchanged`), the others due now."""
        if self.slurmctld is None:
            return
        recheck, self._start_recheck = self._start_recheck, False
        try:
            start = await self.slurmctld.get(START_RECHECK_S if recheck else START_CHECK_S)
        except BaseException:
            self._start_recheck = self._start_recheck or recheck
            raise
        if start is None or start == self._start:
            return
        if self._start is not None:
            log.warning(
                "slurmctld started again (at %d, was %d): every tracked job is read in full, "
                "as a job id may name another job now",
                start,
                self._start,
            )
        self._start = start
        for job_id in list(self._next):
            if job_id not in self._following and job_id not in looking:
                self._schedule(job_id, 0.0)

    def _reschedule(self, job_id: int, job: Job | None) -> None:
        fast = self._fast.pop(job_id, 0)
        planned = self._pass_looks.pop(job_id, [])
        if job is None or not job.is_pending:
            self._interval[job_id] = self.settled_interval
            self._next[job_id] = self._settled_tick()
            return
        now = time.monotonic()
        interval = self._interval.get(job_id, FIRST_READ_S)
        if not any(t <= now for t in planned):  # a look after Slurm's pass is no step
            interval = min(interval * 2, self.max_interval)
        if fast > 1:
            self._fast[job_id] = fast - 1
            interval = FIRST_READ_S
        self._interval[job_id] = interval
        at = now + interval
        passes = [t for t in planned if t > now]
        if passes:
            self._pass_looks[job_id] = passes
            at = min(at, passes[0])
        self._next[job_id] = at

    def _follow(self, job_id: int, state: list[str] | None) -> None:
        """A cancelled job's look: purged (or unknown, without the batch call) ends the
        following; live again means slurmctld revived it."""
        if state is not None and not set(state) & TERMINAL_JOB_STATES:
            log.warning("job %d: cancelled earlier, live again (%s)", job_id, "/".join(state))
            self.untrack(job_id)
            if self.on_revived is not None:
                self.on_revived(job_id)
            return
        if state is None or time.monotonic() >= self._following[job_id]:
            self.untrack(job_id)
            return
        self._next[job_id] = self._settled_tick()

    async def run(self) -> None:
        limit = asyncio.Semaphore(CONCURRENT_READS)
        while True:
            now = time.monotonic()
            due = [j for j, at in self._next.items() if at <= now]
            if due:
                for job_id in due:  # not due again while being looked at
                    self._next[job_id] = now + self.max_interval
                await self._look(due, limit)
                continue
            wait = min((at - now for at in self._next.values()), default=self.settled_interval)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(wait, 0.0))
