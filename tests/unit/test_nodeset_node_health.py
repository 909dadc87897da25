"""Node health from Kubernetes: which states of a Kubernetes Node drain the Slurm nodes of the
pods on it, with which reason, and what of the Node the operator keeps to know it."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from slinky.kube.nodehealth import NodeHealth
from slinky.operator.nodeset import mirror
from slinky.operator.nodeset.builder import ANNOTATION_CORDON, ANNOTATION_NODE_CORDON_REASON
from slinky.operator.nodeset.controller import slim_node

NPD = NodeHealth(conditions=frozenset({"KernelDeadlock"}))


def node(*conditions: tuple[str, str, str], cordoned: bool = False, **notes: str) -> Any:
    return {
        "metadata": {"name": "k1", "annotations": notes},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"conditions": [{"type": t, "status": s, "reason": r} for t, s, r in conditions]},
    }


READY = ("Ready", "True", "KubeletReady")
CALM = ("KernelDeadlock", "False", "KernelHasNoDeadlock")


def test_a_healthy_node_is_no_problem() -> None:
    assert mirror.node_problem(node(READY, CALM), NPD) is None
    assert mirror.node_problem(node(), NPD) is None


def test_not_ready_names_the_node_and_kubernetes_reason() -> None:
    lost = ("Ready", "Unknown", "NodeStatusUnknown")
    assert mirror.node_problem(node(lost), NPD) == "Kubernetes node k1 NotReady (NodeStatusUnknown)"
    assert mirror.node_problem(node(("Ready", "False", "")), NPD) == (
        "Kubernetes node k1 NotReady (False)"
    )
    assert mirror.node_problem(node(lost), NodeHealth(not_ready=False)) is None


def test_a_watched_condition_true_names_the_condition() -> None:
    deadlock = ("KernelDeadlock", "True", "DockerHung")
    assert mirror.node_problem(node(READY, deadlock), NPD) == (
        "Kubernetes node k1 KernelDeadlock (DockerHung)"
    )
    assert mirror.node_problem(node(READY, deadlock), NodeHealth()) is None  # not watched
    # Kubernetes' own pressure conditions are not watched unless named.
    pressure = ("MemoryPressure", "True", "KubeletHasInsufficientMemory")
    assert mirror.node_problem(node(READY, pressure), NPD) is None


def test_a_cordon_comes_first_with_its_reason() -> None:
    sick = node(("Ready", "False", "KubeletNotReady"), cordoned=True)
    assert mirror.node_problem(sick, NPD) == "Kubernetes node k1 cordoned"
    why = {ANNOTATION_NODE_CORDON_REASON: "disk swap"}
    assert mirror.node_problem(node(READY, cordoned=True, **why), NPD) == "disk swap"


def test_the_pods_drain_reason_carries_the_operators_prefix() -> None:
    nodes = {"k1": node(READY, ("KernelDeadlock", "True", "DockerHung"))}
    ctx: Any = SimpleNamespace(nodes=SimpleNamespace(store=nodes), node_health=NPD)
    pod = {"metadata": {"name": "cpu-0", "annotations": {}}, "spec": {"nodeName": "k1"}}
    assert mirror.cordon_reason(ctx, pod) == (
        "slurm-operator: Kubernetes node k1 KernelDeadlock (DockerHung)"
    )
    pod["metadata"]["annotations"][ANNOTATION_CORDON] = "true"
    assert mirror.cordon_reason(ctx, pod) == "slurm-operator: pod cordoned"
    nodes["k1"] = node(READY, CALM)
    del pod["metadata"]["annotations"][ANNOTATION_CORDON]
    assert mirror.cordon_reason(ctx, pod) is None


def test_the_kept_node_has_conditions_without_heartbeats() -> None:
    full = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "k1", "uid": "u", "resourceVersion": "7", "labels": {"a": "b"}},
        "spec": {"podCIDR": "10.0.0.0/24"},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": "2026-11-26T12:00:05Z",
                    "lastTransitionTime": "2026-11-26T11:00:00Z",
                }
            ],
            "images": [{"names": ["x"], "sizeBytes": 1}],
        },
    }
    slim = slim_node(full)
    assert slim["status"] == {
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]
    }
    assert "images" not in slim["status"] and slim["spec"] == {}
    later = dict(full["status"]["conditions"][0], lastHeartbeatTime="2026-11-26T12:00:10Z")
    beat = {**full, "status": {**full["status"], "conditions": [later]}}
    assert slim_node(beat) == slim, "a heartbeat is no change"


def test_a_node_record_restored_with_an_earlier_pods_address_is_stale() -> None:
    from slinky.slurm.models import Node

    ready = {
        "metadata": {"name": "cpu-0"},
        "status": {
            "podIP": "10.0.0.17",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }

    def node(address: str, started: int) -> Node:
        return Node.parse(
            {
                "name": "cpu-0",
                "address": address,
                "slurmd_start_time": {"set": True, "number": started},
            }
        )

    # Soak run 6: the predecessor's address, no slurmd started since the restore.
    assert mirror.stale_address(ready, node("10.0.0.16", 0)) == "10.0.0.17"
    assert mirror.stale_address(ready, node("10.0.0.17", 0)) is None  # the pod's own
    # A running slurmd registered this record: its address is right for slurmctld (NAT).
    assert mirror.stale_address(ready, node("192.168.1.4", 1795727000)) is None
    not_ready = {**ready, "status": {**ready["status"], "conditions": []}}
    assert mirror.stale_address(not_ready, node("10.0.0.16", 0)) is None
    no_ip = {**ready, "status": {"conditions": ready["status"]["conditions"]}}
    assert mirror.stale_address(no_ip, node("10.0.0.16", 0)) is None


async def test_a_stale_record_is_readdressed_once_slurm_confirms_it() -> None:
    """A live read before the write: passes made before the cache shows the new address
    write nothing more."""
    import json as jsonlib

    import httpx2

    from slinky.api.schema import parse
    from slinky.api.v1alpha1.nodeset import NodeSetSpec
    from slinky.operator.nodeset.view import View
    from tests.unit.test_nodeset_drained import connection

    record = {
        "name": "cpu-0",
        "address": "10.0.0.16",
        "slurmd_start_time": {"set": True, "number": 0},
    }
    posts: list[object] = []

    def handler(req: httpx2.Request) -> httpx2.Response:
        if req.method == "POST":
            posts.append(jsonlib.loads(req.content))
            record["address"] = "10.0.0.17"
            return httpx2.Response(200, json={})
        return httpx2.Response(200, json={"nodes": [record]})

    conn, _ = connection(handler)
    pod = {
        "metadata": {"name": "cpu-0", "namespace": "ns"},
        "status": {"podIP": "10.0.0.17", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    events: list[str] = []
    ctx: Any = SimpleNamespace(recorder=SimpleNamespace(event=lambda *a: events.append(a[2])))
    obj = {"metadata": {"name": "cpu", "namespace": "ns", "uid": "u"}, "spec": {}}
    spec = parse(NodeSetSpec, {"clusterName": "slurm", "selector": {}, "template": {}}, "spec")
    view = View(obj, spec, "ns/cpu", "ns/cpu/u", "r", None, conn, {"cpu-0": pod}, {})
    for _ in range(3):  # the cache still shows the old address
        await mirror.readdress(ctx, view, conn, pod)
    assert posts == [{"address": "10.0.0.17"}]
    assert events == ["SlurmNodeReaddressed"]
