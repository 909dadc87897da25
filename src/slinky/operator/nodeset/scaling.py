"""Which pods go first when a NodeSet shrinks (pure; tested by value).

Order, most disposable first: pods already condemned (so a scale-in never drains more
nodes than it removes), then not yet scheduled, not ready, Slurm node IDLE before busy, lower
`pod-deletion-cost`, earlier `pod-deadline`, cordoned, and finally the higher ordinal.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from slinky.operator.nodeset.builder import (
    ANNOTATION_CONDEMNED,
    ANNOTATION_CORDON,
    ANNOTATION_DEADLINE,
    ANNOTATION_DELETION_COST,
)
from slinky.slurm.models import Node

JSON = dict[str, Any]
FAR_FUTURE = dt.datetime.max.replace(tzinfo=dt.UTC)


def is_ready(pod: JSON) -> bool:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


def annotation(pod: JSON, key: str) -> str | None:
    value = (pod["metadata"].get("annotations") or {}).get(key)
    return str(value) if value is not None else None


def deletion_cost(pod: JSON) -> int:
    try:
        return int(annotation(pod, ANNOTATION_DELETION_COST) or 0)
    except ValueError:
        return 0


def deadline(pod: JSON) -> dt.datetime:
    raw = annotation(pod, ANNOTATION_DEADLINE)
    if not raw:
        return FAR_FUTURE
    try:
        parsed = dt.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return FAR_FUTURE
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class Candidate:
    pod: JSON
    ordinal: int
    node: Node | None

    def sort_key(self) -> tuple[Any, ...]:
        pod = self.pod
        scheduled = bool((pod.get("spec") or {}).get("nodeName"))
        busy = self.node is not None and self.node.state.is_busy
        cordoned = annotation(pod, ANNOTATION_CORDON) == "true"
        return (
            annotation(pod, ANNOTATION_CONDEMNED) is None,  # condemned first
            scheduled,
            is_ready(pod),
            busy,
            deletion_cost(pod),
            deadline(pod),
            not cordoned,
            -self.ordinal,
        )


def victims(candidates: list[Candidate], count: int) -> list[Candidate]:
    """The `count` pods to remove, most disposable first."""
    if count <= 0:
        return []
    return sorted(candidates, key=Candidate.sort_key)[:count]


def slow_start_batches(total: int, initial: int = 1) -> list[int]:
    """Batch sizes 1, 2, 4, ... summing to `total` (client-go's slowStartBatch)."""
    out = []
    size = initial
    left = total
    while left > 0:
        n = min(size, left)
        out.append(n)
        left -= n
        size *= 2
    return out
