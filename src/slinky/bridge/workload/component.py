"""The workload controller as a bridge component (leader-elected)."""

from __future__ import annotations

import logging

from slinky.bridge.runtime import Context
from slinky.bridge.slurmcomponent import SlurmComponent
from slinky.bridge.workload import controller

log = logging.getLogger(__name__)


class WorkloadComponent(SlurmComponent):
    name = "workload"
    needs_slurm = "workload controller"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.controller, self.sync, self.watch = controller.build(
            ctx.kube,
            self.factory,
            self.slurm,
            self.recorder,
            ctx.config,
            workers=ctx.args.workload_workers,
            job_recheck=float(ctx.args.job_recheck_interval),
            settled_recheck=float(ctx.args.running_job_recheck_interval),
        )

    async def startup(self) -> None:
        """The jobs whose pods went away while no replica watched are cancelled."""
        cancelled = await self.sync.cancel_orphans()
        if cancelled:
            log.info("workload: cancelled %d jobs whose pods are gone", cancelled)
