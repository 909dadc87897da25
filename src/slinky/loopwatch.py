"""A blocked event loop says where it is blocked.

Every decision of our processes runs on one asyncio loop. Code that holds the loop (a
synchronous call that waits, or a loop without an `await` that suspends) stops everything at
once: Lease renewals, probes, SIGTERM. Nothing in the process can log then, so a thread does:

- the loop beats every `interval` seconds (a timer callback, not a task);
- a beat that comes more than LATE_S late logs a warning once the loop is free again (how
  long it was held);
- when no beat came for `stall` seconds, the thread writes an ERROR line and every thread's
  stack (faulthandler, straight to the file descriptor: no Python lock is taken, so a loop
  blocked inside logging does not block the report), and again every `again` seconds while
  the loop stays blocked.

The process is left running: the liveness probe (which the blocked loop no longer answers)
decides whether to restart it.
"""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import threading
import time

from slinky.kube import logs

log = logging.getLogger(__name__)

LATE_S = 2.0


class LoopWatch:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        interval: float = 1.0,
        stall: float = 10.0,
        again: float = 60.0,
        fd: int = 2,
        formatter: logging.Formatter | None = None,
    ) -> None:
        self.loop = loop
        self.interval = interval
        self.stall = stall
        self.again = again
        self.fd = fd
        # The ERROR line is formatted as the process's log lines are (`logs.formatter`).
        self.formatter = formatter or logs.formatter()
        self.dumps = 0
        self._last = time.monotonic()
        self._due = self._last + interval
        self._timer: asyncio.TimerHandle | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop-watch", daemon=True)

    def start(self) -> None:
        self._last = time.monotonic()
        self._due = self._last + self.interval
        self._timer = self.loop.call_later(self.interval, self._beat)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.cancel()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval)

    def _beat(self) -> None:
        now = time.monotonic()
        late = now - self._due
        if late > LATE_S:
            log.warning("the event loop was held for %.1fs (no other work ran meanwhile)", late)
        self._last = now
        self._due = now + self.interval
        self._timer = self.loop.call_later(self.interval, self._beat)

    def _watch(self) -> None:
        dumped_at: float | None = None
        while not self._stop.wait(self.interval / 2):
            now = time.monotonic()
            blocked = now - self._last
            if blocked < self.stall:
                dumped_at = None
                continue
            if dumped_at is not None and now - dumped_at < self.again:
                continue
            dumped_at = now
            self.dumps += 1
            os.write(self.fd, self._line(blocked).encode())
            faulthandler.dump_traceback(file=self.fd, all_threads=True)

    def _line(self, blocked: float) -> str:
        record = log.makeRecord(
            log.name,
            logging.ERROR,
            __file__,
            0,
            "the event loop has been blocked for %.0fs (no Lease renewal, probe or signal is "
            "handled); every thread's stack follows",
            (blocked,),
            None,
        )
        return self.formatter.format(record) + "\n"
