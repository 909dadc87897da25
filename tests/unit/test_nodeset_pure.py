"""The NodeSet's pure pieces: the pod builder and the scale-in order."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from slinky.api.schema import parse
from slinky.api.v1alpha1.nodeset import NodeSetSpec
from slinky.operator.nodeset import builder, pods, sync
from slinky.operator.nodeset import scalein as scaling
from slinky.operator.nodeset.mirror import REGISTRATION_WINDOW_S, slurm_conditions
from slinky.operator.nodeset.update import choose, max_unavailable, settling
from slinky.slurm.models import Node

JSON = dict[str, Any]


def nodeset(**spec: Any) -> tuple[JSON, NodeSetSpec]:
    raw = {
        "clusterName": "slurm",
        "selector": {"matchLabels": {"app": "cpu"}},
        "template": {
            "metadata": {"labels": {"app": "cpu"}},
            "spec": {
                "containers": [
                    {"name": "slurmd", "image": "slurmd"},
                    {"name": "sidecar", "image": "x"},
                ]
            },
        },
        **spec,
    }
    obj = {
        "apiVersion": "slinky.slurm.net/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": "cpu", "namespace": "hpc", "uid": "u-1"},
        "spec": raw,
    }
    return obj, parse(NodeSetSpec, raw, "spec")


def test_pod_is_named_by_ordinal_with_hostname_subdomain_and_owner() -> None:
    obj, spec = nodeset()
    pod = builder.build_pod(obj, spec, 3, revision="abc", conf_server="10.0.0.5:6817")
    assert pod["metadata"]["name"] == "cpu-3"
    assert pod["spec"]["hostname"] == "cpu-3" and pod["spec"]["subdomain"] == "cpu"
    ref = pod["metadata"]["ownerReferences"][0]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("NodeSet", "u-1", True)
    labels = pod["metadata"]["labels"]
    assert labels["app"] == "cpu" and labels[builder.LABEL_REVISION] == "abc"
    assert labels["app.kubernetes.io/managed-by"] == "slurm-operator"
    assert builder.ordinal_of("cpu", "cpu-3") == 3
    assert builder.ordinal_of("cpu", "cpu-03") is None
    assert builder.ordinal_of("cpu", "cpux-1") is None


def test_slurmd_gets_operator_flags_and_prestop_and_sidecars_are_untouched() -> None:
    obj, spec = nodeset()
    pod = builder.build_pod(obj, spec, 0, revision="r", conf_server="ctld:6817")
    slurmd, sidecar = pod["spec"]["containers"]
    assert slurmd["command"] == ["slurmd"]
    assert slurmd["args"] == ["-D", "-Z", "--conf-server", "ctld:6817", "--conf", "Features=cpu"]
    script = slurmd["lifecycle"]["preStop"]["exec"]["command"][-1]
    assert "state=DOWN" in script and "slurm-operator: pod terminating" in script
    assert "state=DRAIN" in script and "ALLOCATED" in script, "waits while jobs run"
    assert "scontrol delete" in script
    assert "args" not in sidecar and "lifecycle" not in sidecar


def test_flags_the_user_set_are_kept() -> None:
    args = builder.slurmd_args(
        ["-Z", "--conf-server=mine:1", "--conf", "CPUs=4 Features=gpu"],
        nodeset="cpu",
        conf_server="x:1",
    )
    assert args == ["-Z", "--conf-server=mine:1", "--conf", "CPUs=4 Features=gpu", "-D"]
    args = builder.slurmd_args(["--conf", "CPUs=4"], nodeset="cpu", conf_server=None)
    assert args == ["--conf", "Features=cpu CPUs=4", "-D", "-Z"]


def test_template_change_changes_revision_and_selector_string() -> None:
    _, a = nodeset()
    _, b = nodeset(
        template={
            "metadata": {"labels": {"app": "cpu"}, "annotations": {"v": "2"}},
            "spec": {"containers": []},
        }
    )
    assert builder.revision_hash(a.template, "c:1") != builder.revision_hash(b.template, "c:1")
    assert builder.revision_hash(a.template, "c:1") != builder.revision_hash(a.template, "d:1"), (
        "the controller address is part of the revision: changing it rolls the pods"
    )
    assert builder.selector_string(a.selector) == "app=cpu"


def test_slurm_comment_is_the_pod_identity() -> None:
    obj, spec = nodeset()
    pod = builder.build_pod(obj, spec, 1, revision="r", conf_server=None)
    pod["spec"]["nodeName"] = "worker-7"
    assert json.loads(builder.slurm_comment(pod)) == {
        "namespace": "hpc",
        "podName": "cpu-1",
        "nodeSet": "cpu",
        "node": "worker-7",
    }


def pod(name: str, *, scheduled: bool = True, ready: bool = True, **annotations: str) -> JSON:
    return {
        "metadata": {"name": name, "annotations": annotations},
        "spec": {"nodeName": "n1"} if scheduled else {},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def node(name: str, *states: str) -> Node:
    return Node.parse({"name": name, "state": list(states)})


def order(cands: list[scaling.Candidate]) -> list[str]:
    return [c.pod["metadata"]["name"] for c in scaling.victims(cands, len(cands))]


def test_scale_in_order() -> None:
    c = scaling.Candidate
    cands = [
        c(pod("busy"), 0, node("busy", "ALLOCATED")),
        c(pod("idle-high"), 5, node("idle-high", "IDLE")),
        c(pod("idle-low"), 1, node("idle-low", "IDLE")),
        c(pod("unready", ready=False), 2, node("unready", "IDLE")),
        c(pod("unscheduled", scheduled=False, ready=False), 3, None),
        c(pod("cheap", **{builder.ANNOTATION_DELETION_COST: "-5"}), 4, node("cheap", "MIXED")),
        c(
            pod("condemned", **{builder.ANNOTATION_CONDEMNED: "scale-in"}),
            6,
            node("condemned", "MIXED"),
        ),
    ]
    assert order(cands) == [
        "condemned",
        "unscheduled",
        "unready",
        "idle-high",
        "idle-low",
        "cheap",
        "busy",
    ]


def test_deadline_then_cordon_then_ordinal_break_ties() -> None:
    c = scaling.Candidate
    cands = [
        c(
            pod("late", **{builder.ANNOTATION_DEADLINE: "2030-01-01T00:00:00Z"}),
            9,
            node("a", "MIXED"),
        ),
        c(
            pod("soon", **{builder.ANNOTATION_DEADLINE: "2029-01-01T00:00:00Z"}),
            1,
            node("b", "MIXED"),
        ),
        c(pod("cordoned", **{builder.ANNOTATION_CORDON: "true"}), 0, node("c", "MIXED")),
        c(pod("plain"), 2, node("d", "MIXED")),
    ]
    assert order(cands) == ["soon", "late", "cordoned", "plain"]


def test_slow_start_and_max_unavailable() -> None:
    assert sync.slow_start_batches(10) == [1, 2, 4, 3]
    assert sync.slow_start_batches(0) == []
    _, spec = nodeset(updateStrategy={"rollingUpdate": {"maxUnavailable": "25%"}})
    assert max_unavailable(spec.update_strategy.rolling_update, 10) == 2
    assert max_unavailable(spec.update_strategy.rolling_update, 2) == 1, "never 0"


def test_an_update_drains_a_busy_node_only_within_max_unavailable_even_if_it_looks_unready() -> (
    None
):
    """Two old pods run jobs; one was just chosen, so nothing more is allowed. The other
    one's readiness probe timed out (or its node went NOT_RESPONDING for a moment): it is
    not drained too, as its jobs show it works. An unready idle pod still goes for free."""
    busy = scaling.Candidate(pod("busy", ready=False), 1, node("busy", "ALLOCATED"))
    idle = scaling.Candidate(pod("idle", ready=False), 2, node("idle", "IDLE"))
    gone = scaling.Candidate(pod("gone", ready=False), 3, None)
    fine = scaling.Candidate(pod("fine"), 4, node("fine", "IDLE"))
    now = dt.datetime.now(dt.UTC)

    def is_available(p: JSON) -> bool:
        return pods.is_ready(p)

    def names(cands: list[scaling.Candidate], allowed: int) -> list[str]:
        chosen, _ = choose(cands, allowed, is_available, now)
        return [p["metadata"]["name"] for p in chosen]

    assert names([busy, idle, gone, fine], 0) == ["idle", "gone"]
    assert names([busy, idle, gone, fine], 1) == ["busy", "idle", "gone"]
    assert names([fine, busy], 1) == ["fine"]


def test_an_update_never_replaces_for_free_a_pod_ready_within_the_registration_window() -> None:
    """Ready a moment ago and its Slurm node not shown (registering, or the view predates
    the registration): not known to be unavailable, so it does not go for free. Once the
    window has passed, a Ready pod without a Slurm node is broken, and goes for free."""

    def ready_for(name: str, seconds: float) -> JSON:
        p = pod(name)
        since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
        p["status"]["conditions"][0]["lastTransitionTime"] = since.isoformat()
        return p

    now = dt.datetime.now(dt.UTC)
    fresh = scaling.Candidate(ready_for("fresh", 3), 1, None)
    broken = scaling.Candidate(ready_for("broken", 600), 2, None)
    chosen, held = choose([fresh, broken], 0, lambda _p: False, now)
    assert (chosen, held) == ([broken.pod], [fresh.pod])
    assert 0 < settling(fresh.pod, now) <= REGISTRATION_WINDOW_S - 2
    assert settling(broken.pod, now) == 0
    assert settling(pod("unready", ready=False), now) == 0


def test_slurm_state_becomes_pod_conditions_with_reason() -> None:
    n = Node.parse({"name": "x", "state": ["IDLE", "DRAIN"], "reason": "admin: dimm"})
    conds = slurm_conditions(n)
    assert conds["SlurmNodeStateIdle"] == (True, "")
    assert conds["SlurmNodeStateDrain"] == (True, "admin: dimm")
    assert conds["SlurmNodeStateAllocated"] == (False, "")


def test_the_cached_pod_keeps_what_the_operator_reads_and_answers_alike() -> None:
    obj, spec = nodeset(replicas=1)
    pod = builder.build_pod(obj, spec, 0, revision="r1", conf_server="ctld:6817")
    pod["metadata"].update(
        uid="u0",
        resourceVersion="7",
        managedFields=[{"manager": "kubelet", "fieldsV1": {"f:status": {}}}],
        annotations={builder.ANNOTATION_CONDEMNED: "scale-in"},
    )
    pod["spec"]["nodeName"] = "node-1"
    pod["status"] = {
        "phase": "Running",
        "podIP": "10.0.0.5",
        "conditions": [
            {"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-22T09:00:00Z"}
        ],
    }
    cached = pods.slim(pod)
    assert "managedFields" not in cached["metadata"]
    assert cached["spec"] == {"nodeName": "node-1"}
    assert set(cached["status"]) == {"phase", "conditions", "podIP"}
    assert json.loads(json.dumps(cached)) == cached, "still plain JSON"
    for p in (pod, cached):
        assert pods.name(p) == "cpu-0" and pods.node_name(p) == "node-1"
        assert pods.revision_of(p) == "r1" and pods.condemned(p) == "scale-in"
        assert pods.phase(p) == "Running" and pods.is_ready(p)
        assert pods.ready_since(p) == dt.datetime(2026, 11, 22, 9, 0, tzinfo=dt.UTC)
    not_ready = {**pod, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}
    assert pods.ready_since(pods.slim(not_ready)) is None
    assert pods.phase(pods.slim(not_ready)) == "Pending"


def test_the_node_registers_with_the_slurmd_containers_limits() -> None:
    def size(limits: dict[str, str]) -> dict[str, str]:
        return builder.node_size({"resources": {"limits": limits, "requests": {"cpu": "8"}}})

    assert size({"cpu": "2", "memory": "4Gi"}) == {"CPUs": "2", "RealMemory": str(4096 - 128)}
    assert size({"cpu": "1500m"}) == {"CPUs": "1"}  # Slurm counts whole CPUs
    assert size({"cpu": "200m", "memory": "256Mi"}) == {"CPUs": "1", "RealMemory": "192"}
    assert size({"memory": "2G"}) == {"RealMemory": str(2 * 10**9 // 2**20 - 128)}
    assert size({}) == {} and builder.node_size({}) == {}  # no limits: what slurmd detects
    assert size({"cpu": "two"}) == {}  # the apiserver refuses the pod, naming the field
    args = builder.slurmd_args(
        ["--conf", "RealMemory=1000 Weight=5"],
        nodeset="cpu",
        conf_server=None,
        node_conf={"CPUs": "2", "RealMemory": "3968"},
    )
    assert args[:2] == ["--conf", "Features=cpu CPUs=2 RealMemory=1000 Weight=5"], "user's wins"
    args = builder.slurmd_args(
        ["--conf=cpus=4"], nodeset="cpu", conf_server=None, node_conf={"CPUs": "2"}
    )
    assert args[0] == "--conf=Features=cpu cpus=4"


def test_a_pod_with_limits_gets_them_in_slurmds_conf() -> None:
    obj, spec = nodeset(
        template={
            "metadata": {"labels": {"app": "cpu"}},
            "spec": {
                "containers": [
                    {"name": "slurmd", "resources": {"limits": {"cpu": "3", "memory": "1Gi"}}}
                ]
            },
        }
    )
    pod = builder.build_pod(obj, spec, 0, revision="r", conf_server=None)
    (slurmd,) = pod["spec"]["containers"]
    assert slurmd["args"][-2:] == ["--conf", "Features=cpu CPUs=3 RealMemory=896"]


def test_extended_resources_become_gres_counts() -> None:
    widget = {"example.com/widget": "widget", "nvidia.com/gpu": "gpu", "amd.com/gpu": "gpu"}
    limits = {"nvidia.com/gpu": "2", "amd.com/gpu": "1", "example.com/widget": "4", "cpu": "2"}
    got = builder.node_size({"resources": {"limits": limits}}, widget)
    assert got == {"CPUs": "2", "Gres": "gpu:3,widget:4"}
    # Not mapped: not a GRES (Slurm refuses a node with a GRES missing from GresTypes).
    assert builder.node_size({"resources": {"limits": {"example.com/widget": "4"}}}) == {}
    assert builder.node_size({"resources": {"limits": {"nvidia.com/gpu": "0"}}}) == {}
    args = builder.slurmd_args(
        ["--conf", "Gres=gpu:1"], nodeset="g", conf_server=None, node_conf={"Gres": "gpu:2"}
    )
    assert args[:2] == ["--conf", "Features=g Gres=gpu:1"], "the user's Gres= wins"


def test_gres_resources_flag_parses_and_refuses_what_is_not_a_mapping() -> None:
    import pytest

    from slinky.operator.main import parse_args, parse_gres_resources

    assert parse_gres_resources("nvidia.com/gpu=gpu, example.com/w = w ,") == {
        "nvidia.com/gpu": "gpu",
        "example.com/w": "w",
    }
    assert parse_gres_resources("") == {}
    assert parse_args([]).gres_resources == {"nvidia.com/gpu": "gpu", "amd.com/gpu": "gpu"}
    for bad in ("gpu", "gpu=gpu", "nvidia.com/gpu="):
        with pytest.raises(ValueError):
            parse_gres_resources(bad)
    with pytest.raises(SystemExit):
        parse_args(["--gres-resources=gpu"])
