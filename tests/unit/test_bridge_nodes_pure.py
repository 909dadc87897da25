"""Pure rules of the bridge's node controller: Slurm names, registrations, the taint; and the
Kubernetes quantity and label-selector helpers they rely on."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from slinky.bridge.config import NodeTaint
from slinky.bridge.labels import EXTERNAL_NODE, EXTERNAL_NODE_PARTITIONS, SLURM_NODENAME
from slinky.bridge.nodes import controller, registration, slurmcontrol, taints
from slinky.bridge.nodes.registration import RegistrationProblem
from slinky.kube import nodehealth
from slinky.kube.nodehealth import NodeHealth
from slinky.kube.quantity import parse_quantity
from slinky.kube.selectors import SelectorError, parse_label_selector
from slinky.slurm.models import Node, NodeState

JSON = dict[str, Any]


def knode(
    name: str = "n1",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    cpu: str = "8",
    memory: str = "16Gi",
    ip: str | None = "10.0.0.5",
    taints_: list[JSON] | None = None,
) -> JSON:
    addresses = [{"type": "Hostname", "address": name}]
    if ip:
        addresses.append({"type": "InternalIP", "address": ip})
    return {
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "spec": {"taints": taints_} if taints_ is not None else {},
        "status": {"allocatable": {"cpu": cpu, "memory": memory}, "addresses": addresses},
    }


def snode(name: str = "n1", **kw: Any) -> Node:
    defaults: dict[str, Any] = {"state": NodeState.parse(["IDLE"]), "cpus": 8, "real_memory": 16384}
    return Node(name=name, **{**defaults, **kw})


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", Decimal(8)),
        ("7500m", Decimal("7.5")),
        ("0.5", Decimal("0.5")),
        ("16Gi", Decimal(16 * 2**30)),
        ("1000Mi", Decimal(1000 * 2**20)),
        ("2G", Decimal(2 * 10**9)),
        ("1e3", Decimal(1000)),
        ("123456Ki", Decimal(123456 * 1024)),
    ],
)
def test_quantities(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "8 cores", "1Qi", "--1"])
def test_bad_quantities(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def test_selector_matching() -> None:
    sel = parse_label_selector(
        {
            "matchLabels": {"a": "1"},
            "matchExpressions": [
                {"key": "b", "operator": "In", "values": ["x", "y"]},
                {"key": "c", "operator": "DoesNotExist"},
                {"key": "d", "operator": "NotIn", "values": ["no"]},
            ],
        }
    )
    assert sel.matches({"a": "1", "b": "x"})
    assert not sel.matches({"a": "1", "b": "z"})
    assert not sel.matches({"a": "1", "b": "x", "c": ""})
    assert not sel.matches({"a": "1", "b": "x", "d": "no"})
    assert parse_label_selector({}).matches({"anything": "goes"})
    with pytest.raises(SelectorError, match=r"matchExpressions\[0\].values"):
        parse_label_selector({"matchExpressions": [{"key": "a", "operator": "In"}]})


def test_slurm_name_is_the_label_else_the_node_name() -> None:
    assert registration.slurm_name(knode("k1")) == "k1"
    assert registration.slurm_name(knode("k1", labels={SLURM_NODENAME: "s1"})) == "s1"


def test_registration_of_a_labelled_node() -> None:
    node = knode(
        labels={EXTERNAL_NODE: "true"},
        annotations={EXTERNAL_NODE_PARTITIONS: "slurm-bridge, gpu,slurm-bridge"},
        cpu="7500m",
        memory="16000Mi",
    )
    assert registration.wants_external(node)
    reg = registration.desired(node, "default-part")
    assert reg.node_conf() == (
        "NodeName=n1 NodeAddr=10.0.0.5 CPUs=7 RealMemory=16000 "
        "Features=slurm-bridge,gpu State=EXTERNAL"
    )
    assert registration.registered_for(snode(comment=reg.comment())) == "n1"
    assert registration.registered_for(snode(comment='{"namespace":"x"}')) is None
    assert registration.registered_for(snode(comment="free text")) is None


def test_without_the_annotation_the_bridges_partition_is_used() -> None:
    reg = registration.desired(knode(labels={EXTERNAL_NODE: ""}), "slurm-bridge")
    assert reg.features == ("slurm-bridge",)


def test_label_false_means_not_external() -> None:
    assert not registration.wants_external(knode(labels={EXTERNAL_NODE: "false"}))
    assert not registration.wants_external(knode())


@pytest.mark.parametrize(
    ("node", "reason"),
    [
        (knode(ip=None), "NoInternalIP"),
        (knode(cpu="500m"), "NoAllocatable"),
        (knode(memory="lots"), "NoAllocatable"),
        (knode(annotations={EXTERNAL_NODE_PARTITIONS: "a b"}), "InvalidPartitions"),
    ],
)
def test_nodes_that_cannot_be_registered_say_why(node: JSON, reason: str) -> None:
    with pytest.raises(RegistrationProblem) as err:
        registration.desired(node, "p")
    assert err.value.reason == reason


def test_any_change_means_a_new_slurm_node() -> None:
    reg = registration.desired(knode(), "p")
    same = snode(features=["p"], address="10.0.0.5")
    assert not reg.needs_new_node(same)
    assert reg.needs_new_node(snode(features=["q"], address="10.0.0.5"))
    assert reg.needs_new_node(snode(cpus=4, features=["p"]))
    assert reg.needs_new_node(snode(real_memory=1, features=["p"]))
    assert reg.needs_new_node(snode(address="10.0.0.6", features=["p"]))


def test_an_interrupted_registration_is_adopted_only_when_it_matches() -> None:
    reg = registration.desired(knode(), "p")
    external = NodeState.parse(["IDLE", "EXTERNAL"])
    assert reg.adoptable(snode(state=external, features=["p"], address="10.0.0.5"))
    assert not reg.adoptable(snode(features=["p"], address="10.0.0.5"))  # a real slurmd
    assert not reg.adoptable(
        snode(state=external, features=["p"], address="10.0.0.5", comment="admin's")
    )
    assert not reg.adoptable(snode(state=external, features=["p"], cpus=2))


TAINT = {"key": "slinky.slurm.net/managed-node", "value": "sched", "effect": "NoExecute"}
ON = NodeTaint()


def test_a_managed_node_gets_the_taint_and_keeps_others() -> None:
    other = {"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}
    got = taints.wanted_taints(
        knode(taints_=[other]), managed=True, scheduler_name="sched", policy=ON
    )
    assert got == [other, TAINT]
    assert (
        taints.wanted_taints(
            knode(taints_=[TAINT]), managed=True, scheduler_name="sched", policy=ON
        )
        is None
    )


def test_an_unmanaged_node_loses_only_our_taint() -> None:
    theirs = {**TAINT, "value": "other-bridge"}
    got = taints.wanted_taints(
        knode(taints_=[TAINT, theirs]), managed=False, scheduler_name="sched", policy=ON
    )
    assert got == [theirs]
    assert taints.wanted_taints(knode(), managed=False, scheduler_name="sched", policy=ON) is None


def test_tainting_off_removes_the_taint_and_a_new_effect_replaces_it() -> None:
    off = NodeTaint(enabled=False)
    assert (
        taints.wanted_taints(
            knode(taints_=[TAINT]), managed=True, scheduler_name="sched", policy=off
        )
        == []
    )
    soft = NodeTaint(effect="NoSchedule")
    assert taints.wanted_taints(
        knode(taints_=[TAINT]), managed=True, scheduler_name="sched", policy=soft
    ) == [{**TAINT, "effect": "NoSchedule"}]


def test_a_node_registered_by_another_bridge_is_not_ours() -> None:
    """Two bridges on one Slurm cluster: each drains and deletes only what it marked."""
    reg = registration.desired(knode(), "p", cluster="east")
    mine = snode(comment=reg.comment())
    assert registration.registered_for(mine, "east") == "n1"
    assert registration.registered_for(mine, "west") is None
    assert registration.registered_for(mine) == "n1"  # whoever made it
    legacy = snode(comment=registration.owner_comment("n1"))  # before clusterId existed
    assert registration.registered_for(legacy, "west") == "n1"


@pytest.mark.parametrize(
    ("states", "stuck"),
    [
        (["IDLE", "EXTERNAL", "NOT_RESPONDING"], True),  # a suspend's RPC went unanswered
        (["IDLE", "EXTERNAL"], False),
        (["MIXED", "EXTERNAL", "NOT_RESPONDING"], False),  # a job holds it: wait
        (["IDLE", "EXTERNAL", "NOT_RESPONDING", "COMPLETING"], False),
        (["IDLE", "EXTERNAL", "NOT_RESPONDING", "DRAIN"], False),  # keep whoever's drain
    ],
)
def test_only_an_idle_undrained_unresponsive_node_is_made_anew(
    states: list[str], stuck: bool
) -> None:
    node = Node.parse({"name": "n1", "state": states})
    assert slurmcontrol.stuck_unresponsive(node) is stuck


def _with_conditions(node: JSON, *conds: tuple[str, str, str, str]) -> JSON:
    node["status"]["conditions"] = [
        {"type": t, "status": s, "reason": r, "lastHeartbeatTime": hb} for t, s, r, hb in conds
    ]
    return node


def test_a_condition_change_wakes_the_node_controller_and_a_heartbeat_does_not() -> None:
    before = _with_conditions(knode(), ("Ready", "True", "KubeletReady", "t1"))
    heartbeat = _with_conditions(knode(), ("Ready", "True", "KubeletReady", "t2"))
    not_ready = _with_conditions(knode(), ("Ready", "Unknown", "NodeStatusUnknown", "t2"))
    assert controller.relevant(before) == controller.relevant(heartbeat)
    assert controller.relevant(before) != controller.relevant(not_ready)


def test_the_bridge_drains_by_the_shared_node_health_rule() -> None:
    health = NodeHealth(conditions=frozenset({"KernelDeadlock"}))
    cordon = "Kubernetes node n1 is unschedulable (cordoned)"
    sick = _with_conditions(knode(), ("KernelDeadlock", "True", "DockerHung", "t"))
    assert nodehealth.problem(sick, health) == "Kubernetes node n1 KernelDeadlock (DockerHung)"
    lost = _with_conditions(knode(), ("Ready", "Unknown", "", "t"))
    assert nodehealth.problem(lost, health) == "Kubernetes node n1 NotReady (Unknown)"
    assert nodehealth.problem(lost, NodeHealth(not_ready=False)) is None
    cordoned = {**knode(), "spec": {"unschedulable": True}}
    assert nodehealth.problem(cordoned, health, cordon_reason=cordon) == cordon
    assert nodehealth.problem(knode(), health) is None
