"""Pieces shared by the long-running loops (Kubernetes and Slurm informers): exponential
backoff with jitter, and a loop run as one restartable background task."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

log = logging.getLogger(__name__)


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
    """`start()` runs `self.run()` as a task (once); `stop()` cancels it and waits."""

    _task: asyncio.Task[None] | None = None

    def task_name(self) -> str:
        return type(self).__name__

    async def run(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name=self.task_name())
            self._task.add_done_callback(self._report_death)

    def _report_death(self, task: asyncio.Task[None]) -> None:
        # `run` loops retry the errors they expect; anything else ends the task, and nobody
        # awaits it until `stop()`: say so now, or the process runs on with a frozen cache.
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("%s stopped: %r", task.get_name(), error, exc_info=error)

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
