"""Which managed nodes a pod may not land on, in terms Slurm understands: `excluded_nodes`.

Slurm chooses the node, so the pod's Kubernetes constraints are handed to it before
submission: its `nodeSelector`, its required node affinity, and its tolerations against the
nodes' taints (other than the bridge's own managed-node taint, which every bridge pod
tolerates). The answer is always a list of nodes to *avoid*, never an exhaustive list of
nodes to use (upstream's `required_nodes` turned a vanished node into NODE_FAIL for every
bridge job after a slurmctld restart). A Slurm node of the partition that no Kubernetes node
stands for is avoided too: a pod could not be bound there.

Pure functions: nodes and the pod in, names out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from slinky.bridge.labels import MANAGED_NODE_TAINT
from slinky.types import JSON

HARD_EFFECTS = ("NoSchedule", "NoExecute")


# ---------------------------------------------------------------- node selection


def _labels(node: JSON) -> dict[str, str]:
    return dict((node.get("metadata") or {}).get("labels") or {})


def _requirement(req: JSON, values_of: dict[str, str]) -> bool:
    """One NodeSelectorRequirement against a node's labels (or fields)."""
    key, op = req.get("key"), req.get("operator")
    values = [str(v) for v in req.get("values") or []]
    present = key in values_of
    value = values_of.get(str(key))
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, bound = int(str(value)), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def _term(term: JSON, node: JSON) -> bool:
    """A NodeSelectorTerm: every expression and field holds (an empty term matches nothing)."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    labels = _labels(node)
    node_fields = {"metadata.name": str((node.get("metadata") or {}).get("name"))}
    return all(_requirement(r, labels) for r in exprs) and all(
        _requirement(r, node_fields) for r in fields
    )


def selects(pod: JSON, node: JSON) -> bool:
    """nodeSelector and required node affinity both allow the node."""
    spec = pod.get("spec") or {}
    labels = _labels(node)
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    ) or None
    if required is None:
        return True
    return any(_term(t, node) for t in required.get("nodeSelectorTerms") or [])


def _tolerated(taint: JSON, tolerations: list[JSON]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists":
            if not t.get("key") or t.get("key") == taint.get("key"):
                return True
        elif t.get("key") == taint.get("key") and (t.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def untolerated(pod: JSON, node: JSON, *, scheduler_name: str) -> list[str]:
    """The node's hard taints the pod does not tolerate (the bridge's own taint aside)."""
    tolerations = (pod.get("spec") or {}).get("tolerations") or []
    out = []
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") not in HARD_EFFECTS:
            continue
        if taint.get("key") == MANAGED_NODE_TAINT and taint.get("value") == scheduler_name:
            continue
        if not _tolerated(taint, tolerations):
            out.append(f"{taint.get('key')}={taint.get('value') or ''}:{taint.get('effect')}")
    return out


# ---------------------------------------------------------------- the decision


@dataclass
class Placement:
    """Where the pod may go among the partition's Slurm nodes."""

    allowed: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    why: Counter[str] = field(default_factory=Counter)  # reason -> how many nodes

    @property
    def impossible(self) -> bool:
        """Nodes exist but none may take the pod."""
        return bool(self.excluded) and not self.allowed

    def explain(self) -> str:
        parts = [f"{n} {reason}" for reason, n in sorted(self.why.items())]
        return (
            f"0/{len(self.excluded)} managed nodes are available: " + ", ".join(parts)
            if parts
            else "no managed node"
        )


def placement(
    pod: JSON, slurm_nodes: list[str], kube_node_of: dict[str, JSON], *, scheduler_name: str
) -> Placement:
    """Split the partition's Slurm nodes into allowed and excluded for this pod.
    `kube_node_of`: Slurm node name -> the Kubernetes Node standing for it."""
    out = Placement()
    for name in sorted(slurm_nodes):
        node = kube_node_of.get(name)
        if node is None:
            reason = "have no Kubernetes node"
        elif not selects(pod, node):
            reason = "didn't match the pod's node selector/affinity"
        elif untolerated(pod, node, scheduler_name=scheduler_name):
            taint = untolerated(pod, node, scheduler_name=scheduler_name)[0]
            reason = f"had untolerated taint {{{taint}}}"
        else:
            out.allowed.append(name)
            continue
        out.excluded.append(name)
        out.why[reason] += 1
    return out


# ---------------------------------------------------------------- size


def too_large(desc: JSON, nodes: list[tuple[str, int, int]]) -> str | None:
    """Why no node of `nodes` (Slurm name, CPUs, memory MiB; 0 = not known) could ever
    hold the one-node job `desc` however empty it is, with the numbers; None when one
    could, or when nothing is known of the nodes (Slurm decides)."""
    known = [n for n in nodes if n[1] > 0]
    if not known:
        return None
    want_cpus = int(desc.get("cpus_per_task") or 1) * int(desc.get("tasks") or 1)
    want_mem = int((desc.get("memory_per_node") or {}).get("number") or 0)
    for _name, ncpus, mem in known:
        if ncpus >= want_cpus and (mem == 0 or mem >= want_mem):
            return None
    name, ncpus, mem = max(known, key=lambda n: (n[1], n[2]))
    return (
        f"the pod needs {want_cpus} CPUs and {want_mem} MiB on one node; the largest of the "
        f"{len(known)} managed nodes it may use, {name}, has {ncpus} CPUs and {mem} MiB: "
        "no node can ever run it (lower the pod's requests or add a larger node)"
    )
