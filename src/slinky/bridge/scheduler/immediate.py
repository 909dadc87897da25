"""Allocating a placeholder job inside the request, when a node looks free.

A submitted job (`POST job/submit`) is allocated at slurmctld's next scheduling pass, which
the controller starts about once a second: a pod waited 0.2-0.9 s for a node that was free
all along. `POST job/allocate` with `immediate` asks slurmctld to allocate the job inside
the request instead (a few ms); when it cannot start at once (nodes busy, a job of higher
priority waits, a limit) Slurm refuses it, keeps no pending job, and the scheduler submits
the job as usual. Slurm decides in both cases; this module only decides when asking is
worth a request:

- the pod was never refused by Slurm (a refusal is explained by `submit`, not twice);
- no placeholder job of ours waits in the partition (Slurm refuses a job that would start
  ahead of a pending one of higher priority: "insufficient priority"; pods go in order);
- enough of the nodes the pod may use look free in the Slurm informer's cache: the CPUs and
  memory the job asks for unallocated, on an IDLE node with nothing allocated for an
  exclusive job, else on an IDLE or MIXED one; never a node that is draining, down,
  reserved, powering, rebooting or not responding.

The cache can be a poll behind, so "looks free" is a hint: a job refused because the node
was taken meanwhile costs one request, and Slurm keeps a FAILED record of the attempt
(reason BadConstraints, MinJobAge long) next to the job that is then submitted. So that a
burst of pods does not make one such attempt per pod, the scheduler decides for one pod at
a time (no await between the check and the claim) and lays what its own allocations took
over the cache (`Claims`) until a poll shows it; requests in flight (asked, or answered but
not read back yet) count as taking their share of the free nodes, so many can be in flight
together. A pod decides only after the pods of higher priority in flight did (`turn`).
Never `job/allocate` without `immediate`: slurmrestd would then wait inside the request for
a pending job's allocation (and time out, error 5004).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable, Mapping

from slinky.slurm.models import Node, NodeState
from slinky.types import JSON

# Node state flags under which Slurm does not start a new job on the node (or soon stops
# being able to): a node with any of them is never counted as free.
UNAVAILABLE_FLAGS = frozenset(
    {
        "DRAIN",
        "FAIL",
        "MAINTENANCE",
        "RESERVED",
        "PLANNED",
        "COMPLETING",
        "NOT_RESPONDING",
        "POWER_DOWN",
        "POWERED_DOWN",
        "POWERING_DOWN",
        "POWERING_UP",
        "REBOOT_REQUESTED",
        "REBOOT_ISSUED",
        "INVALID_REG",
        "BLOCKED",
    }
)


Want = tuple[int, int, bool, int]  # CPUs and MiB per node, exclusive, node count


def _wants(desc: JSON) -> Want:
    """CPUs and MiB per node, exclusive, and node count of a `job_desc_msg` of ours."""
    cpus = int(desc.get("cpus_per_task") or 1) * int(desc.get("tasks_per_node") or 1)
    memory = int((desc.get("memory_per_node") or {}).get("number") or 0)
    exclusive = "none" in (desc.get("shared") or [])
    return cpus, memory, exclusive, int(desc.get("minimum_nodes") or 1)


def looks_free(node: Node, *, cpus: int, memory: int, exclusive: bool) -> bool:
    """Whether Slurm would likely start a job asking for this on `node` now."""
    state = node.state
    if state.base not in ("IDLE", "MIXED") or state.flags & UNAVAILABLE_FLAGS:
        return False
    if exclusive and (state.base != "IDLE" or node.alloc_cpus):
        return False
    return node.cpus - node.alloc_cpus >= cpus and node.real_memory - node.alloc_memory >= memory


def worth_allocating(
    desc: JSON,
    allowed: Iterable[str],
    nodes: Mapping[str, Node],
    overlay: Mapping[str, Node] | None = None,
    in_flight: Iterable[Want] = (),
) -> bool:
    """Whether to ask Slurm to allocate `desc` now: enough of the `allowed` Slurm nodes look
    free in `nodes` (the Slurm informer's cache, with `overlay` laid over it) for the job's
    node count, after the allocations `in_flight` (answered, their nodes not read yet) took
    their share of them: a node each for an exclusive one, their CPUs for a shared one."""
    cpus, memory, exclusive, count = _wants(desc)
    free: list[Node] = []
    for name in allowed:
        node = overlay.get(name) if overlay and name in overlay else nodes.get(name)
        if node is not None and looks_free(node, cpus=cpus, memory=memory, exclusive=exclusive):
            free.append(node)
    flying = list(in_flight)
    if exclusive:
        return len(free) - sum(w[3] for w in flying) >= count
    whole = sum(w[3] for w in flying if w[2])
    spare = sum(n.cpus - n.alloc_cpus for n in free) - sum(w[0] * w[3] for w in flying if not w[2])
    return len(free) - whole >= count and spare >= cpus * count


# A claim is kept at least this long: slurmctld answers a node poll by `update_time`, in
# whole seconds, so a poll made in the same second as an allocation, but after the poll
# before it, can answer "no change" and the cache miss it until the next change.
CLAIM_MIN_S = 1.5


@dataclasses.dataclass(frozen=True)
class Claim:
    """What one allocation of ours took on `node`, as of the informer mark `mark` (and the
    monotonic time `at`)."""

    node: str
    cpus: int
    memory: int
    exclusive: bool
    mark: int
    at: float = 0.0


class Claims:
    """The nodes our own allocations took that the Slurm informer's cache may not show yet;
    a claim is dropped once a poll that started after it succeeded and `min_age` passed."""

    def __init__(self, min_age: float = CLAIM_MIN_S) -> None:
        self.min_age = min_age
        self.claims: list[Claim] = []
        self.in_flight: dict[int, Want] = {}  # allocations whose nodes are not known yet
        self._tokens = 0

    def start(self, desc: JSON) -> int:
        """An allocation of `desc` is asked for; `finish` with the token once its nodes are
        known (or it was refused)."""
        self._tokens += 1
        self.in_flight[self._tokens] = _wants(desc)
        return self._tokens

    def finish(self, token: int, desc: JSON, nodes: Iterable[str], mark: int) -> None:
        """The allocation `token` got `nodes` (none: refused, or not read)."""
        self.in_flight.pop(token, None)
        self.add(desc, nodes, mark)

    def add(self, desc: JSON, nodes: Iterable[str], mark: int) -> None:
        cpus, memory, exclusive, _ = _wants(desc)
        now = time.monotonic()
        self.claims.extend(Claim(n, cpus, memory, exclusive, mark, now) for n in nodes)

    def overlay(
        self, nodes: Mapping[str, Node], shows_since: Callable[[int], bool]
    ) -> dict[str, Node]:
        """The nodes of `nodes` that claims the cache does not show yet took, as taken."""
        now = time.monotonic()
        self.claims = [
            c for c in self.claims if not (shows_since(c.mark) and now - c.at >= self.min_age)
        ]
        # Summed by node first: one copy of each node taken, however many claims a burst
        # left on it (it was a copy per claim, for every allocation asked).
        per_node: dict[str, tuple[int, int, bool]] = {}
        for c in self.claims:
            cpus, memory, exclusive = per_node.get(c.node, (0, 0, False))
            per_node[c.node] = (cpus + c.cpus, memory + c.memory, exclusive or c.exclusive)
        taken: dict[str, Node] = {}
        for name, (cpus, memory, exclusive) in per_node.items():
            node = nodes.get(name)
            if node is not None:
                taken[name] = _take(node, cpus, memory, exclusive)
        return taken


def _take(node: Node, cpus: int, memory: int, exclusive: bool) -> Node:
    """`node` once claims of `cpus` and `memory` in all (one of them `exclusive`) took it."""
    alloc = node.cpus if exclusive else min(node.cpus, node.alloc_cpus + cpus)
    base = "ALLOCATED" if alloc >= node.cpus else "MIXED"
    return dataclasses.replace(
        node,
        state=NodeState(base, node.state.flags),
        alloc_cpus=alloc,
        alloc_memory=node.alloc_memory + memory,
    )
