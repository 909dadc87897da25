"""The custom resources: generated CRDs are checked in, and models parse with defaults."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from slinky.api.schema import ParseError, dump, parse
from slinky.api.v1alpha1 import crds
from slinky.api.v1alpha1.cluster import ClusterSpec
from slinky.api.v1alpha1.common import parse_duration
from slinky.api.v1alpha1.nodeset import NodeSetSpec

REPO = Path(__file__).resolve().parents[2]


def test_checked_in_crds_match_the_models() -> None:
    for name, obj in crds.crds().items():
        path = REPO / "config" / "crd" / name
        assert path.exists(), f"missing {path}: run `make crds`"
        assert path.read_text() == crds.render(obj), f"{path} is stale: run `make crds`"


def test_crd_schema_has_scale_subresource_and_columns() -> None:
    ns = crds.crds()["slinky.slurm.net_nodesets.yaml"]
    version = ns["spec"]["versions"][0]
    assert version["subresources"]["scale"] == {
        "specReplicasPath": ".spec.replicas",
        "statusReplicasPath": ".status.replicas",
        "labelSelectorPath": ".status.selector",
    }
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert "replicas" in status and "selector" in status, "scale paths must exist in the schema"
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Replicas",
        "Ready",
        "Updated",
        "Idle",
        "Allocated",
        "Down",
        "Drain",
        "Age",
    ]
    assert ns["spec"]["names"]["shortNames"] == ["nss", "nodeset"]
    yaml.safe_dump(ns)


def test_nodeset_spec_defaults_and_upstream_fields() -> None:
    spec = parse(
        NodeSetSpec,
        {
            "clusterName": "slurm",
            "selector": {"matchLabels": {"a": "b"}},
            "template": {"metadata": {"labels": {"a": "b"}}, "spec": {"containers": []}},
            "updateStrategy": {"rollingUpdate": {"maxUnavailable": "20%"}},
        },
        "spec",
    )
    assert spec.replicas == 1 and spec.revision_history_limit == 10
    assert spec.update_strategy.type == "RollingUpdate"
    assert spec.update_strategy.rolling_update is not None
    assert spec.update_strategy.rolling_update.max_unavailable == "20%"
    assert spec.persistent_volume_claim_retention_policy.when_scaled == "Retain"
    assert dump(spec)["clusterName"] == "slurm"


def test_parse_errors_name_the_field() -> None:
    with pytest.raises(ParseError, match=r"spec\.server: required"):
        parse(ClusterSpec, {}, "spec")
    with pytest.raises(ParseError, match=r"spec\.replicas: expected int"):
        parse(
            NodeSetSpec,
            {"clusterName": "x", "selector": {}, "template": {}, "replicas": "3"},
            "spec",
        )


def test_durations() -> None:
    assert parse_duration("2s") == 2
    assert parse_duration("1m30s") == 90
    assert parse_duration("500ms") == 0.5
    with pytest.raises(ValueError):
        parse_duration("0s")
