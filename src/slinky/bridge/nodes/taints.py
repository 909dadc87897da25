"""The managed-node taint: `slinky.slurm.net/managed-node=<schedulerName>:<effect>` on every
Kubernetes node Slurm knows, so that only pods the bridge scheduled (which tolerate it) run
there. The value names the scheduler, so two bridges on one cluster keep to their own taint.
"""

from __future__ import annotations

from slinky.bridge.config import NodeTaint
from slinky.bridge.labels import MANAGED_NODE_TAINT
from slinky.types import JSON


def ours(taint: JSON, scheduler_name: str) -> bool:
    """The managed-node taint of this bridge (the value is its scheduler name)."""
    return bool(taint.get("key") == MANAGED_NODE_TAINT and taint.get("value") == scheduler_name)


def wanted_taints(
    node: JSON, *, managed: bool, scheduler_name: str, policy: NodeTaint
) -> list[JSON] | None:
    """The node's taint list as it should be, or None when it already is.

    Other taints (the kubelet's, an admin's, another bridge's) are kept as they are; ours is
    added when the node is managed and tainting is on, and removed otherwise (also when only
    its effect changed in the config).
    """
    taints: list[JSON] = list((node.get("spec") or {}).get("taints") or [])
    mine = [t for t in taints if ours(t, scheduler_name)]
    others = [t for t in taints if not ours(t, scheduler_name)]
    if managed and policy.enabled:
        want = {"key": MANAGED_NODE_TAINT, "value": scheduler_name, "effect": policy.effect}
        if len(mine) == 1 and {k: mine[0].get(k) for k in want} == want:
            return None
        return [*others, want]
    if not mine:
        return None
    return others
