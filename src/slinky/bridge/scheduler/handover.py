"""The hand-over rule: when a pod may be bound to a node that a pod of ours is leaving.

The workload controller cancels a pod's Slurm job as soon as every container of the pod has
ended for good (`podcontrol.containers_ended`), about a second before the kubelet reports
the pod terminal: Slurm gives the node to the next job while the kubelet tears down the old
pod's sandbox. Until that pod is terminal the kubelet still counts its requests when it
admits a new pod, and refuses one that does not fit beside it (`OutOfcpu`: the new pod
would fail). So a pod Slurm allocated such a node is bound at once when it fits beside every
pod of ours there that is not terminal yet, and otherwise waits until the pods that ended
are terminal or gone (`SchedulerSync.released` brings it back).
"""

from __future__ import annotations

from decimal import Decimal

from slinky.bridge import placeholder, podcontrol
from slinky.kube.quantity import parse_quantity
from slinky.types import JSON

BY_NODE = "node-name"


def index_node(pod: JSON) -> list[str]:
    node = podcontrol.node_of(pod)
    return [node] if node else []


def requests(pod: JSON) -> dict[str, Decimal]:
    """What the pod asks of its node, counted generously: the requests of every container
    and init container summed, plus the pod's overhead. The kubelet counts the larger of
    the init containers' and the rest, never more than this."""
    spec = pod.get("spec") or {}
    total: dict[str, Decimal] = {}
    wanted = [
        (c.get("resources") or {}).get("requests") or {}
        for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    ]
    for asked in [*wanted, spec.get("overhead") or {}]:
        for name, amount in asked.items():
            try:
                total[name] = total.get(name, Decimal(0)) + parse_quantity(amount)
            except ValueError:
                continue  # the apiserver admitted it; not ours to judge
    return total


def leaving_blocks(pod: JSON, node: JSON, on_node: list[JSON]) -> str | None:
    """The key of a pod of ours on `node` whose containers ended but that the kubelet has
    not reported terminal yet, when `pod` does not fit beside the pods there that are not
    terminal (by the node's allocatable); None when `pod` may be bound now."""
    uid = placeholder.pod_uid(pod)
    others = [p for p in on_node if not podcontrol.is_terminal(p) and placeholder.pod_uid(p) != uid]
    leaving = [p for p in others if podcontrol.containers_ended(p)]
    if not leaving:
        return None
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    need = requests(pod)
    for p in others:
        for name, amount in requests(p).items():
            if name in need:
                need[name] += amount
    for name, amount in need.items():
        if amount <= 0:
            continue
        try:
            have = parse_quantity(allocatable[name]) if name in allocatable else Decimal(0)
        except ValueError:
            have = Decimal(0)
        if amount > have:
            return placeholder.pod_key(leaving[0])
    return None
