"""The scheduler as a bridge component (leader-elected: one replica submits)."""

from __future__ import annotations

import asyncio
import logging

from slinky.background import Backoff
from slinky.bridge.connection import SlurmConnection
from slinky.bridge.runtime import EVENT_CONTROLLER, Context
from slinky.bridge.scheduler import controller
from slinky.kube import events
from slinky.kube.informer import InformerFactory
from slinky.kube.serving import ProbeServer
from slinky.slurm.errors import SlurmError

log = logging.getLogger(__name__)


class SchedulerComponent:
    name = "scheduler"
    leader_elected = True

    def __init__(self, ctx: Context) -> None:
        self.slurm = SlurmConnection.from_config(ctx.config, needed_by="scheduler")
        self.factory = InformerFactory(ctx.kube)
        self.recorder = events.EventRecorder(
            ctx.kube, controller=EVENT_CONTROLLER, instance=ctx.identity
        )
        self.controller, self.sync, self.watch = controller.build(
            ctx.kube,
            self.factory,
            self.slurm,
            self.recorder,
            ctx.config,
            workers=ctx.args.scheduler_workers,
            job_recheck=float(ctx.args.job_recheck_interval),
        )
        self.leading = False

    def add_checks(self, probes: ProbeServer) -> None:
        probes.add_ready_check(
            "scheduler",
            lambda: (
                not self.leading or (self.factory.has_synced and self.slurm.informer.has_synced)
            ),
        )

    async def run(self, stop: asyncio.Event) -> None:
        self.leading = True
        self.factory.start()
        self.slurm.informer.start()
        try:
            ready = asyncio.create_task(self._ready())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([ready, stopping], return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
            stopping.cancel()
            if not stop.is_set():
                self.watch.start()
                await self.controller.run(stop)
        finally:
            self.leading = False
            await self.watch.stop()
            await self.factory.stop()
            await self.slurm.close()
            await self.recorder.flush()

    async def _ready(self) -> None:
        """Caches filled, and the jobs of a previous run found, before the first submit."""
        await asyncio.gather(self.factory.wait_synced(), self.slurm.informer.wait_synced())
        backoff = Backoff(1.0, 30.0)
        while True:
            try:
                found = await self.sync.recover()
                break
            except SlurmError as e:  # submitting before knowing would risk a second job
                delay = backoff.next()
                log.warning(
                    "scheduler: cannot look for earlier jobs (%s); retry in %.0fs", e, delay
                )
                await asyncio.sleep(delay)
        if found:
            log.info("scheduler: recovered %d submitted jobs from Slurm", found)
