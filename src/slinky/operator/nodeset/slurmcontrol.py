"""Slurm-side effects of the NodeSet controller: drain, undrain, the identity comment.

Drain and undrain read the node live (`GET /node/<name>`) right before writing, so a drain an
admin made since the last poll is neither overwritten (drain) nor undone (undrain); a node
whose comment names a pod of another NodeSet is never written at all.
"""

from __future__ import annotations

import logging

from slinky.operator.clients import Connection
from slinky.operator.nodeset.builder import REASON_PREFIX
from slinky.operator.nodeset.view import belongs_to
from slinky.slurm import errors
from slinky.slurm.models import Node

log = logging.getLogger(__name__)

REASON_SCALE_IN = f"{REASON_PREFIX}scale-in"
REASON_UPDATE = f"{REASON_PREFIX}rolling update"
REASON_POD_CORDON = f"{REASON_PREFIX}pod cordoned"
REASON_DELETED = f"{REASON_PREFIX}nodeset deleted"


def is_operator_reason(reason: str) -> bool:
    return reason.startswith(REASON_PREFIX)


class CannotRead(Exception):
    """The node could not be read live: nothing is written on a guess."""


async def live_node(conn: Connection, name: str) -> Node | None:
    """The node as slurmctld sees it now; None for a definite "no such node"."""
    try:
        return await conn.client.get_node(name)
    except errors.SlurmNotFound:
        return None
    except errors.SlurmError as e:
        log.info("node %s: cannot read it live (%s); not writing", name, e)
        raise CannotRead(str(e)) from None


async def drain(conn: Connection, name: str, reason: str, *, namespace: str) -> bool:
    """Drain unless already DRAIN (whoever drained it keeps their reason), absent, or
    claimed by another pod. Returns True when a drain was requested now."""
    cached = conn.informer.nodes.get(name)
    if cached is None or cached.state.is_drain:
        # Not registered as far as we know: the drained check asks Slurm, and a node that
        # registered meanwhile is drained on the next pass, once the cache shows it.
        return False
    try:
        node = await live_node(conn, name)
    except CannotRead:
        return False
    if node is None or node.state.is_drain or not belongs_to(node, namespace, name):
        return False
    try:
        await conn.client.drain_node(name, reason)
    except errors.SlurmNotFound:
        return False
    conn.informer.poke()
    return True


async def undrain(conn: Connection, name: str, *, namespace: str) -> bool:
    """Undo a drain the operator made; never an admin's. Returns True if undrained now."""
    cached = conn.informer.nodes.get(name)
    if cached is None or not cached.state.is_drain or not is_operator_reason(cached.reason):
        return False
    try:
        node = await live_node(conn, name)
    except CannotRead:
        return False
    if (
        node is None
        or not node.state.is_drain
        or not is_operator_reason(node.reason)
        or not belongs_to(node, namespace, name)
    ):
        return False
    try:
        await conn.client.undrain_node(name)
    except errors.SlurmNotFound:
        return False
    conn.informer.poke()
    return True


async def set_comment(conn: Connection, node: Node, comment: str) -> None:
    if node.comment == comment:
        return
    try:
        await conn.client.update_node(node.name, comment=comment)
    except errors.SlurmNotFound:
        return
