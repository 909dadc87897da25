"""What a bridge component is, so that each one can run as its own process (its own
Deployment) or all of them together in one (`make dev`).

A component is built from the shared `Context` at start-up (so a bad config fails before
anything runs), adds its probes, and runs until `stop`. Components that act on the cluster
(controllers, the scheduler) are `leader_elected`: each has its own Lease, so one replica of
each acts at a time, wherever it runs. Components that answer requests (the webhook) run on
every replica.
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass, field
from typing import Protocol

from slinky.bridge.config import BridgeConfig
from slinky.bridge.connection import SlurmConnection
from slinky.kube import rest
from slinky.kube.serving import ProbeServer

EVENT_CONTROLLER = "slinky.slurm.net/slurm-bridge"


@dataclass
class Context:
    """What every component gets: the API client, the config, the flags, who we are."""

    kube: rest.Kube
    config: BridgeConfig
    args: argparse.Namespace
    identity: str
    namespace: str
    _slurm: SlurmConnection | None = field(default=None, repr=False)

    def slurm(self, needed_by: str) -> SlurmConnection:
        """The process's one Slurm connection: the components that run together share its
        informer, so a changed Slurm node is read once per process, not once per
        component (each poll after a change returns the whole node list)."""
        if self._slurm is None:
            self._slurm = SlurmConnection.from_config(self.config, needed_by=needed_by)
        return self._slurm


class Component(Protocol):
    name: str
    leader_elected: bool

    def add_checks(self, probes: ProbeServer) -> None:
        """Register health and readiness checks."""
        ...

    async def run(self, stop: asyncio.Event) -> None:
        """Do the work until `stop` is set, then clean up and return."""
        ...
