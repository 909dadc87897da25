"""Pieces shared by the long-running loops (Kubernetes and Slurm informers): exponential
backoff with jitter, and a loop run as one supervised background task.

A loop that dies of an unexpected exception is restarted with backoff, and reports itself
unhealthy (`failure`) until it runs again, so `/healthz` shows it instead of a cache that
silently stopped moving."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

log = logging.getLogger(__name__)


def cancelling() -> bool:
    """Whether the running task is being cancelled. A library may turn the CancelledError it
    received mid-request into an error of its own (a read error, say); a loop that retries
    such errors must check this, or `stop()` would wait for ever."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class Backoff:
    """Exponential backoff with jitter: initial, 2x, 4x, ... capped at `maximum`."""

    def __init__(self, initial: float = 0.2, maximum: float = 30.0) -> None:
        self.initial = initial
        self.maximum = maximum
        self._next = initial

    def next(self) -> float:
        delay = self._next
        self._next = min(self._next * 2, self.maximum)
        return delay * random.uniform(0.8, 1.2)

    def reset(self) -> None:
        self._next = self.initial


class BackgroundLoop:
    """`start()` runs `self.run()` as a supervised task (once); `stop()` cancels it."""

    _task: asyncio.Task[None] | None = None
    failure: str | None = None  # why the loop is down, while it waits to be restarted
    restarts: int = 0

    def task_name(self) -> str:
        return type(self).__name__

    async def run(self) -> None:
        raise NotImplementedError

    @property
    def healthy(self) -> bool:
        return self.failure is None

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._supervise(), name=self.task_name())

    async def _supervise(self) -> None:
        backoff = Backoff(1.0, 30.0)
        while True:
            try:
                await self.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if cancelling():
                    raise asyncio.CancelledError from e
                self.failure = f"{type(e).__name__}: {e}"
                delay = backoff.next()
                log.exception("%s died; restarting in %.1fs", self.task_name(), delay)
                await asyncio.sleep(delay)
                self.restarts += 1
                self.failure = None

    # How long `stop()` waits for the loop to end once cancelled. A loop blocked in a
    # request that ignores cancellation (seen under heavy load, inside the HTTP client) must
    # not hold up the shutdown of everything stopped after it.
    stop_timeout: float = 10.0

    async def stop(self) -> None:
        """Cancel the loop and wait until it ended, at most `stop_timeout`. Cancelled again
        every second while it runs: a cancellation that lands inside an HTTP read can come out
        as a connection error, which the loop catches and retries, so one cancel could wait
        for ever (a process that never exits on SIGTERM)."""
        task, self._task = self._task, None
        if task is None:
            return
        deadline = asyncio.get_running_loop().time() + self.stop_timeout
        while not task.done():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                log.error(
                    "%s did not stop within %.0fs; left behind",
                    self.task_name(),
                    self.stop_timeout,
                )
                return
            task.cancel()
            await asyncio.wait([task], timeout=min(1.0, left))
        with contextlib.suppress(asyncio.CancelledError):
            task.result()
