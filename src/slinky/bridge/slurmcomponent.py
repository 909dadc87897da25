"""What the bridge's controllers (nodes, scheduler, workload) share as components:
leader-elected, their own informers, Slurm connection and event recorder, ready when their
caches are (a standby replica is ready at once: it serves its other components and waits for
the Lease), and an optional start-up step against Slurm, retried with backoff, once the caches
are filled and before the controller's first reconcile."""

from __future__ import annotations

import asyncio
import logging

from slinky.background import Backoff
from slinky.bridge.jobwatch import JobWatch
from slinky.bridge.runtime import EVENT_CONTROLLER, Context
from slinky.kube import events
from slinky.kube.controller import Controller
from slinky.kube.informer import InformerFactory
from slinky.kube.serving import ProbeServer
from slinky.slurm.errors import SlurmError

log = logging.getLogger(__name__)


class SlurmComponent:
    """Subclasses set `name` and `needs_slurm`, build `controller` (and a `watch` of Slurm
    jobs, if they follow any) from `factory`, `slurm` and `recorder`, and may say what
    `startup` does."""

    name = ""
    leader_elected = True
    needs_slurm = ""  # who needs it, for the error naming a missing Slurm setting
    controller: Controller
    watch: JobWatch | None = None

    def __init__(self, ctx: Context) -> None:
        self.slurm = ctx.slurm(self.needs_slurm)
        self.factory = InformerFactory(ctx.kube)
        self.recorder = events.EventRecorder(
            ctx.kube, controller=EVENT_CONTROLLER, instance=ctx.identity
        )
        self.leading = False

    async def startup(self) -> None:
        """The step against Slurm before the first reconcile; a SlurmError is retried."""

    def add_checks(self, probes: ProbeServer) -> None:
        probes.add_ready_check(
            self.name,
            lambda: (
                not self.leading or (self.factory.has_synced and self.slurm.informer.has_synced)
            ),
        )

    async def run(self, stop: asyncio.Event) -> None:
        self.leading = True
        self.factory.start()
        self.slurm.open()
        try:
            ready = asyncio.create_task(self._ready())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([ready, stopping], return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
            stopping.cancel()
            if not stop.is_set():
                if self.watch is not None:
                    self.watch.start()
                await self.controller.run(stop)
        finally:
            self.leading = False
            if self.watch is not None:
                await self.watch.stop()
            await self.factory.stop()
            await self.slurm.close()
            await self.recorder.flush()

    async def _ready(self) -> None:
        await asyncio.gather(self.factory.wait_synced(), self.slurm.informer.wait_synced())
        backoff = Backoff(1.0, 30.0)
        while True:
            try:
                await self.startup()
                return
            except SlurmError as e:
                delay = backoff.next()
                log.warning("%s: start-up step failed (%s); retry in %.0fs", self.name, e, delay)
                await asyncio.sleep(delay)
