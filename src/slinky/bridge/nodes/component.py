"""The node controller as a bridge component (leader-elected)."""

from __future__ import annotations

import asyncio
import logging

from slinky.bridge.nodes import controller
from slinky.bridge.runtime import EVENT_CONTROLLER, Context
from slinky.kube import events
from slinky.kube.informer import InformerFactory
from slinky.kube.serving import ProbeServer

log = logging.getLogger(__name__)


class NodeComponent:
    """The node controller as a bridge component (leader-elected)."""

    name = "nodes"
    leader_elected = True
    needs_slurm = "node controller"

    def __init__(self, ctx: Context) -> None:
        self.slurm = ctx.slurm(self.needs_slurm)
        self.factory = InformerFactory(ctx.kube)
        self.recorder = events.EventRecorder(
            ctx.kube, controller=EVENT_CONTROLLER, instance=ctx.identity
        )
        self.controller = controller.build(
            ctx.kube,
            self.factory,
            self.slurm,
            self.recorder,
            ctx.config,
            workers=ctx.args.node_workers,
        )
        self.leading = False

    def add_checks(self, probes: ProbeServer) -> None:
        # A standby replica is ready: it serves its other components and waits for the Lease.
        probes.add_ready_check(
            "nodes",
            lambda: (
                not self.leading or (self.factory.has_synced and self.slurm.informer.has_synced)
            ),
        )

    async def run(self, stop: asyncio.Event) -> None:
        self.leading = True
        self.factory.start()
        self.slurm.open()
        try:
            synced = asyncio.create_task(self.slurm.informer.wait_synced())
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([synced, stopping], return_when=asyncio.FIRST_COMPLETED)
            synced.cancel()
            stopping.cancel()
            if not stop.is_set():
                await self.controller.run(stop)
        finally:
            self.leading = False
            await self.factory.stop()
            await self.slurm.close()
            await self.recorder.flush()
