"""When the slurmctld answering now started, asked seldom and shared by every reader.

slurmctld restarted from state saved before its last submissions gives their job ids to new
jobs, so whatever a process read of a job under an id is trusted only while the slurmctld
that answered still runs. slurmrestd's `diag` says when slurmctld's statistics started
(`req_time_start`): at its start, and again when an admin resets them (`sdiag -r`), which
costs readers one extra read of what they hold, never a wrong answer.
"""

from __future__ import annotations

import asyncio
import logging
import time

from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.models import number

log = logging.getLogger(__name__)


class SlurmctldStart:
    """`diag`'s start time, asked at most once per `max_age` a caller accepts; concurrent
    callers share one request."""

    def __init__(self, client: SlurmClient) -> None:
        self.client = client
        self.value: int | None = None  # the last answer (None: not asked yet, or not told)
        self.asked_at = -float("inf")  # monotonic time the last answer was asked for
        self.requests = 0
        self._lock = asyncio.Lock()
        self._told_unknown = False

    async def get(self, max_age: float) -> int | None:
        """slurmctld's start time as of at most `max_age` seconds ago; None when slurmrestd
        answers diag without one (an unknown start is not a new one). SlurmUnavailable
        when slurmrestd cannot be reached."""
        async with self._lock:  # a caller that waited here takes the answer just made
            if time.monotonic() - self.asked_at <= max_age:
                return self.value
            asked_at = time.monotonic()
            self.requests += 1
            try:
                value = number((await self.client.diag()).get("req_time_start"))
            except errors.SlurmUnavailable:
                raise
            except errors.SlurmError as e:
                # An error answer says nothing of a restart: the last answer stands.
                log.info("diag: %s; slurmctld's start taken as last told", e)
                value = self.value
            if value is None and not self._told_unknown:
                self._told_unknown = True
                log.warning(
                    "slurmrestd's diag gives no req_time_start: a job id slurmctld gives "
                    "again after a restart is noticed only once its state differs"
                )
            self.value, self.asked_at = value, asked_at
            return value
