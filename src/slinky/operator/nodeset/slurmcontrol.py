"""Slurm-side effects of the NodeSet controller: drain, undrain, the identity comment.

Drain and undrain follow the one rule both halves share (`slinky.slurm.drain`: decided on the
live node, our reason prefix `slurm-operator: `, an admin's drain kept); here a node whose
comment names a pod of another NodeSet is never written at all.
"""

from __future__ import annotations

import logging

from slinky.operator.clients import Connection
from slinky.operator.nodeset.builder import REASON_PREFIX
from slinky.operator.nodeset.view import belongs_to
from slinky.slurm import drain as shared
from slinky.slurm import errors
from slinky.slurm.models import Node

log = logging.getLogger(__name__)

REASON_SCALE_IN = f"{REASON_PREFIX}scale-in"
REASON_UPDATE = f"{REASON_PREFIX}rolling update"
REASON_POD_CORDON = f"{REASON_PREFIX}pod cordoned"
REASON_DELETED = f"{REASON_PREFIX}nodeset deleted"


def is_operator_reason(reason: str) -> bool:
    return reason.startswith(REASON_PREFIX)


async def drain(conn: Connection, name: str, reason: str, *, namespace: str) -> bool:
    """`slinky.slurm.drain.drain` for the node of pod `name`; a node claimed by another
    NodeSet's pod is never written. A failed live read is "not now" (the next pass asks
    again). True when a drain was requested now."""
    try:
        return await shared.drain(
            conn, name, reason, ours=lambda node: belongs_to(node, namespace, name)
        )
    except shared.CannotRead:
        return False


async def undrain(conn: Connection, name: str, *, namespace: str) -> bool:
    """Undo a drain the operator made (`slinky.slurm.drain.undrain`); never an admin's.
    True when an undrain was requested now."""
    try:
        return await shared.undrain(
            conn, name, prefix=REASON_PREFIX, ours=lambda node: belongs_to(node, namespace, name)
        )
    except shared.CannotRead:
        return False


async def set_comment(conn: Connection, node: Node, comment: str) -> None:
    if node.comment == comment:
        return
    try:
        await conn.client.update_node(node.name, comment=comment)
    except errors.SlurmNotFound:
        return
