"""The scheduler's work queue hands out pods in priority order (`spec.priority`, highest
first, then the oldest), not in the order their events arrived, so a burst of low-priority
pods never delays a high-priority one. It keeps every guarantee of the controllers' work
queue (one worker per key, no lost adds, delays, rate limits): only the ready line changes.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from slinky.kube.queue import WorkQueue
from slinky.types import JSON

Rank = tuple[int, str]


def pod_rank(pod: JSON | None) -> Rank:
    """Sort key of a pod: higher spec.priority first, then older (RFC 3339 sorts as text)."""
    if pod is None:
        return (0, "")
    priority = int((pod.get("spec") or {}).get("priority") or 0)
    return (-priority, str((pod.get("metadata") or {}).get("creationTimestamp") or ""))


class RankedKeys:
    """The part of a deque the work queue uses (append, popleft, len, clear), in rank order;
    equal ranks keep their arrival order."""

    def __init__(self, rank: Callable[[str], Rank]) -> None:
        self.rank = rank
        self._heap: list[tuple[Rank, int, str]] = []
        self._seq = itertools.count()

    def append(self, key: str) -> None:
        heapq.heappush(self._heap, (self.rank(key), next(self._seq), key))

    def popleft(self) -> str:
        return heapq.heappop(self._heap)[2]

    def clear(self) -> None:
        self._heap.clear()

    def __len__(self) -> int:
        return len(self._heap)


class PriorityWorkQueue(WorkQueue):
    def __init__(self, name: str, *, rank: Callable[[str], Rank], controller: str = "") -> None:
        super().__init__(name, controller=controller)
        # Duck-typed: RankedKeys offers exactly the deque methods WorkQueue calls.
        self._queue = RankedKeys(rank)  # type: ignore[assignment]
