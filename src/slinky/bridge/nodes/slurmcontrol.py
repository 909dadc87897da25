"""Slurm-side effects of the node controller, each idempotent and fail-closed.

A Slurm node is removed only after a live answer from slurmctld says it is DRAIN and no job
is ALLOCATED, MIXED or COMPLETING there; a stale cache or any error means "not yet".
"""

from __future__ import annotations

import logging

from slinky.bridge.connection import SlurmConnection
from slinky.bridge.labels import REASON_PREFIX
from slinky.bridge.nodes.registration import Registration, registered_for
from slinky.slurm import drain as shared
from slinky.slurm import errors
from slinky.slurm.models import Node

log = logging.getLogger(__name__)


def cached(conn: SlurmConnection, name: str) -> Node | None:
    """The Slurm node from the informer's cache (no request), or None."""
    return conn.informer.nodes.get(name)


async def live(conn: SlurmConnection, name: str) -> Node | None:
    """The node as slurmctld has it now (the cache may lag a create or delete of ours)."""
    try:
        return await conn.client.get_node(name)
    except errors.SlurmNotFound:
        return None


async def drain(conn: SlurmConnection, name: str, reason: str) -> bool:
    """Drain unless already drained (whoever drained it keeps their reason): the shared rule
    of `slinky.slurm.drain`. True when a drain was requested now."""
    return await shared.drain(conn, name, reason)


async def undrain(conn: SlurmConnection, name: str) -> bool:
    """Undo a drain the bridge made (reason `slurm-bridge: ...`); an admin's is kept."""
    return await shared.undrain(conn, name, prefix=REASON_PREFIX)


async def is_drained(conn: SlurmConnection, name: str) -> bool | None:
    """True: drained and idle. False: not yet (or unknown: fail closed). None: no such node."""
    if conn.informer.stale or not conn.informer.has_synced:
        return False
    try:
        node = await conn.client.get_node(name)
    except errors.SlurmNotFound:
        return None
    except errors.SlurmError as e:
        log.info("slurm node %s: cannot check drain state (%s); treating as not drained", name, e)
        return False
    return node.state.is_drained


async def remove_when_drained(conn: SlurmConnection, name: str) -> bool:
    """Delete the Slurm node if it is drained and idle. True when it is gone."""
    drained = await is_drained(conn, name)
    if drained is None:
        return True
    if not drained:
        return False
    try:
        await conn.client.delete_node(name)
    except errors.SlurmNotFound:
        return True
    except errors.SlurmNodeBusy:
        return False
    conn.informer.poke(full=True)
    return True


async def register(conn: SlurmConnection, reg: Registration) -> None:
    """Create the EXTERNAL node and mark it as the bridge's."""
    try:
        await conn.client.create_node(reg.node_conf())
    except errors.SlurmError as create_error:
        # A create that reached slurmctld but whose answer was lost looks like this too:
        # if the node is there now and is what we asked for, the create did its job.
        node = await live(conn, reg.name)
        if node is None or not (
            registered_for(node, reg.cluster) == reg.kube_node or reg.adoptable(node)
        ):
            raise create_error from None
    await mark(conn, reg)


async def mark(conn: SlurmConnection, reg: Registration) -> None:
    """Mark a Slurm node as registered by the bridge for `reg.kube_node`."""
    await conn.client.update_node(reg.name, comment=reg.comment())
    conn.informer.poke()


def stuck_unresponsive(node: Node) -> bool:
    """An EXTERNAL node Slurm marked NOT_RESPONDING, idle and not drained. Slurm sets the flag
    when an RPC it sends to the node goes unanswered (there is no slurmd: `scontrol suspend`
    of a placeholder job is one), never pings an EXTERNAL node, and keeps the flag through
    RESUME, IDLE and UNDRAIN: no job is placed there again until the node is made anew.
    A drained node is left as it is (its drain, an admin's or a cordon's, would be lost)."""
    state = node.state
    return state.has("NOT_RESPONDING") and not state.is_busy and not state.is_drain


async def remake(conn: SlurmConnection, reg: Registration) -> bool:
    """Delete a `stuck_unresponsive` node of ours and register it again, decided on the live
    node (fail closed: a job that landed meanwhile makes slurmctld refuse the delete). True
    when it was made anew."""
    node = await live(conn, reg.name)
    if node is None or not stuck_unresponsive(node):
        return False
    try:
        await conn.client.delete_node(reg.name)
    except errors.SlurmNodeBusy:
        return False
    except errors.SlurmNotFound:
        pass
    await register(conn, reg)
    conn.informer.poke(full=True)
    return True


async def missing_partitions(conn: SlurmConnection, names: tuple[str, ...]) -> list[str]:
    """The partitions among `names` that slurmctld does not have."""
    missing = []
    for name in names:
        try:
            await conn.client.get_partition(name)
        except errors.SlurmNotFound:
            missing.append(name)
    return missing
