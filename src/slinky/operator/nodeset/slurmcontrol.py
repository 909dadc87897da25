"""Slurm-side effects of the NodeSet controller, and the one question that guards every
pod deletion: is this Slurm node drained?

Fail closed: a stale cache, an unreachable slurmrestd or any error while checking means
"not drained", and the pod stays. Only a definite answer deletes: the node is DRAIN with no
job ALLOCATED, MIXED or COMPLETING, or slurmctld says there is no such node (its slurmd never
registered or already removed itself), so nothing can be running there.
"""

from __future__ import annotations

import logging

from slinky.operator.clients import Connection
from slinky.operator.nodeset.builder import REASON_PREFIX
from slinky.slurm import errors
from slinky.slurm.models import Node

log = logging.getLogger(__name__)

REASON_SCALE_IN = f"{REASON_PREFIX}scale-in"
REASON_UPDATE = f"{REASON_PREFIX}rolling update"
REASON_POD_CORDON = f"{REASON_PREFIX}pod cordoned"


def is_operator_reason(reason: str) -> bool:
    return reason.startswith(REASON_PREFIX)


def cached_node(conn: Connection | None, name: str) -> Node | None:
    if conn is None:
        return None
    return conn.informer.nodes.get(name)


async def is_drained(conn: Connection | None, name: str) -> bool:
    """Authoritative, fail-closed check made right before deleting a pod."""
    if conn is None or conn.informer.stale or not conn.informer.has_synced:
        return False
    try:
        node = await conn.client.get_node(name)
    except errors.SlurmNotFound:
        return True
    except errors.SlurmError as e:
        log.info("node %s: cannot check drain state (%s); treating as not drained", name, e)
        return False
    return node.state.is_drained


async def drain(conn: Connection, name: str, reason: str) -> bool:
    """Drain unless already drained (an admin's drain and reason are left as they are).
    Returns True when a drain was requested now."""
    node = cached_node(conn, name)
    if node is not None and node.state.is_drain:
        return False
    try:
        await conn.client.drain_node(name, reason)
    except errors.SlurmNotFound:
        return False
    conn.informer.poke()
    return True


async def undrain(conn: Connection, name: str) -> bool:
    """Undo a drain the operator made; never an admin's. Returns True if undrained now."""
    node = cached_node(conn, name)
    if node is None or not node.state.is_drain or not is_operator_reason(node.reason):
        return False
    try:
        await conn.client.undrain_node(name)
    except errors.SlurmNotFound:
        return False
    conn.informer.poke()
    return True


async def set_comment(conn: Connection, name: str, comment: str) -> None:
    node = cached_node(conn, name)
    if node is None or node.comment == comment:
        return
    try:
        await conn.client.update_node(name, comment=comment)
    except errors.SlurmNotFound:
        return
