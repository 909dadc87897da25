"""The node controller as a bridge component (leader-elected)."""

from __future__ import annotations

from slinky.bridge.nodes import controller
from slinky.bridge.runtime import Context
from slinky.bridge.slurmcomponent import SlurmComponent


class NodeComponent(SlurmComponent):
    name = "nodes"
    needs_slurm = "node controller"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.controller = controller.build(
            ctx.kube,
            self.factory,
            self.slurm,
            self.recorder,
            ctx.config,
            workers=ctx.args.node_workers,
        )
