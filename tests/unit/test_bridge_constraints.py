"""A pod's Kubernetes constraints as the Slurm nodes it must avoid (`excluded_nodes`)."""

from __future__ import annotations

from typing import Any

from slinky.bridge import constraints
from slinky.bridge.labels import MANAGED_NODE_TAINT

JSON = dict[str, Any]
SCHED = "slurm-bridge-scheduler"
OURS = {"key": MANAGED_NODE_TAINT, "value": SCHED, "effect": "NoExecute"}


def node(name: str, labels: dict[str, str] | None = None, taints: list[JSON] | None = None) -> JSON:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"taints": taints or [OURS]},
    }


def pod(**spec: Any) -> JSON:
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": spec}


def affinity(*terms: JSON) -> JSON:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}  # fmt: skip


def expr(key: str, op: str, *values: str) -> JSON:
    return {"key": key, "operator": op, "values": list(values)}


def test_no_constraints_exclude_nothing_and_the_bridge_taint_is_ignored() -> None:
    nodes = {"a": node("a"), "b": node("b")}
    where = constraints.placement(pod(), ["a", "b"], nodes, scheduler_name=SCHED)
    assert (where.allowed, where.excluded) == (["a", "b"], [])
    assert not where.impossible


def test_node_selector_excludes_the_nodes_without_the_label() -> None:
    nodes = {"a": node("a", {"gpu": "yes"}), "b": node("b", {"gpu": "no"}), "c": node("c")}
    where = constraints.placement(
        pod(nodeSelector={"gpu": "yes"}), ["a", "b", "c"], nodes, scheduler_name=SCHED
    )
    assert (where.allowed, where.excluded) == (["a"], ["b", "c"])


def test_required_affinity_terms_are_ored_and_expressions_anded() -> None:
    nodes = {
        "a": node("a", {"zone": "z1", "size": "8"}),
        "b": node("b", {"zone": "z2", "size": "4"}),
        "c": node("c", {"zone": "z3"}),
    }
    p = pod(
        affinity=affinity(
            {"matchExpressions": [expr("zone", "In", "z1", "z2"), expr("size", "Gt", "5")]},
            {"matchFields": [expr("metadata.name", "In", "c")]},
        )
    )
    where = constraints.placement(p, ["a", "b", "c"], nodes, scheduler_name=SCHED)
    assert (where.allowed, where.excluded) == (["a", "c"], ["b"])


def test_operators_notin_exists_doesnotexist_lt() -> None:
    n = node("a", {"k": "v", "n": "3"})
    assert constraints.selects(
        pod(affinity=affinity({"matchExpressions": [expr("k", "NotIn", "x")]})), n
    )
    assert constraints.selects(
        pod(affinity=affinity({"matchExpressions": [expr("k", "Exists")]})), n
    )
    assert not constraints.selects(
        pod(affinity=affinity({"matchExpressions": [expr("k", "DoesNotExist")]})), n
    )
    assert constraints.selects(
        pod(affinity=affinity({"matchExpressions": [expr("n", "Lt", "4")]})), n
    )
    assert not constraints.selects(pod(affinity=affinity({})), n)  # no terms: nothing matches


def test_untolerated_taints_exclude_and_tolerations_admit() -> None:
    gpu_taint = {"key": "gpu", "value": "true", "effect": "NoSchedule"}
    soft = {"key": "soft", "effect": "PreferNoSchedule"}
    nodes = {"a": node("a", taints=[OURS, gpu_taint]), "b": node("b", taints=[OURS, soft])}
    where = constraints.placement(pod(), ["a", "b"], nodes, scheduler_name=SCHED)
    assert (where.allowed, where.excluded) == (["b"], ["a"])
    assert "untolerated taint {gpu=true:NoSchedule}" in where.explain()
    for toleration in (
        {"key": "gpu", "operator": "Equal", "value": "true"},
        {"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"operator": "Exists"},
    ):
        where = constraints.placement(
            pod(tolerations=[toleration]), ["a", "b"], nodes, scheduler_name=SCHED
        )
        assert where.allowed == ["a", "b"], toleration


def test_another_bridges_taint_counts_as_a_taint() -> None:
    theirs = {"key": MANAGED_NODE_TAINT, "value": "other-bridge", "effect": "NoExecute"}
    where = constraints.placement(
        pod(), ["a"], {"a": node("a", taints=[theirs])}, scheduler_name=SCHED
    )
    assert where.impossible


def test_slurm_nodes_without_a_kubernetes_node_are_avoided() -> None:
    where = constraints.placement(
        pod(), ["a", "slurm-only"], {"a": node("a")}, scheduler_name=SCHED
    )
    assert (where.allowed, where.excluded) == (["a"], ["slurm-only"])


def test_a_pod_no_node_can_take_is_impossible_and_says_why() -> None:
    nodes = {"a": node("a"), "b": node("b")}
    where = constraints.placement(
        pod(nodeSelector={"x": "y"}), ["a", "b", "c"], nodes, scheduler_name=SCHED
    )
    assert where.impossible
    assert where.explain() == (
        "0/3 managed nodes are available: 2 didn't match the pod's node selector/affinity, "
        "1 have no Kubernetes node"
    )


def test_an_empty_partition_is_not_impossible_a_node_may_join() -> None:
    assert not constraints.placement(pod(), [], {}, scheduler_name=SCHED).impossible


def test_too_large_names_the_numbers_and_the_largest_node() -> None:
    desc = {"tasks": 1, "cpus_per_task": 64, "memory_per_node": {"set": True, "number": 100}}
    why = constraints.too_large(desc, [("a", 4, 8000), ("b", 8, 4000)])
    assert why is not None
    assert "needs 64 CPUs and 100 MiB" in why and "b, has 8 CPUs and 4000 MiB" in why
    assert constraints.too_large(desc, [("a", 4, 8000), ("c", 64, 0)]) is None  # c fits
    assert constraints.too_large(desc, [("a", 0, 0)]) is None  # nothing known: Slurm decides
    big_mem = {"cpus_per_task": 1, "memory_per_node": {"number": 9000}}
    assert constraints.too_large(big_mem, [("a", 4, 8000)]) is not None
    assert constraints.too_large(big_mem, [("a", 4, 9000)]) is None
