"""Drain and undrain a Slurm node: one rule for the operator and the bridge.

- **Decided on the live node.** The cache only saves a request when it already shows there is
  nothing to do; the write follows a `GET /node/<name>` made just before, so a drain an admin
  made since the last poll is neither overwritten (drain) nor undone (undrain).
- **Our reason prefix.** Each half writes reasons that start with its own prefix
  (`slurm-operator: `, `slurm-bridge: `) and undoes only drains whose reason has that prefix:
  an admin's drain, or the other half's, is kept.
- **Never on a guess.** A node the cache does not know is left alone (the caller comes back
  once it registers); a live read that fails raises `CannotRead` and nothing is written; a
  node that `ours` rejects (the operator's: claimed by another pod) is never written.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.models import Node

log = logging.getLogger(__name__)


class Slurm(Protocol):
    """What both halves' connections have: a client and the node cache it fills."""

    @property
    def client(self) -> SlurmClient: ...

    @property
    def informer(self) -> SlurmInformer: ...


class CannotRead(errors.SlurmError):
    """The node could not be read live: nothing was written."""


def _any(node: Node) -> bool:
    return True


async def live(slurm: Slurm, name: str) -> Node | None:
    """The node as slurmctld has it now; None for a definite "no such node"."""
    try:
        return await slurm.client.get_node(name)
    except errors.SlurmNotFound:
        return None
    except errors.SlurmError as e:
        log.info("slurm node %s: cannot read it live (%s); not writing", name, e)
        raise CannotRead(f"cannot read node {name} live: {e}", status=e.status) from e


async def drain(
    slurm: Slurm, name: str, reason: str, *, ours: Callable[[Node], bool] = _any
) -> bool:
    """Drain with `reason` unless already DRAIN (whoever drained it keeps their reason),
    unknown, or not `ours`. True when a drain was requested now."""
    cached = slurm.informer.nodes.get(name)
    if cached is None or cached.state.is_drain:
        return False
    node = await live(slurm, name)
    if node is None or node.state.is_drain or not ours(node):
        return False
    try:
        await slurm.client.drain_node(name, reason)
    except errors.SlurmNotFound:
        return False
    slurm.informer.poke()
    return True


async def undrain(
    slurm: Slurm, name: str, *, prefix: str, ours: Callable[[Node], bool] = _any
) -> bool:
    """Undo a drain whose reason starts with `prefix` (ours); any other drain stays.
    True when an undrain was requested now."""
    cached = slurm.informer.nodes.get(name)
    if cached is None or not cached.state.is_drain or not cached.reason.startswith(prefix):
        return False
    node = await live(slurm, name)
    if (
        node is None
        or not node.state.is_drain
        or not node.reason.startswith(prefix)
        or not ours(node)
    ):
        return False
    try:
        await slurm.client.undrain_node(name)
    except errors.SlurmNotFound:
        return False
    slurm.informer.poke()
    return True
