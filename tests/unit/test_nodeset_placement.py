"""Placement from Kubernetes: node labels become Slurm features and a place in a Slurm tree
topology; features someone else gave the node stay, and only differences are written."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest

from slinky.api.schema import parse
from slinky.api.v1alpha1.nodeset import NodeSetSpec
from slinky.kube.store import Store
from slinky.operator.clients import Connection
from slinky.operator.main import parse_args
from slinky.operator.nodeset import placement
from slinky.operator.nodeset.builder import ANNOTATION_SLURM_FEATURES
from slinky.operator.nodeset.controller import slim_node
from slinky.operator.nodeset.view import Placement, View
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.models import Node
from slinky.slurm.tokens import StaticToken
from tests.unit.fake_http import MockTransport

NFD = "feature.node.kubernetes.io/"
ZONE = "topology.kubernetes.io/zone"
RACK = "example.com/rack"
CONFIG = Placement(
    feature_labels=(NFD, ZONE), topology_labels=(ZONE, RACK), topology_root="racks:top"
)


def test_labels_give_features_by_value_or_by_key_for_true() -> None:
    labels = {
        f"{NFD}cpu-cpuid.AVX512F": "true",
        f"{NFD}cpu-cpuid.SSE": "false",  # false: nothing
        f"{NFD}kernel-version.major": "6",  # under a prefix only true counts
        ZONE: "zone-a",
        RACK: "r1",  # a topology label only
        "kubernetes.io/hostname": "k1",  # not asked for
        f"{NFD}bad": "a,b",  # a comma would split the feature: left out
    }
    assert placement.label_features(labels, CONFIG) == ["cpu-cpuid.AVX512F", "zone-a"]


def kube_node(labels: dict[str, str], **notes: str) -> dict[str, Any]:
    return {"metadata": {"name": "k1", "labels": labels, "annotations": notes}}


def test_topology_is_a_switch_path_under_the_root_and_needs_every_label() -> None:
    # Slurm's syntax: an existing switch first, then switches made as needed, the leaf last.
    assert placement.topology_unit(kube_node({ZONE: "z1", RACK: "r1"}), CONFIG) == (
        "racks:top:z1:z1.r1"  # a rack r1 of another zone is another switch
    )
    assert placement.topology_unit(kube_node({ZONE: "z1"}), CONFIG) is None
    assert placement.topology_unit(kube_node({ZONE: "z1", RACK: "r:1"}), CONFIG) is None
    assert placement.topology_unit(kube_node({ZONE: "z1", RACK: "r1"}), Placement()) is None


def test_upstreams_topology_annotation_is_taken_as_is_flags_or_not() -> None:
    spec = placement.ANNOTATION_TOPOLOGY_SPEC
    node = kube_node({ZONE: "z1", RACK: "r1"}, **{spec: "topo-block:b1"})
    assert placement.topology_unit(node, CONFIG) == "topo-block:b1"
    assert placement.topology_unit(node, Placement()) == "topo-block:b1"
    assert placement.topology_unit(kube_node({}, **{spec: "bad spec"}), CONFIG) is None


def test_the_flags_parse_and_bad_ones_name_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse_args([f"--node-feature-labels={NFD},{ZONE}", f"--topology-labels={ZONE},{RACK}"])
    assert args.placement == Placement((NFD, ZONE), (ZONE, RACK), "default:root")
    assert parse_args([]).placement == Placement()
    for bad, flag in (
        ("--topology-labels=example.com/", "--topology-labels"),
        ("--node-feature-labels=a/b/c", "--node-feature-labels"),
        ("--topology-root=racks", "--topology-root"),
        ("--topology-root=racks:a b", "--topology-root"),
    ):
        with pytest.raises(SystemExit):
            parse_args([bad])
        assert f"argument {flag}" in capsys.readouterr().err


def test_the_kept_kubernetes_node_has_its_labels() -> None:
    kept = slim_node({"metadata": {"name": "k1", "labels": {ZONE: "z1"}}, "status": {}})
    assert kept["metadata"]["labels"] == {ZONE: "z1"}
    assert CONFIG.labels_of({ZONE: "z1", "other": "x", f"{NFD}a": "true"}) == {
        ZONE: "z1",
        f"{NFD}a": "true",
    }


def slurm_comment(namespace: str, pod: str) -> str:
    return json.dumps({"namespace": namespace, "podName": pod})


def setup(
    raw_node: dict[str, Any],
    labels: dict[str, str],
    pod_notes: dict[str, str],
    status: int = 200,
    refuse: str = "",
) -> Any:
    posts: list[Any] = []

    def handler(req: httpx2.Request) -> httpx2.Response:
        posts.append(json.loads(req.content))
        if status != 200 or refuse in posts[-1]:
            error = {
                "error": "Requested topology configuration is not available",
                "error_number": 1,
            }
            return httpx2.Response(status if status != 200 else 500, json={"errors": [error]})
        return httpx2.Response(200, json={})

    client = SlurmClient("http://slurm.test", StaticToken("t", user="u"))
    client.version = "v0.0.45"
    client.http = MockTransport(client.url, handler)
    informer = SlurmInformer(client)
    informer._synced.set()
    informer.stale = False
    informer.nodes = {"cpu-0": Node.parse({"name": "cpu-0", **raw_node})}
    conn = Connection("ns/slurm", "cuid", client.url, client, informer, "fp")
    pod = {
        "metadata": {"name": "cpu-0", "namespace": "ns", "uid": "u0", "annotations": pod_notes},
        "spec": {"nodeName": "k1"},
        "status": {"phase": "Running"},
    }
    obj = {"metadata": {"name": "cpu", "namespace": "ns", "uid": "nsuid"}, "spec": {}}
    spec = parse(NodeSetSpec, {"clusterName": "slurm", "selector": {}, "template": {}}, "spec")
    view = View(obj, spec, "ns/cpu", "ns/cpu/nsuid", "rev", None, conn, {"cpu-0": pod}, {})
    nodes = SimpleNamespace(store=Store())
    nodes.store.upsert({"metadata": {"name": "k1", "labels": labels}})
    patches: list[Any] = []

    async def patch_metadata(_pod: Any, **kw: Any) -> None:
        patches.append(kw)

    events: list[Any] = []
    ctx = SimpleNamespace(
        placement=CONFIG,
        placement_writes={},
        nodes=nodes,
        podcontrol=SimpleNamespace(patch_metadata=patch_metadata),
        recorder=SimpleNamespace(event=lambda *a, **k: events.append(a)),
        events=events,
    )
    return ctx, view, posts, patches


async def test_a_node_is_given_its_features_and_place_once() -> None:
    comment = slurm_comment("ns", "cpu-0")
    ctx, view, posts, patches = setup(
        {"features": ["gpu"], "comment": comment}, {ZONE: "z1", RACK: "r1"}, {}
    )
    await placement.sync_placement(ctx, view)
    assert posts == [
        {"features": ["gpu", "z1"], "features_act": ["gpu", "z1"]},
        {"topology_str": "racks:top:z1:z1.r1"},
    ]
    assert patches == [{"annotations": {ANNOTATION_SLURM_FEATURES: "z1"}}]
    # Slurm shows it so (in its own order): nothing more is written.
    ctx, view, posts, patches = setup(
        {"features": ["z1", "gpu"], "comment": comment, "topology": "racks:top:z1:z1.r1"},
        {ZONE: "z1", RACK: "r1"},
        {ANNOTATION_SLURM_FEATURES: "z1"},
    )
    await placement.sync_placement(ctx, view)
    assert posts == [] and patches == []


async def test_a_node_of_another_pod_is_never_written() -> None:
    ctx, view, posts, _ = setup(
        {"comment": slurm_comment("other", "cpu-0")}, {ZONE: "z1", RACK: "r1"}, {}
    )
    await placement.sync_placement(ctx, view)
    assert posts == []


async def test_a_write_is_not_repeated_before_slurm_shows_it_nor_a_refused_one_soon() -> None:
    comment = slurm_comment("ns", "cpu-0")
    ctx, view, posts, _ = setup({"comment": comment}, {ZONE: "z1", RACK: "r1"}, {})
    await placement.sync_placement(ctx, view)
    await placement.sync_placement(ctx, view)  # the Slurm view has not caught up yet
    assert len(posts) == 2  # features, topology: once each
    ctx, view, posts, patches = setup({"comment": comment}, {ZONE: "z1", RACK: "r1"}, {}, 500)
    for _ in range(3):
        await placement.sync_placement(ctx, view)
    assert len(posts) == 2  # refused: tried again in minutes, not at every reconcile
    assert patches == []  # features Slurm refused are not recorded as added
    assert [(e[1], e[2]) for e in ctx.events] == [("Warning", "SlurmNodePlacementFailed")] * 2


async def test_features_others_gave_stay_and_those_whose_label_went_go() -> None:
    comment = slurm_comment("ns", "cpu-0")
    # "old" was added by the operator from a label that is gone; "gpu" came with slurmd.
    ctx, view, posts, patches = setup(
        {"features": ["gpu", "z0", "old"], "comment": comment},
        {ZONE: "z1"},
        {ANNOTATION_SLURM_FEATURES: "z0,old"},
    )
    await placement.sync_placement(ctx, view)
    assert posts == [{"features": ["gpu", "z1"], "features_act": ["gpu", "z1"]}]
    assert patches == [{"annotations": {ANNOTATION_SLURM_FEATURES: "z1"}}]


async def test_a_feature_the_node_had_is_not_claimed_as_added() -> None:
    """A label giving a feature the node registered with: removing the label later must
    not take the feature away."""
    comment = slurm_comment("ns", "cpu-0")
    ctx, view, posts, patches = setup({"features": ["z1"], "comment": comment}, {ZONE: "z1"}, {})
    await placement.sync_placement(ctx, view)
    assert posts == [] and patches == []


async def test_nothing_is_decided_on_a_slurm_view_older_than_the_last_write() -> None:
    """The review's race: zone z0 -> z1 written, the annotation says z1 at once, the Slurm
    view still shows z0. Deciding then would keep z0 as someone else's feature for good."""
    comment = slurm_comment("ns", "cpu-0")
    ctx, view, posts, patches = setup(
        {"features": ["gpu", "z0"], "comment": comment},
        {ZONE: "z1"},
        {ANNOTATION_SLURM_FEATURES: "z0"},
    )
    await placement.sync_placement(ctx, view)
    assert posts == [{"features": ["gpu", "z1"], "features_act": ["gpu", "z1"]}]
    view.active["cpu-0"]["metadata"]["annotations"][ANNOTATION_SLURM_FEATURES] = "z1"
    await placement.sync_placement(ctx, view)  # same stale Slurm view: no new decision
    assert len(posts) == 1 and len(patches) == 1


async def test_a_refused_topology_does_not_hold_back_the_features() -> None:
    comment = slurm_comment("ns", "cpu-0")
    ctx, view, posts, patches = setup(
        {"comment": comment}, {ZONE: "z1", RACK: "r1"}, {}, refuse="topology_str"
    )
    await placement.sync_placement(ctx, view)
    assert posts == [
        {"features": ["z1"], "features_act": ["z1"]},
        {"topology_str": "racks:top:z1:z1.r1"},
    ]
    assert patches == [{"annotations": {ANNOTATION_SLURM_FEATURES: "z1"}}]
    ((_, kind, reason, message),) = ctx.events
    assert (kind, reason) == ("Warning", "SlurmNodePlacementFailed") and "topology" in message
