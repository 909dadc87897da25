"""The bridge's admission webhook, called by the real apiserver: pods of managed namespaces
are pointed at the bridge's scheduler and tolerate the managed-node taint; every validation
rule refuses with its own message; a webhook that is down blocks only managed namespaces;
a renewed serving certificate is picked up without a restart."""

from __future__ import annotations

import copy
import json
import ssl
import uuid
from typing import Any

import pytest

from slinky.bridge.labels import SLURM_JOBID, SLURM_NODE, SLURMJOB_PREFIX
from slinky.kube import rest
from slinky_testbed.waiting import wait_for
from tests.e2e.bridge_fixtures import SCHEDULER, BridgeEnv, issue_serving_cert

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
TOLERATION = {
    "key": "slinky.slurm.net/managed-node",
    "operator": "Equal",
    "value": SCHEDULER,
    "effect": "NoExecute",
}


def pod_manifest(name: str | None = None, **spec: Any) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name or f"p-{uuid.uuid4().hex[:6]}", "labels": {}, "annotations": {}},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "busybox",
                    "command": ["sleep", "60"],
                    "resources": {
                        "requests": {"cpu": "100m", "memory": "64Mi"},
                        "limits": {"cpu": "200m", "memory": "64Mi"},
                    },
                }
            ],
            **spec,
        },
    }


async def dry_run_create(kube: rest.Kube, namespace: str, pod: JSON) -> JSON:
    return await kube.request("POST", rest.PODS.path(namespace), params={"dryRun": "All"}, body=pod)


async def denied(coro: Any) -> str:
    with pytest.raises(rest.ApiError) as err:
        await coro
    assert err.value.code == 403, err.value
    assert "denied the request" in err.value.message, err.value.message
    return err.value.message


async def test_kubectl_run_in_a_managed_namespace_gets_the_bridge_scheduler_and_toleration(
    bridge: BridgeEnv,
) -> None:
    ns = bridge.managed_namespace
    bridge.kubectl("run", "runme", "-n", ns, "--image=busybox", "--restart=Never", "--", "true")
    try:
        pod = await bridge.kube.get(rest.PODS, "runme", ns)
        assert pod["spec"]["schedulerName"] == SCHEDULER
        assert TOLERATION in pod["spec"]["tolerations"]
    finally:
        await bridge.kube.delete(rest.PODS, "runme", ns, grace_period=0)


async def test_pods_of_other_namespaces_are_unchanged(bridge: BridgeEnv, namespace: str) -> None:
    out = bridge.kubectl(
        "run", "runme", "-n", namespace, "--image=busybox", "--restart=Never",
        "--dry-run=server", "-o", "json", "--", "true",
    )  # fmt: skip
    pod = json.loads(out.stdout)
    assert pod["spec"]["schedulerName"] == "default-scheduler"
    assert TOLERATION not in (pod["spec"].get("tolerations") or [])


CREATE_RULES = [
    ("job-id label", {"labels": {SLURM_JOBID: "7"}}, {}, f"label {SLURM_JOBID} is set by"),
    ("slurm-node", {"annotations": {SLURM_NODE: "n"}}, {}, f"annotation {SLURM_NODE} is set by"),
    (
        "unknown slurmjob key",
        {"annotations": {SLURMJOB_PREFIX + "acount": "a"}},
        {},
        f"unknown annotation {SLURMJOB_PREFIX}acount (did you mean {SLURMJOB_PREFIX}account?)",
    ),
    (
        "integer",
        {"annotations": {SLURMJOB_PREFIX + "mem-per-node": "1G"}},
        {},
        f"annotation {SLURMJOB_PREFIX}mem-per-node must be a whole number",
    ),
    (
        "timelimit",
        {"annotations": {SLURMJOB_PREFIX + "timelimit": "2h"}},
        {},
        f"annotation {SLURMJOB_PREFIX}timelimit is the time limit in whole minutes",
    ),
    (
        "exclusive",
        {"annotations": {SLURMJOB_PREFIX + "exclusive": "yes"}},
        {},
        f'annotation {SLURMJOB_PREFIX}exclusive must be "true" or "false"',
    ),
    (
        "nodes range",
        {"annotations": {SLURMJOB_PREFIX + "min-nodes": "3", SLURMJOB_PREFIX + "max-nodes": "1"}},
        {},
        "min-nodes (3) is larger than",
    ),
    (
        "topology spread",
        {},
        {
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"a": "b"}},
                }
            ]
        },
        "spec.topologySpreadConstraints are not supported by slurm-bridge",
    ),
    (
        "resource claims",
        {},
        {"resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu-claim"}]},
        "resourceClaims (dynamic resource allocation) are not supported",
    ),
]


@pytest.mark.parametrize(
    ("meta", "spec", "message"),
    [pytest.param(m, s, msg, id=i) for i, m, s, msg in CREATE_RULES],
)
async def test_each_create_rule_rejects_with_its_message(
    bridge: BridgeEnv, meta: JSON, spec: JSON, message: str
) -> None:
    pod = pod_manifest(**spec)
    pod["metadata"].update(copy.deepcopy(meta))
    if "resourceClaims" in spec:
        pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    text = await denied(dry_run_create(bridge.kube, bridge.managed_namespace, pod))
    assert message in text


async def test_a_good_pod_with_slurmjob_annotations_is_admitted(bridge: BridgeEnv) -> None:
    pod = pod_manifest()
    pod["metadata"]["annotations"] = {
        SLURMJOB_PREFIX + "timelimit": "30",
        SLURMJOB_PREFIX + "exclusive": "false",
        SLURMJOB_PREFIX + "cpu-per-task": "2",
        SLURMJOB_PREFIX + "account": "physics",
    }
    created = await dry_run_create(bridge.kube, bridge.managed_namespace, pod)
    assert created["spec"]["schedulerName"] == SCHEDULER


async def test_job_id_and_node_are_fixed_once_the_pod_is_bound(bridge: BridgeEnv) -> None:
    ns, kube = bridge.managed_namespace, bridge.kube
    node = await bridge.create_node()
    # Another scheduler's pod in a managed namespace: the same rules hold, and the bridge's
    # own scheduler leaves it to this test to play the scheduler.
    pod = await kube.create(rest.PODS, pod_manifest(schedulerName="e2e-scheduler"), ns)
    name = pod["metadata"]["name"]
    try:
        # Before binding, the scheduler records the job and node: allowed.
        await kube.patch(
            rest.PODS,
            name,
            {"metadata": {"labels": {SLURM_JOBID: "41"}, "annotations": {SLURM_NODE: node}}},
            ns,
        )
        await kube.request(
            "POST",
            rest.PODS.path(ns, name, "binding"),
            body={
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
        )
        text = await denied(
            kube.patch(rest.PODS, name, {"metadata": {"labels": {SLURM_JOBID: "42"}}}, ns)
        )
        assert f"label {SLURM_JOBID} cannot be changed or removed" in text
        text = await denied(
            kube.patch(rest.PODS, name, {"metadata": {"annotations": {SLURM_NODE: None}}}, ns)
        )
        assert f"annotation {SLURM_NODE} cannot be changed or removed" in text
        text = await denied(
            kube.patch(
                rest.PODS,
                name,
                {
                    "spec": {
                        "containers": [
                            {
                                "name": "c",
                                "resources": {
                                    "requests": {"cpu": "150m", "memory": "64Mi"},
                                    "limits": {"cpu": "200m", "memory": "64Mi"},
                                },
                            }
                        ]
                    }
                },
                ns,
                subresource="resize",
                kind="strategic",
            )
        )
        assert "in-place resize is not supported" in text
    finally:
        await kube.delete(rest.PODS, name, ns, grace_period=0)


async def test_a_webhook_that_is_down_blocks_only_managed_namespaces(
    bridge: BridgeEnv, namespace: str
) -> None:
    assert bridge.bridge.stop() == 0
    try:
        await dry_run_create(bridge.kube, namespace, pod_manifest())
        # Pods naming the bridge's scheduler outside managed namespaces: validated when the
        # webhook is up, never blocked when it is down.
        await dry_run_create(bridge.kube, namespace, pod_manifest(schedulerName=SCHEDULER))
        with pytest.raises(rest.ApiError) as err:
            await dry_run_create(bridge.kube, bridge.managed_namespace, pod_manifest())
        assert "failed calling webhook" in err.value.message
    finally:
        await bridge.bridge.restart()
    pod = pod_manifest(schedulerName=SCHEDULER)
    pod["metadata"]["labels"] = {SLURM_JOBID: "1"}
    text = await denied(dry_run_create(bridge.kube, namespace, pod))
    assert f"label {SLURM_JOBID} is set by" in text


async def test_a_renewed_serving_certificate_is_used_without_restart(bridge: BridgeEnv) -> None:
    address = ("127.0.0.1", bridge.bridge.webhook_port)
    before = ssl.get_server_certificate(address)
    issue_serving_cert(bridge.ca_dir, bridge.cert_dir)
    new = (bridge.cert_dir / "tls.crt").read_text()
    assert new.strip() != before.strip()

    def served_new() -> bool:
        return ssl.get_server_certificate(address).strip() == new.strip()

    await wait_for(served_new, timeout=30, what="the webhook serving the renewed certificate")
    created = await dry_run_create(bridge.kube, bridge.managed_namespace, pod_manifest())
    assert created["spec"]["schedulerName"] == SCHEDULER


async def test_a_pod_asking_for_an_account_or_qos_its_rule_does_not_allow_is_refused(
    bridge: BridgeEnv,
) -> None:
    ns = bridge.managed_namespace
    for short, value, key in (
        ("account", "finance", "accounts"),
        ("qos", "high", "qos"),
        ("user-id", "0", "users"),
    ):
        pod = pod_manifest()
        pod["metadata"]["annotations"] = {SLURMJOB_PREFIX + short: value}
        text = await denied(dry_run_create(bridge.kube, ns, pod))
        assert f"{SLURMJOB_PREFIX}{short}: {value!r} is not allowed" in text, text
        assert f"config policy.namespaces.{ns}.{key}" in text, text
