"""The scheduler as a bridge component (leader-elected: one replica submits)."""

from __future__ import annotations

import logging

from slinky.bridge.runtime import Context
from slinky.bridge.scheduler import controller
from slinky.bridge.slurmcomponent import SlurmComponent

log = logging.getLogger(__name__)


class SchedulerComponent(SlurmComponent):
    name = "scheduler"
    needs_slurm = "scheduler"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.controller, self.sync, self.watch = controller.build(
            ctx.kube,
            self.factory,
            self.slurm,
            self.recorder,
            ctx.config,
            workers=ctx.args.scheduler_workers,
            job_recheck=float(ctx.args.job_recheck_interval),
            settled_recheck=float(ctx.args.running_job_recheck_interval),
            own_namespace=ctx.namespace,
        )

    async def startup(self) -> None:
        """The jobs of a previous run found before the first submit (submitting before
        knowing would risk a second job)."""
        found = await self.sync.recover()
        if found:
            log.info("scheduler: recovered %d submitted jobs from Slurm", found)
