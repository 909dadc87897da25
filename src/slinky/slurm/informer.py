"""The Slurm informer: a cache of Slurm nodes (and, on request, partitions and jobs) and the
event channel that tells controllers what changed.

Polling costs slurmrestd requests, so the informer asks only for what someone needs, only
as often as they need it:

- nodes every `poll_interval` while a controller waits on Slurm (`demand`: a pod being
  drained, an update), every `idle_interval` otherwise;
- partitions while someone keeps partitions (`want_partitions`: NodeSets that own one), but
  only when something may have changed them: the first time, after slurmrestd was
  unreachable, when a node or job delta came back with a list (slurmctld advanced its update
  time: a change, or a restart or reconfigure, which is when a partition slurmctld did not
  keep goes missing), when poked (`poke(partitions=True)`, after writing one) and at the
  periodic resync;
- jobs at every node poll while someone watches them all the time (`want_jobs`, e.g.
  `--slurm-watch-jobs` for Prometheus), otherwise only when a reader asks for a view of at
  most a given age (`refresh_jobs`: the external metrics API answering an HPA), in a poll of
  its own that asks nothing else.

slurmrestd has no watch. Polling with `update_time` costs one small request while nothing
changed (HTTP 304 for nodes and partitions, an empty answer for jobs); when something did,
slurmctld returns the whole list (for jobs: every job), which is diffed against the cache so
subscribers get one event per object that really changed (volatile counters such as CPU
load are ignored). slurmctld advances the update time at every restart and reconfigure, so
a delta poll sees those too. A periodic full list (`resync_interval`), whatever
`update_time` says, is the backstop for what does not advance it (an admin deleting a node).
While slurmrestd is unreachable the cache keeps the last state, the informer reports itself
stale, and polls back off; the first successful poll re-lists and catches up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from slinky.background import BackgroundLoop, Backoff, cancelling
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.models import Job, Node, Partition

log = logging.getLogger(__name__)

EventType = Literal["ADDED", "UPDATED", "DELETED", "STALE", "FRESH"]

# Fields that change on every slurmd heartbeat without meaning anything to a controller.
VOLATILE_NODE_FIELDS = frozenset(
    {
        "cpu_load",
        "free_mem",
        "energy",
        "last_busy",
        "slurmd_start_time",
        "boot_time",
        "tres_used",
        "alloc_idle_cpus",
        "tls_cert_last_renewal",
        "external_sensors",
        "power",
    }
)
VOLATILE_JOB_FIELDS = frozenset(
    {"last_sched_evaluation", "priority", "pre_sus_time", "sockets_per_node"}
)


@dataclass(frozen=True)
class SlurmEvent:
    """One change seen in Slurm. `kind` is "node", "job", "partition" or "informer" (for
    STALE/FRESH)."""

    kind: Literal["node", "job", "partition", "informer"]
    type: EventType
    name: str
    old: Any = None
    new: Any = None


Subscriber = Callable[[SlurmEvent], None]
K = TypeVar("K", str, int)
V = TypeVar("V", Node, Job, Partition)


def _significant(raw: dict[str, Any], volatile: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in volatile}


class SlurmInformer(BackgroundLoop):
    def __init__(
        self,
        client: SlurmClient,
        *,
        poll_interval: float = 2.0,
        idle_interval: float | None = None,
        resync_interval: float = 300.0,
        watch_jobs: bool = False,
        max_backoff: float = 30.0,
    ) -> None:
        self.client = client
        self.poll_interval = poll_interval
        self.idle_interval = idle_interval
        self.resync_interval = resync_interval
        self.watch_jobs = watch_jobs  # jobs may be polled at all (the bridge never does)
        self.max_backoff = max_backoff
        self.nodes: dict[str, Node] = {}
        self.jobs: dict[int, Job] = {}
        self.partitions: dict[str, Partition] = {}
        self.stale = True
        self.last_error: str = ""
        self.last_success = 0.0
        self.polls = 0
        self.full_lists = 0
        self.unchanged_polls = 0
        self._node_sig: dict[str, dict[str, Any]] = {}
        self._job_sig: dict[int, dict[str, Any]] = {}
        self._part_sig: dict[str, dict[str, Any]] = {}
        self._node_update = 0
        self._job_update = 0
        self._partition_update = 0
        self._last_resync = 0.0
        self._synced = asyncio.Event()
        self._subscribers: list[Subscriber] = []
        self._node_list_subscribers: list[Callable[[], None]] = []
        self._wake = asyncio.Event()
        self._full_next = False
        self._nodes_next = True  # poll nodes in the next round, whatever the interval says
        self._partitions_next = False
        self._jobs_next = False  # a reader asked for jobs (`refresh_jobs`)
        self._demand: dict[str, float] = {}  # who waits on Slurm -> since when (monotonic)
        self._job_wants: set[str] = set()  # who wants jobs polled with every node poll
        self._job_readers: set[str] = set()  # who reads jobs polled on request
        self._partition_wants: set[str] = set()
        self.jobs_synced = False  # the job cache reflects a poll made while jobs were wanted
        self.partitions_synced = False  # likewise for partitions
        # Monotonic time the last partition list was asked for: it shows every write made
        # before then.
        self.partitions_read_at = 0.0
        self._last_poll_done = 0.0  # monotonic end of the last successful node poll
        self._last_jobs_done = 0.0  # and of jobs
        self._rounds_started = 0
        self._rounds_ended = 0
        self._round_ended = asyncio.Event()  # set and replaced at the end of every round
        # The number of the last round that polled nodes (resp. jobs) successfully, and
        # how many node polls were started.
        self._nodes_done = 0
        self._jobs_done = 0
        self._node_polls_started = 0
        self._node_polls_done = 0

    def __repr__(self) -> str:
        return f"<SlurmInformer {self.client.url} nodes={len(self.nodes)} stale={self.stale}>"

    # ------------------------------------------------------------ subscribers

    def subscribe(self, fn: Subscriber) -> None:
        """Receive every event; called on the event loop, must not block."""
        self._subscribers.append(fn)

    def unsubscribe(self, fn: Subscriber) -> None:
        with contextlib.suppress(ValueError):
            self._subscribers.remove(fn)

    def on_node_list(self, fn: Callable[[], None]) -> None:
        """Call `fn` (on the event loop, must not block) after every delta poll in which
        slurmctld returned the node list, i.e. some node changed since the last poll,
        whether or not a field the diff looks at did (a node handed from one job to the
        next between two polls looks the same before and after), and after the full list
        that ends a time of failed polls (slurmctld may have come back from a crash)."""
        self._node_list_subscribers.append(fn)

    def _publish(self, event: SlurmEvent) -> None:
        for fn in list(self._subscribers):
            try:
                fn(event)
            except Exception:
                log.exception("%s: subscriber failed on %s %s", self, event.type, event.name)

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    # ------------------------------------------------------------ what is wanted

    def demand(self, key: str, wanted: bool) -> None:
        """`key` (e.g. a NodeSet) waits on Slurm (`wanted`) or no longer does. While anyone
        waits the informer polls every `poll_interval`, otherwise every `idle_interval`."""
        if wanted and key not in self._demand:
            self._demand[key] = time.monotonic()
            # The loop works out the next node poll again with the fast interval: now, if
            # the last one is older than that, not after the idle interval. Not a poke: a
            # scheduler whose waiting pods come and go would flip its demand at every pod
            # and make a node poll each time (12 a second in a burst of 500 pods).
            self._wake.set()
        elif not wanted:
            self._demand.pop(key, None)

    def want_jobs(self, key: str, wanted: bool) -> None:
        """`key` reads jobs (`wanted`) or no longer does: polled with every node poll while
        anyone does (the first such poll lists them in full; `jobs_synced` until then
        False)."""
        self._check_jobs()
        if wanted:
            self._job_wants.add(key)
        else:
            self._job_wants.discard(key)
            self._lost_job_reader()

    def release_jobs(self, key: str) -> None:
        """`key` no longer reads jobs through `refresh_jobs`."""
        self._job_readers.discard(key)
        self._lost_job_reader()

    def _lost_job_reader(self) -> None:
        if not self._job_wants and not self._job_readers:
            self.jobs_synced = False  # not polled from now on: the cache goes stale

    def _check_jobs(self) -> None:
        if not self.watch_jobs:
            raise ValueError(f"{self}: jobs are not watched (watch_jobs=False)")

    def want_partitions(self, key: str, wanted: bool) -> None:
        """`key` keeps partitions (`wanted`) or no longer does (see the module docstring
        for when they are polled)."""
        if wanted and key not in self._partition_wants:
            self._partition_wants.add(key)
            if not self.partitions_synced:
                self.poke(partitions=True)
        elif not wanted:
            self._partition_wants.discard(key)
            if not self._partition_wants:
                self.partitions_synced = False

    @property
    def polling_jobs(self) -> bool:
        return self.watch_jobs and bool(self._job_wants or self._job_readers)

    @property
    def polling_partitions(self) -> bool:
        return bool(self._partition_wants)

    async def refresh(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) for a node poll that starts after this call;
        True when it succeeded. Concurrent callers share the same poll."""
        return await self._round(self.poke, lambda: self._nodes_done, timeout)

    async def refresh_jobs(self, key: str, *, max_age: float, timeout: float) -> bool:
        """A view of the jobs at most `max_age` seconds old, polled for `key` when the last
        is older (a poll of jobs alone: it asks slurmrestd nothing else). True when the
        cache is that fresh."""
        self._check_jobs()
        self._job_readers.add(key)
        if self.jobs_synced and time.monotonic() - self._last_jobs_done <= max_age:
            return True

        def ask() -> None:
            self._jobs_next = True
            self._wake.set()

        return await self._round(ask, lambda: self._jobs_done, timeout)

    async def _round(
        self, ask: Callable[[], None], done: Callable[[], int], timeout: float
    ) -> bool:
        """Ask for a poll and wait until one that started after the ask has `done` it; a
        round that ended without it (failed, or polled other things) makes us ask again."""
        target = self._rounds_started + 1
        ask()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while done() < target:
                    if self._rounds_ended >= target:
                        target = self._rounds_started + 1
                        ask()
                    await self._round_ended.wait()
        return done() >= target

    def mark(self) -> int:
        """A point in the informer's history of node polls, for `shows_since`."""
        return self._node_polls_started

    def shows_since(self, mark: int) -> bool:
        """Whether a node poll that started after `mark` succeeded: the cache then shows
        what changed in Slurm before the mark was taken."""
        return self._node_polls_done > mark

    @property
    def polled_ago(self) -> float:
        """Seconds since the last successful node poll ended."""
        return time.monotonic() - self._last_poll_done

    def fresh_for(self, key: str) -> bool:
        """Whether a poll completed since `key` started waiting: its decisions then rest on
        a view at most one fast poll old, not on one from the idle interval."""
        since = self._demand.get(key)
        return since is not None and self._last_poll_done > since

    @property
    def interval(self) -> float:
        if self._demand or self.idle_interval is None:
            return self.poll_interval
        return max(self.poll_interval, self.idle_interval)

    def poke(self, *, full: bool = False, partitions: bool = False) -> None:
        """Poll now (after we changed something and want to see the result early).
        `full`: list everything, as slurmctld does not advance `update_time` when a node is
        deleted, so a delta poll would not show the deletion; `partitions`: read them too
        (after writing one)."""
        if full:
            self._full_next = True
        if partitions:
            self._partitions_next = True
        self._nodes_next = True
        self._wake.set()

    # ------------------------------------------------------------ lifecycle

    def task_name(self) -> str:
        return f"slurm informer {self.client.url}"

    async def run(self) -> None:
        backoff = Backoff(self.poll_interval * 2, self.max_backoff)
        last_nodes = -math.inf  # monotonic time the last node poll ended
        while True:
            # Cleared before the poll: a poke made while it runs asks for another one.
            self._wake.clear()
            # Due by the interval as it is now (it shortens when someone starts waiting).
            next_nodes = last_nodes + self.interval
            nodes = self._nodes_next or self.stale or time.monotonic() >= next_nodes
            if not (nodes or self._partitions_next or self._jobs_next):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), next_nodes - time.monotonic())
                continue
            self._nodes_next = False
            delay: float | None = None
            try:
                await self.poll_once(nodes=nodes)
                backoff.reset()
                if nodes:
                    last_nodes = time.monotonic()
            except errors.SlurmError as e:
                if cancelling():
                    raise asyncio.CancelledError from e
                self._mark_stale(str(e))
                delay = backoff.next()
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                # An answer we cannot read must not freeze the cache silently.
                log.exception("%s: unexpected payload from slurmrestd", self)
                self._mark_stale(f"unexpected payload from slurmrestd: {type(e).__name__}: {e}")
                delay = backoff.next()
            finally:
                self._rounds_ended = self._rounds_started
                ended, self._round_ended = self._round_ended, asyncio.Event()
                ended.set()
            if delay is None:
                if self._nodes_next or self._partitions_next or self._jobs_next:
                    continue  # a delta showed a change: read what it concerns at once
                delay = max(0.0, last_nodes + self.interval - time.monotonic())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def poll_once(self, *, nodes: bool = True) -> None:
        """One round: nodes (deltas, or a full list when due or after being stale), jobs
        (with every node poll while watched, or when a reader asked), partitions (when
        something may have changed them), concurrently: one round trip, not three."""
        now = time.monotonic()
        full = self.stale or self._full_next or now - self._last_resync >= self.resync_interval
        # A full list after a failed poll is the first word from a slurmctld that may have
        # restarted meanwhile (from state saved before allocations we read): the node-list
        # subscribers hear of it as of any delta list.
        recovering = self.stale and self.has_synced
        nodes = nodes or full
        self._full_next = False
        self.polls += 1
        self._rounds_started += 1
        number = self._rounds_started
        with_jobs = self.polling_jobs and (self._jobs_next or (nodes and bool(self._job_wants)))
        self._jobs_next = False
        with_parts = self.polling_partitions and (
            self._partitions_next or full or not self.partitions_synced
        )
        self._partitions_next = False
        full_jobs = full or not self.jobs_synced
        full_parts = full or not self.partitions_synced
        calls: dict[str, Awaitable[tuple[Any, int]]] = {}
        if nodes:
            self._node_polls_started += 1
            calls["nodes"] = self.client.list_nodes(update_time=None if full else self._node_update)
        if with_jobs:
            calls["jobs"] = self.client.list_jobs(
                update_time=None if full_jobs else self._job_update
            )
        if with_parts:
            calls["partitions"] = self.client.list_partitions_since(
                None if full_parts else self._partition_update
            )
        if not calls:
            return
        answers = dict(zip(calls, await asyncio.gather(*calls.values()), strict=True))
        changed = False
        if "nodes" in answers:
            node_list, last = answers["nodes"]
            if full:
                self.full_lists += 1
                self._last_resync = now
            if node_list is not None:
                self._diff_nodes(node_list)
                changed = not full
                if not full or recovering:
                    for fn in list(self._node_list_subscribers):
                        try:
                            fn()
                        except Exception:
                            log.exception("%s: node list subscriber failed", self)
            self._node_update = last or self._node_update
            self._last_poll_done = time.monotonic()
            self._node_polls_done = self._node_polls_started
            self._nodes_done = number
        if "jobs" in answers:
            job_list, job_last = answers["jobs"]
            if job_list is not None:
                self._diff_jobs(job_list)
                changed = changed or not full_jobs
                if not full_jobs and "nodes" not in answers:
                    self._nodes_next = True  # jobs started or ended: their nodes changed
            self._job_update = job_last or self._job_update
            # Still wanted (not dropped while the poll ran): the job view is current.
            self.jobs_synced = self.polling_jobs
            self._last_jobs_done = time.monotonic()
            self._jobs_done = number
        if "partitions" in answers:
            part_list, part_last = answers["partitions"]
            if part_list is not None:
                self._diff_partitions(part_list)
            self._partition_update = part_last or self._partition_update
            self.partitions_synced = self.polling_partitions
            self.partitions_read_at = now
        elif changed and self.polling_partitions:
            # slurmctld changed something (or restarted: every delta comes back then):
            # whether our partitions are still there is worth one more small request.
            self._partitions_next = True
        if not answers.get("nodes", (None,))[0] and not answers.get("jobs", (None,))[0]:
            self.unchanged_polls += 1
        self.last_success = time.time()
        self.last_error = ""
        if "nodes" in answers:
            self._synced.set()
            if self.stale:
                self.stale = False
                self._publish(SlurmEvent("informer", "FRESH", self.client.url))

    def _mark_stale(self, error: str) -> None:
        self.last_error = error
        if not self.stale or not self.has_synced:
            log.warning("%s: slurmrestd unavailable, keeping last state: %s", self, error)
        if not self.stale:
            self.stale = True
            self._publish(SlurmEvent("informer", "STALE", self.client.url))

    # ------------------------------------------------------------ diffs

    def _diff_nodes(self, nodes: list[Node]) -> None:
        _diff(
            "node",
            cache=self.nodes,
            sigs=self._node_sig,
            fresh={n.name: n for n in nodes},
            volatile=VOLATILE_NODE_FIELDS,
            publish=self._publish,
        )

    def _diff_jobs(self, jobs: list[Job]) -> None:
        _diff(
            "job",
            cache=self.jobs,
            sigs=self._job_sig,
            fresh={j.job_id: j for j in jobs},
            volatile=VOLATILE_JOB_FIELDS,
            publish=self._publish,
        )

    def _diff_partitions(self, partitions: list[Partition]) -> None:
        _diff(
            "partition",
            cache=self.partitions,
            sigs=self._part_sig,
            fresh={p.name: p for p in partitions},
            volatile=frozenset(),
            publish=self._publish,
        )


def _diff(
    kind: Literal["node", "job", "partition"],
    *,
    cache: dict[K, V],
    sigs: dict[K, dict[str, Any]],
    fresh: dict[K, V],
    volatile: frozenset[str],
    publish: Callable[[SlurmEvent], None],
) -> None:
    """Bring `cache` to `fresh`, publishing one event per object that really changed."""
    for key in list(cache):
        if key not in fresh:
            gone = cache.pop(key)
            sigs.pop(key, None)
            publish(SlurmEvent(kind, "DELETED", str(key), old=gone))
    for key, obj in fresh.items():
        sig = _significant(obj.raw, volatile)
        old = cache.get(key)
        cache[key] = obj
        if old is None:
            sigs[key] = sig
            publish(SlurmEvent(kind, "ADDED", str(key), new=obj))
        elif sigs.get(key) != sig:
            sigs[key] = sig
            publish(SlurmEvent(kind, "UPDATED", str(key), old=old, new=obj))
