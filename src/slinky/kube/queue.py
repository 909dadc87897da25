"""A deduplicating, rate-limited work queue with client-go's guarantees.

- A key waits in the queue at most once, however often it is added (`dirty`).
- A key is never handed to two workers at once (`processing`); if it is added while being
  processed it is queued again when the worker calls `done`, so the change is not lost.
- `add_rate_limited` delays by the larger of a per-key exponential backoff (5 ms doubling to
  1000 s) and an overall token bucket (10/s, burst 100); `forget` resets the key's backoff.
- `add_after` keeps only the earliest pending time per key.
- `shutdown` stops handing out keys; `drain` waits for in-flight work to finish.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from slinky.kube import metrics


class ItemExponentialLimiter:
    """base * 2^failures per key, capped."""

    def __init__(self, base: float = 0.005, cap: float = 1000.0) -> None:
        self.base = base
        self.cap = cap
        self._failures: dict[str, int] = {}

    def when(self, key: str) -> float:
        n = self._failures.get(key, 0)
        self._failures[key] = n + 1
        if n > 60:  # 2^60 overflows any cap we would use
            return self.cap
        return float(min(self.base * (2**n), self.cap))

    def forget(self, key: str) -> None:
        self._failures.pop(key, None)

    def retries(self, key: str) -> int:
        return self._failures.get(key, 0)


class BucketLimiter:
    """A token bucket shared by all keys: overall retry rate limit."""

    def __init__(self, rate: float = 10.0, burst: int = 100) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = float(burst)
        self._last = time.monotonic()

    def when(self, _key: str) -> float:
        now = time.monotonic()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= 1
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


class RateLimiter:
    """The max of per-key exponential backoff and the overall bucket (client-go default)."""

    def __init__(
        self, item: ItemExponentialLimiter | None = None, bucket: BucketLimiter | None = None
    ) -> None:
        self.item = item or ItemExponentialLimiter()
        self.bucket = bucket or BucketLimiter()

    def when(self, key: str) -> float:
        return max(self.item.when(key), self.bucket.when(key))

    def forget(self, key: str) -> None:
        self.item.forget(key)

    def retries(self, key: str) -> int:
        return self.item.retries(key)


class WorkQueue:
    """Keys to reconcile. All methods are called from the event loop's thread."""

    def __init__(
        self, name: str = "", *, limiter: RateLimiter | None = None, controller: str = ""
    ) -> None:
        self.name = name
        self.limiter = limiter or RateLimiter()
        self._queue: deque[str] = deque()
        self._dirty: set[str] = set()
        self._processing: dict[str, float] = {}
        self._added_at: dict[str, float] = {}
        self._waiting: dict[str, tuple[float, asyncio.TimerHandle]] = {}
        self._ready = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._shutting_down = False
        labels = {"name": name, "controller": controller or name}
        self._m_depth = metrics.WQ_DEPTH.labels(**labels)
        self._m_adds = metrics.WQ_ADDS.labels(**labels)
        self._m_queue = metrics.WQ_QUEUE_DURATION.labels(**labels)
        self._m_work = metrics.WQ_WORK_DURATION.labels(**labels)
        self._m_retries = metrics.WQ_RETRIES.labels(**labels)
        self._m_unfinished = metrics.WQ_UNFINISHED.labels(**labels)
        self._m_longest = metrics.WQ_LONGEST.labels(**labels)

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, key: str) -> None:
        if self._shutting_down or key in self._dirty:
            return
        self._m_adds.inc()
        self._dirty.add(key)
        self._added_at.setdefault(key, time.monotonic())
        if key in self._processing:
            return
        self._queue.append(key)
        self._m_depth.set(len(self._queue))
        self._ready.set()

    def add_after(self, key: str, delay: float) -> None:
        """Add `key` after `delay` seconds (at once if <= 0); keeps the earliest time."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        at = loop.time() + delay
        pending = self._waiting.get(key)
        if pending is not None:
            if pending[0] <= at:
                return
            pending[1].cancel()
        handle = loop.call_at(at, self._fire, key)
        self._waiting[key] = (at, handle)

    def _fire(self, key: str) -> None:
        self._waiting.pop(key, None)
        self.add(key)

    def add_rate_limited(self, key: str) -> None:
        self._m_retries.inc()
        self.add_after(key, self.limiter.when(key))

    def forget(self, key: str) -> None:
        """Stop tracking the key's failures (call after a successful reconcile)."""
        self.limiter.forget(key)

    def num_requeues(self, key: str) -> int:
        return self.limiter.retries(key)

    async def get(self) -> str | None:
        """The next key to process, or None once shut down."""
        while not self._queue:
            if self._shutting_down:
                return None
            self._ready.clear()
            await self._ready.wait()
        key = self._queue.popleft()
        self._m_depth.set(len(self._queue))
        now = time.monotonic()
        self._m_queue.observe(now - self._added_at.pop(key, now))
        self._dirty.discard(key)
        self._processing[key] = now
        self._idle.clear()
        return key

    def done(self, key: str) -> None:
        """The worker finished `key`; re-queue it if it was added meanwhile."""
        started = self._processing.pop(key, None)
        if started is not None:
            self._m_work.observe(time.monotonic() - started)
        if key in self._dirty:
            self._queue.append(key)
            self._m_depth.set(len(self._queue))
            self._ready.set()
        if not self._processing:
            self._idle.set()

    def update_unfinished_metrics(self) -> None:
        now = time.monotonic()
        running = [now - t for t in self._processing.values()]
        self._m_unfinished.set(sum(running))
        self._m_longest.set(max(running, default=0.0))

    def shutdown(self) -> None:
        """Hand out no more keys; pending delayed adds are dropped."""
        self._shutting_down = True
        for _, handle in self._waiting.values():
            handle.cancel()
        self._waiting.clear()
        self._queue.clear()
        self._dirty.clear()
        self._ready.set()

    async def drain(self) -> None:
        """Wait until no key is being processed."""
        await self._idle.wait()
