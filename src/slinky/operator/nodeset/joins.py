"""When a registered Slurm node may join its NodeSet's partition (`partition.Partitions`).

slurmctld saves a dynamic node's registration only with the next node save something else
asks for: the registration RPC asks for none (Slurm 26.05; the RPCs that do include node
create, update and delete, and job allocation and completion). A partition saved naming a
node the saved node state lacks makes the next start fatal ("Invalid node names in
partition"). Soak seed 17: a rolled pod's new node was written into its partition 20 ms
before the operator wrote the node's comment, and for 5.6 s the files on disk were ones
slurmctld could not start from.

So a node joins only `STATE_SAVE_S` after it was first seen carrying its pod's identity
comment: the operator's write of that comment (`mirror`) is a node update, which asks for a
node save, and slurmctld's state thread writes within SAVE_MAX_WAIT (5 s) of that. A node
already in the partition (our last write, or Slurm's listing) when this process first sees
it stays; one seen without the comment is a new registration (its earlier record was
deleted: the partition's mention of it is the old record's), and waits like any other.
Nothing is admitted from an unknown view: `Partitions.release` writes nothing before the
first partition list after a restart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Set

from slinky.operator.nodeset.builder import STATE_SAVE_S

UNCLAIMED = math.inf  # seen without our comment: its wait starts when the comment comes


class Joins:
    """By NodeSet UID, for each candidate node: when it was first seen with our comment
    (monotonic), or UNCLAIMED."""

    def __init__(self) -> None:
        self._since: dict[str, dict[str, float]] = {}

    def admit(
        self, uid: str, candidates: Mapping[str, bool], inside: Set[str], now: float
    ) -> tuple[list[str], float | None]:
        """The candidates (node name -> whether its comment names its pod) that may be in
        the partition now, sorted, and the seconds until the next one may join (None: none
        waits). `inside`: what the partition names (our last write and Slurm's listing)."""
        book = self._since.setdefault(uid, {})
        joined: list[str] = []
        waits: list[float] = []
        for name, claimed in candidates.items():
            since = book.get(name)
            if not claimed:
                book[name] = UNCLAIMED
            elif since is None and name in inside:
                book[name] = now - STATE_SAVE_S  # saved already: the partition names it
                joined.append(name)
            else:
                if since is None or since == UNCLAIMED:
                    since = book[name] = now
                left = since + STATE_SAVE_S - now
                if left <= 0:
                    joined.append(name)
                else:
                    waits.append(left)
        for name in set(book) - set(candidates):
            del book[name]
        return sorted(joined), (min(waits) if waits else None)

    def forget(self, uid: str) -> None:
        self._since.pop(uid, None)
