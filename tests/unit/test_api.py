"""The custom resources: generated CRDs are checked in, and models parse with defaults."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from slinky.api.schema import ParseError, dump, parse
from slinky.api.v1alpha1 import crds, podtemplate
from slinky.api.v1alpha1.cluster import ClusterSpec
from slinky.api.v1alpha1.common import parse_duration
from slinky.api.v1alpha1.nodeset import NodeSetSpec
from tests.unit.test_helm_charts import CHARTS, _schema_problems, helm, one, render_values

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


def _template_schema() -> dict[str, Any]:
    ns = crds.crds()["slinky.slurm.net_nodesets.yaml"]
    root = ns["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema: dict[str, Any] = root["properties"]["spec"]["properties"]["template"]
    return schema


def _template(**container: Any) -> dict[str, Any]:
    return {
        "metadata": {"labels": {"app": "a"}},
        "spec": {
            "containers": [{"name": "slurmd", "image": "slurmd", **container}],
            "volumes": [{"name": "v", "emptyDir": {"sizeLimit": "1Gi"}}],
        },
    }


def test_a_typo_in_the_pod_template_is_not_in_the_crd_schema() -> None:
    """`resurces:` was kept under x-kubernetes-preserve-unknown-fields and ignored when the pod
    was made (a Slurm node the host's size); the schema is PodTemplateSpec's own now, so the
    apiserver refuses it (strict field validation) or prunes it, as for a StatefulSet."""
    schema = _template_schema()
    good = _template(
        resources={"limits": {"cpu": 0.5, "memory": "1Gi"}, "requests": {"cpu": 1}},
        ports=[{"containerPort": 6818, "protocol": "TCP"}],
        livenessProbe={"tcpSocket": {"port": "slurmd"}},
    )
    assert _schema_problems(good, schema, "spec.template") == []
    typo = _template(resurces={"limits": {"cpu": 1}})
    assert _schema_problems(typo, schema, "spec.template") == [
        "spec.template.spec.containers[0].resurces: not in the CRD schema (pruned)"
    ]
    limts = _template(resources={"limts": {"cpu": 1}})
    assert _schema_problems(limts, schema, "spec.template") == [
        "spec.template.spec.containers[0].resources.limts: not in the CRD schema (pruned)"
    ]
    spec_typo = _template()
    spec_typo["spec"]["nodeSelecter"] = {"a": "b"}
    assert _schema_problems(spec_typo, schema, "spec.template") == [
        "spec.template.spec.nodeSelecter: not in the CRD schema (pruned)"
    ]


def test_the_template_schema_is_structural_and_changes_no_stored_template() -> None:
    """No defaults (the apiserver would add them to every stored template, so every NodeSet's
    revision, and its pods, would change on a CRD upgrade), no merge markers, no prose, no
    unknown-field keeping except the quantities (an int, a float or a string); CEL reads
    bounded labels and containers; the CRD fits kubectl's client-side apply annotation."""
    schema = _template_schema()
    kept: list[dict[str, Any]] = []
    paths: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        assert "default" not in node, path
        assert not [k for k in node if k.startswith("x-kubernetes-list")], path
        assert "type" in node or node.keys() & {
            "x-kubernetes-int-or-string",
            "x-kubernetes-preserve-unknown-fields",
        }, path
        if node.get("x-kubernetes-preserve-unknown-fields"):
            kept.append(node)
            paths.append(path)
        for key, sub in node.get("properties", {}).items():
            walk(sub, f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key], f"{path}{'[]' if key == 'items' else '.*'}")

    walk(schema, "template")
    # Quantities only: a value of any type, never an object that keeps unknown fields.
    assert kept and all(node == {"x-kubernetes-preserve-unknown-fields": True} for node in kept)
    assert "template.spec.containers[].resources.limits.*" in paths
    assert schema["properties"]["metadata"]["properties"]["labels"]["maxProperties"] == 64
    assert schema["properties"]["spec"]["properties"]["containers"]["maxItems"] == 256
    size = len(json.dumps(crds.crds()["slinky.slurm.net_nodesets.yaml"], separators=(",", ":")))
    assert size < 262144 // 2, f"{size} bytes: kubectl apply's last-applied annotation"


def test_the_checked_in_openapi_copy_is_what_extract_makes() -> None:
    """podtemplate.extract of the copy itself changes nothing: it holds PodTemplateSpec and
    every definition it reaches, descriptions removed."""
    defs = podtemplate.load()
    document = {"components": {"schemas": defs}}
    assert podtemplate.extract(document) == defs
    assert "io.k8s.api.core.v1.ResourceRequirements" in defs
    assert "description" not in json.dumps(defs).replace('"description":{', "")


@pytest.mark.parametrize(
    ("typo", "where"),
    [
        (
            "controller.resources.limts.cpu=1",
            "'/controller/resources': additional properties 'limts'",
        ),
        (
            "compute.nodesetDefaults.resources.requets.memory=1Gi",
            "'/compute/nodesetDefaults/resources': additional properties 'requets'",
        ),
        (
            "compute.nodesets[0].name=a,compute.nodesets[0].resources.limts.cpu=1",
            "'/compute/nodesets/0/resources': additional properties 'limts'",
        ),
    ],
)
def test_a_typo_in_a_slurm_chart_resources_block_is_refused_naming_it(
    typo: str, where: str
) -> None:
    """`resources.limts` was taken (the block was any object) and the pod had no limits."""
    out = helm("template", "x", str(CHARTS / "slurm"), "--set", typo, check=False)
    assert out.returncode != 0 and where in out.stderr, out.stderr


def test_the_slurm_chart_takes_what_kubernetes_takes_in_a_resources_block(
    tmp_path: Path,
) -> None:
    block = {
        "limits": {"cpu": 0.5, "memory": "1Gi", "nvidia.com/gpu": 1},
        "requests": {"cpu": "250m"},
        "claims": [{"name": "gpu"}],
    }
    values = {
        "controller": {"resources": block},
        "compute": {"nodesetDefaults": {"resources": block}},
    }
    objs = render_values("slurm", values, tmp_path)
    nodeset = one(objs, "NodeSet")
    containers = nodeset["spec"]["template"]["spec"]["containers"]
    slurmd = next(c for c in containers if c["name"] == "slurmd")
    assert slurmd["resources"]["limits"]["nvidia.com/gpu"] == 1, slurmd["resources"]
