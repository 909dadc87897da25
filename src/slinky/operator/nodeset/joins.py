"""When a registered Slurm node may join its NodeSet's partition (`partition.Partitions`).

slurmctld saves a dynamic node's registration only with the next node save something else
asks for: the registration RPC asks for none (Slurm 26.05; the RPCs that do include node
create, update and delete, and job allocation and completion). A partition saved naming a
node the saved node state lacks makes the next start fatal ("Invalid node names in
partition"). Soak seed 17: a rolled pod's new node was written into its partition 20 ms
before the operator wrote the node's comment, and for 5.6 s the files on disk were ones
slurmctld could not start from.

So a node joins only `JOIN_AFTER_S` after it was first seen carrying its pod's identity
comment. The operator's write of that comment (`mirror`) is a node update, and slurmctld
asks for a node save after each one (`_slurm_rpc_update_node`, after its answer). Its state
thread saves, in one pass, jobs, then nodes, then partitions, each when asked for since
its last pass; the node record exists from the registration on, so any node save after the
comment write holds it. The first partition save after our partition write comes in a pass
whose node phase either follows the comment write's request (the node is saved first) or
precedes it; the latter needs the pass to go from its node phase to its partition phase
(microseconds of code between two file writes) across the whole `JOIN_AFTER_S` that
separates the two writes. Waiting for the node save itself (up to SAVE_MAX_WAIT, 5 s, and a
pass) would cost every scale-out that much more for no more safety.
A node already in the partition (our last write, or Slurm's listing) when this process
first sees it stays; one seen without the comment is a new registration (its earlier record
was deleted: the partition's mention of it is the old record's), and waits like any other.
Nothing is admitted from an unknown view: `Partitions.release` writes nothing before the
first partition list after a restart.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Set

JOIN_AFTER_S = 2.0
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
                book[name] = now - JOIN_AFTER_S  # saved already: the partition names it
                joined.append(name)
            else:
                if since is None or since == UNCLAIMED:
                    since = book[name] = now
                left = since + JOIN_AFTER_S - now
                if left <= 0:
                    joined.append(name)
                else:
                    waits.append(left)
        for name in set(book) - set(candidates):
            del book[name]
        return sorted(joined), (min(waits) if waits else None)

    def forget(self, uid: str) -> None:
        self._since.pop(uid, None)
