"""What the admission webhook changes on a pod created in a managed namespace, as a JSON Patch:

- `schedulerName` becomes the bridge's when it is `default-scheduler` (or unset); a pod that
  names another scheduler is left alone;
- a pod the bridge schedules tolerates the managed-node taint, so it may run on the nodes
  Slurm allocates (the taint keeps every other pod off them).

A pod created with `spec.nodeName` already set bypasses every scheduler: it gets neither, so
the taint still keeps it off the nodes Slurm manages.
"""

from __future__ import annotations

from slinky.bridge.config import BridgeConfig
from slinky.types import JSON

DEFAULT_SCHEDULER = "default-scheduler"


def tolerates(tolerations: list[JSON], wanted: JSON) -> bool:
    """An existing toleration already covers the taint (same key; value and effect match
    or are wildcards)."""
    for t in tolerations:
        if t.get("key") != wanted["key"]:
            continue
        value_ok = t.get("operator") == "Exists" or t.get("value") == wanted["value"]
        effect_ok = not t.get("effect") or t.get("effect") == wanted["effect"]
        if value_ok and effect_ok:
            return True
    return False


def pod_patch(pod: JSON, config: BridgeConfig) -> list[JSON]:
    """JSON Patch operations for a pod being created in a managed namespace."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return []
    ops: list[JSON] = []
    scheduler = spec.get("schedulerName")
    if scheduler in (None, "", DEFAULT_SCHEDULER):
        op = "replace" if "schedulerName" in spec else "add"
        ops.append({"op": op, "path": "/spec/schedulerName", "value": config.scheduler_name})
        scheduler = config.scheduler_name
    if scheduler != config.scheduler_name or not config.managed_node_taint.enabled:
        return ops
    wanted = config.toleration()
    tolerations = spec.get("tolerations")
    if tolerations is None:
        ops.append({"op": "add", "path": "/spec/tolerations", "value": [wanted]})
    elif not tolerates(tolerations, wanted):
        ops.append({"op": "add", "path": "/spec/tolerations/-", "value": wanted})
    return ops
