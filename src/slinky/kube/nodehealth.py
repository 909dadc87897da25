"""When a Kubernetes node should run no new Slurm job: the one rule the operator (for the
Slurm nodes of the NodeSet pods on it) and the bridge (for the EXTERNAL Slurm node it
registered for it) both drain by, with the reason they give Slurm.

- cordoned (`spec.unschedulable`), always;
- NotReady: its Ready condition False or Unknown, unless `not_ready` is off;
- a condition named in `conditions` is True (the convention of Node Problem Detector's
  conditions, e.g. KernelDeadlock).

Lifting it undrains, but only drains the caller made (its reason prefix): see
`slinky.slurm.drain`.
"""

from __future__ import annotations

from dataclasses import dataclass

from slinky.types import JSON


@dataclass(frozen=True)
class NodeHealth:
    """Which states of a Kubernetes Node drain Slurm nodes on it (see the module)."""

    conditions: frozenset[str] = frozenset()
    not_ready: bool = True


def problem(node: JSON, health: NodeHealth, *, cordon_reason: str | None = None) -> str | None:
    """Why the node should run no new Slurm job, or None. `cordon_reason` replaces the
    cordon's own wording when given (the operator's `node-cordon-reason` annotation)."""
    name = node["metadata"]["name"]
    if (node.get("spec") or {}).get("unschedulable"):
        return cordon_reason or f"Kubernetes node {name} cordoned"
    for cond in (node.get("status") or {}).get("conditions") or []:
        kind, status, reason = cond.get("type"), cond.get("status"), cond.get("reason")
        if kind == "Ready" and health.not_ready and status != "True":
            return f"Kubernetes node {name} NotReady ({reason or status})"
        if kind in health.conditions and status == "True":
            return f"Kubernetes node {name} {kind}" + (f" ({reason})" if reason else "")
    return None


def conditions_of(node: JSON) -> tuple[tuple[str, str, str], ...]:
    """The Node's conditions as the rule reads them (type, status, reason): what a watch
    compares, so that heartbeats (which change only the times) wake nobody."""
    return tuple(
        (str(c.get("type")), str(c.get("status")), str(c.get("reason") or ""))
        for c in (node.get("status") or {}).get("conditions") or []
    )
