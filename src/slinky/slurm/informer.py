"""The Slurm informer: a cache of Slurm nodes (and, on request, jobs) and the event channel
that tells controllers what changed.

Polling costs slurmrestd requests, so the informer polls only as much as someone needs:
every `poll_interval` while a controller waits on Slurm (`demand`: a pod being drained, an
update), every `idle_interval` otherwise; jobs and partitions only while someone wants them
(`want_jobs`: the autoscaling metrics), in the same poll as the nodes. `refresh` waits for a
poll made after the call, for a reader that must answer from a current view.

slurmrestd has no watch. Polling with `update_time` costs one small request per interval
while nothing changes (HTTP 304 for nodes, an empty answer for jobs); when something did
change slurmctld returns the whole list, which is diffed against the cache so subscribers
get one event per node that really changed (volatile counters such as CPU load are ignored).
A periodic full list, whatever `update_time` says, is the backstop that detects anything
missed. While slurmrestd is unreachable the cache keeps the last state, the informer reports
itself stale, and polls back off; the first successful poll re-lists and catches up.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
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
    """One change seen in Slurm. `kind` is "node", "job" or "informer" (for STALE/FRESH)."""

    kind: Literal["node", "job", "informer"]
    type: EventType
    name: str
    old: Any = None
    new: Any = None


Subscriber = Callable[[SlurmEvent], None]
K = TypeVar("K", str, int)
V = TypeVar("V", Node, Job)


def _significant(raw: dict[str, Any], volatile: frozenset[str]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in volatile}


class SlurmInformer(BackgroundLoop):
    def __init__(
        self,
        client: SlurmClient,
        *,
        poll_interval: float = 2.0,
        idle_interval: float | None = None,
        resync_interval: float = 30.0,
        watch_jobs: bool = False,
        max_backoff: float = 30.0,
    ) -> None:
        self.client = client
        self.poll_interval = poll_interval
        self.idle_interval = idle_interval
        self.resync_interval = resync_interval
        self.watch_jobs = watch_jobs
        self.max_backoff = max_backoff
        self.nodes: dict[str, Node] = {}
        self.jobs: dict[int, Job] = {}
        # With watch_jobs, while someone wants them (`want_jobs`): jobs, and partitions by
        # name (autoscaling metrics name them).
        self.partitions: dict[str, Partition] = {}
        self._partition_update = 0
        self.stale = True
        self.last_error: str = ""
        self.last_success = 0.0
        self.polls = 0
        self.full_lists = 0
        self.unchanged_polls = 0
        self._node_sig: dict[str, dict[str, Any]] = {}
        self._job_sig: dict[int, dict[str, Any]] = {}
        self._node_update = 0
        self._job_update = 0
        self._last_resync = 0.0
        self._synced = asyncio.Event()
        self._subscribers: list[Subscriber] = []
        self._node_list_subscribers: list[Callable[[], None]] = []
        self._wake = asyncio.Event()
        self._full_next = False
        self._demand: dict[str, float] = {}  # who waits on Slurm -> since when (monotonic)
        self._job_wants: set[str] = set()  # who wants jobs and partitions polled
        self.jobs_synced = False  # the job cache reflects a poll made while jobs were wanted
        self._last_poll_done = 0.0
        self._polls_started = 0
        self._polls_ended = 0
        self._polls_done = 0  # the number (`_polls_started`) of the last poll that succeeded
        self._poll_ended = asyncio.Event()  # set and replaced at the end of every poll

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
        whether or not a field the diff looks at did: a node handed from one job to the
        next between two polls looks the same before and after."""
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

    def demand(self, key: str, wanted: bool) -> None:
        """`key` (e.g. a NodeSet) waits on Slurm (`wanted`) or no longer does. While anyone
        waits the informer polls every `poll_interval`, otherwise every `idle_interval`."""
        if wanted and key not in self._demand:
            self._demand[key] = time.monotonic()
            self.poke()  # switch to fast polling now, not after the idle interval
        elif not wanted:
            self._demand.pop(key, None)

    def want_jobs(self, key: str, wanted: bool) -> None:
        """`key` reads jobs and partitions (`wanted`) or no longer does. Only while someone
        does are they polled (with the nodes, at the same cadence); the first poll after
        they became wanted lists them in full (`jobs_synced` until then False)."""
        if not self.watch_jobs:
            raise ValueError(f"{self}: jobs are not watched (watch_jobs=False)")
        if wanted:
            self._job_wants.add(key)
        else:
            self._job_wants.discard(key)
            if not self._job_wants:
                self.jobs_synced = False  # not polled from now on: the cache goes stale

    @property
    def polling_jobs(self) -> bool:
        return self.watch_jobs and bool(self._job_wants)

    async def refresh(self, timeout: float) -> bool:
        """Wait (at most `timeout` seconds) for a poll that starts after this call; True
        when it succeeded. Concurrent callers share the same poll."""
        target = self._polls_started + 1
        self.poke()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while self._polls_ended < target:
                    await self._poll_ended.wait()
        return self._polls_done >= target

    def mark(self) -> int:
        """A point in the informer's history, for `shows_since`."""
        return self._polls_started

    def shows_since(self, mark: int) -> bool:
        """Whether a poll that started after `mark` succeeded: the cache then shows what
        changed in Slurm before the mark was taken."""
        return self._polls_done > mark

    @property
    def polled_ago(self) -> float:
        """Seconds since the last successful poll ended."""
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

    def poke(self, *, full: bool = False) -> None:
        """Poll now (after we changed something and want to see the result early).
        `full`: list everything, as slurmctld does not advance `update_time` when a node is
        deleted, so a delta poll would not show the deletion."""
        if full:
            self._full_next = True
        self._wake.set()

    # ------------------------------------------------------------ lifecycle

    def task_name(self) -> str:
        return f"slurm informer {self.client.url}"

    async def run(self) -> None:
        backoff = Backoff(self.poll_interval * 2, self.max_backoff)
        while True:
            # Cleared before the poll: a poke made while it runs asks for another one.
            self._wake.clear()
            try:
                await self.poll_once()
                backoff.reset()
                delay = self.interval
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
                self._polls_ended = self._polls_started
                ended, self._poll_ended = self._poll_ended, asyncio.Event()
                ended.set()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)

    async def poll_once(self) -> None:
        """One poll: deltas, or a full list when due (or after being stale). Nodes, jobs and
        partitions are asked concurrently: a poll takes one round trip, not three."""
        now = time.monotonic()
        full = self.stale or self._full_next or now - self._last_resync >= self.resync_interval
        self._full_next = False
        self.polls += 1
        self._polls_started += 1
        number = self._polls_started
        with_jobs = self.polling_jobs
        full_jobs = full or not self.jobs_synced
        node_call = self.client.list_nodes(update_time=None if full else self._node_update)
        if with_jobs:
            (nodes, last), (jobs, job_last), (parts, part_last) = await asyncio.gather(
                node_call,
                self.client.list_jobs(update_time=None if full_jobs else self._job_update),
                self.client.list_partitions_since(None if full_jobs else self._partition_update),
            )
        else:
            nodes, last = await node_call
            jobs, job_last, parts, part_last = None, self._job_update, None, self._partition_update
        if full:
            self.full_lists += 1
            self._last_resync = now
        if nodes is not None:
            self._diff_nodes(nodes)
            if not full:
                for fn in list(self._node_list_subscribers):
                    try:
                        fn()
                    except Exception:
                        log.exception("%s: node list subscriber failed", self)
        elif jobs is None:
            self.unchanged_polls += 1
        self._node_update = last or self._node_update
        if with_jobs:
            if jobs is not None:
                self._diff_jobs(jobs)
            self._job_update = job_last or self._job_update
            if parts is not None:
                self.partitions = {p.name: p for p in parts}
            self._partition_update = part_last
            # Still wanted (not dropped while the poll ran): the job view is current.
            self.jobs_synced = self.polling_jobs
        self.last_success = time.time()
        self._last_poll_done = time.monotonic()
        self._polls_done = number
        self.last_error = ""
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


def _diff(
    kind: Literal["node", "job"],
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
