"""A controller: watches feed a work queue of keys; N workers call `reconcile(key)`.

Watches only map events to keys (level-triggered: a key says "look at this object again",
never what changed). Results and errors decide when a key comes back: `requeue_after` for
polling something outside Kubernetes, rate-limited backoff for errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from slinky.background import cancelling
from slinky.kube import metrics
from slinky.kube.informer import Handler
from slinky.kube.queue import WorkQueue
from slinky.kube.store import key_of
from slinky.types import JSON

log = logging.getLogger(__name__)

Mapper = Callable[[JSON], Iterable[str]]


@dataclass(frozen=True)
class Result:
    """What a reconcile asks for next. The default: nothing until something changes."""

    requeue_after: float | None = None
    requeue: bool = False


DONE = Result()


class Reconciler(Protocol):
    async def reconcile(self, key: str) -> Result: ...


class Source(Protocol):
    """Anything that dispatches object events and can say when it has synced
    (an Informer, a MultiInformer)."""

    def add_handler(self, handler: Handler) -> None: ...

    async def wait_synced(self) -> None: ...


def owner_mapper(kind: str, api_version: str | None = None) -> Mapper:
    """Map a child to the key of its controlling owner of `kind` (same namespace)."""

    def mapper(obj: JSON) -> list[str]:
        meta = obj["metadata"]
        for ref in meta.get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == kind:
                if api_version and ref.get("apiVersion") != api_version:
                    continue
                ns = meta.get("namespace")
                return [f"{ns}/{ref['name']}" if ns else str(ref["name"])]
        return []

    return mapper


def own_key(obj: JSON) -> list[str]:
    return [key_of(obj)]


_VOLATILE_META = frozenset({"resourceVersion", "managedFields"})


def beyond_status(old: JSON | None, new: JSON) -> bool:
    """A predicate for `watch`: the object was added, or changed in more than its status
    (the controller's own status writes do not enqueue it again)."""
    if old is None:
        return True
    if any(old.get(k) != new.get(k) for k in (old.keys() | new.keys()) - {"status", "metadata"}):
        return True
    om, nm = old.get("metadata") or {}, new.get("metadata") or {}
    return any(om.get(k) != nm.get(k) for k in (om.keys() | nm.keys()) - _VOLATILE_META)


class Controller:
    """Workers draining one queue with one reconciler."""

    def __init__(
        self,
        name: str,
        reconciler: Reconciler,
        *,
        workers: int = 1,
        queue: WorkQueue | None = None,
    ) -> None:
        self.name = name
        self.reconciler = reconciler
        self.workers = workers
        self.queue = queue or WorkQueue(name, controller=name)
        self._informers: list[Source] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._m_total = {
            r: metrics.RECONCILE_TOTAL.labels(controller=name, result=r)
            for r in ("success", "error", "requeue", "requeue_after")
        }
        self._m_errors = metrics.RECONCILE_ERRORS.labels(controller=name)
        self._m_time = metrics.RECONCILE_TIME.labels(controller=name)
        self._m_active = metrics.ACTIVE_WORKERS.labels(controller=name)
        metrics.MAX_CONCURRENT.labels(controller=name).set(workers)

    # ------------------------------------------------------------ sources

    def watch(
        self,
        informer: Source,
        mapper: Mapper = own_key,
        *,
        predicate: Callable[[JSON | None, JSON], bool] | None = None,
    ) -> None:
        """Enqueue `mapper(obj)` for every add/update/delete the informer sees.
        `predicate(old, new)` may filter updates (and adds, with old=None)."""
        self._informers.append(informer)

        def enqueue(obj: JSON) -> None:
            for key in mapper(obj):
                self.queue.add(key)

        def on_add(obj: JSON) -> None:
            if predicate is None or predicate(None, obj):
                enqueue(obj)

        def on_update(old: JSON, new: JSON) -> None:
            if predicate is None or predicate(old, new):
                enqueue(old)
                enqueue(new)

        informer.add_handler(Handler(on_add=on_add, on_update=on_update, on_delete=enqueue))

    def owns(self, informer: Source, kind: str, api_version: str | None = None) -> None:
        """Children (pods, services, ...) enqueue their controlling owner of `kind`."""
        self.watch(informer, owner_mapper(kind, api_version))

    def enqueue(self, key: str, *, after: float = 0.0) -> None:
        """For sources outside Kubernetes (the Slurm event channel, timers)."""
        self.queue.add_after(key, after)

    # ------------------------------------------------------------ running

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Wait for the informers to sync, run the workers until `stop` or cancellation,
        then let in-flight reconciles finish."""
        await asyncio.gather(*(i.wait_synced() for i in self._informers))
        self._tasks = [
            asyncio.create_task(self._worker(i), name=f"{self.name} worker {i}")
            for i in range(self.workers)
        ]
        log.info("controller %s: started %d workers", self.name, self.workers)
        stop = stop or asyncio.Event()
        try:
            while not stop.is_set():  # refresh the in-flight work gauges once a second
                self.queue.update_unfinished_metrics()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
        except asyncio.CancelledError:
            # Cancelled (leadership lost): stop at once, as controller-runtime does; another
            # replica may act from now on, so in-flight work must not finish.
            await self.shutdown(drain_timeout=0)
            raise
        await self.shutdown()

    async def shutdown(self, *, drain_timeout: float = 30.0) -> None:
        """Stop taking keys; let in-flight reconciles finish for `drain_timeout` seconds
        (0: cancel them now)."""
        self.queue.shutdown()
        if drain_timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.queue.drain(), drain_timeout)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    async def _worker(self, _index: int) -> None:
        while True:
            key = await self.queue.get()
            if key is None:
                return
            self._m_active.inc()
            try:
                await self._reconcile_one(key)
            finally:
                self._m_active.dec()
                self.queue.done(key)
            # One turn of the loop between keys: a reconcile answered from caches suspends
            # nowhere, and keys that keep coming back would otherwise hold the loop (no
            # Lease renewal, probe or signal) for as long as they do.
            await asyncio.sleep(0)

    async def _reconcile_one(self, key: str) -> None:
        start = time.monotonic()
        try:
            result = await self.reconciler.reconcile(key)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if cancelling():  # the error stands for our cancellation: stop, not retry
                raise asyncio.CancelledError from e
            self._m_total["error"].inc()
            self._m_errors.inc()
            retries = self.queue.num_requeues(key)
            log.error(
                "controller %s: reconcile %s failed (retry %d): %s: %s",
                self.name,
                key,
                retries,
                type(e).__name__,
                e,
                exc_info=log.isEnabledFor(logging.DEBUG),
            )
            self.queue.add_rate_limited(key)
            return
        finally:
            self._m_time.observe(time.monotonic() - start)
        if result.requeue_after is not None and result.requeue_after > 0:
            self._m_total["requeue_after"].inc()
            self.queue.forget(key)
            self.queue.add_after(key, result.requeue_after)
        elif result.requeue:
            self._m_total["requeue"].inc()
            self.queue.add_rate_limited(key)
        else:
            self._m_total["success"].inc()
            self.queue.forget(key)


async def run_all(controllers: Iterable[Controller], stop: asyncio.Event) -> None:
    """Run several controllers until `stop`; if one fails, stop the others too."""
    tasks = [asyncio.create_task(c.run(stop)) for c in controllers]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
