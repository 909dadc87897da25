"""The test bed itself: real apiserver + controller manager + scheduler, kwok, real nodes, and
Slurm with JWT. (Real nodes' own tests are in test_real_nodes.py.)"""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import httpx2
import jwt
import pytest

from slinky.kube import rest
from slinky_testbed import nodes
from slinky_testbed.bed import Testbed
from slinky_testbed.slurmrest import SlurmRest
from slinky_testbed.waiting import wait_for

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]


def pod(name: str, command: list[str], *, restart: str = "Never", **spec: Any) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": restart,
            "terminationGracePeriodSeconds": 10,
            "containers": [
                {
                    "name": "main",
                    "image": nodes.image_ref("slurm"),
                    "imagePullPolicy": "IfNotPresent",
                    "command": command,
                }
            ],
            **spec,
        },
    }


async def test_apiserver_reports_its_real_version(kube: rest.Kube) -> None:
    version = await kube.request("GET", "/version")
    assert version["gitVersion"].startswith("v1.")
    assert version["gitVersion"] != "v0.0.0"
    assert version["major"] == "1"


async def test_crd_and_deployment_with_gc_by_controller_manager(
    kube: rest.Kube, namespace: str
) -> None:
    crd = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{namespace}.example.com"},
        "spec": {
            "group": f"{namespace}.example.com",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }
    await kube.create(rest.CRDS, crd)
    widgets = rest.Resource(f"{namespace}.example.com", "v1", "widgets", "Widget")

    async def established() -> bool:
        got = await kube.get(rest.CRDS, crd["metadata"]["name"])
        conds = (got.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    await wait_for(established, timeout=30, what="CRD established")
    await wait_for(
        lambda: kube.create(
            widgets,
            {"apiVersion": widgets.api_version, "kind": "Widget", "metadata": {"name": "w"}},
            namespace,
        ),
        timeout=30,
        what="create a Widget",
        ignore=(rest.ApiError,),
    )

    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "image": nodes.image_ref("slurm"),
                            "command": ["sleep", "3600"],
                        }
                    ]
                },
            },
        },
    }
    created = await kube.create(rest.DEPLOYMENTS, deploy, namespace)

    async def replicasets() -> list[JSON]:
        items = (await kube.list(rest.REPLICASETS, namespace))["items"]
        return [
            rs
            for rs in items
            if any(
                o["uid"] == created["metadata"]["uid"]
                for o in rs["metadata"].get("ownerReferences") or []
            )
        ]

    await wait_for(replicasets, timeout=30, what="ReplicaSet created by the deployment controller")
    await kube.delete(rest.DEPLOYMENTS, "web", namespace, propagation="Background")

    async def collected() -> bool:
        return not await replicasets()

    await wait_for(collected, timeout=60, what="ReplicaSet garbage-collected")
    await kube.delete(rest.CRDS, crd["metadata"]["name"])


async def test_hundred_pods_on_kwok_nodes_reach_running(kube: rest.Kube, namespace: str) -> None:
    spec = {
        "nodeSelector": {"testbed.slinky.slurm.net/kubelet": "kwok"},
        "tolerations": [
            {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}
        ],
    }
    for i in range(100):
        await kube.create(
            rest.PODS, pod(f"fake-{i}", ["true"], restart="Always", **spec), namespace
        )

    async def running() -> bool:
        items = (await kube.list(rest.PODS, namespace))["items"]
        return sum(1 for p in items if p.get("status", {}).get("phase") == "Running") == 100

    await wait_for(running, timeout=120, interval=0.5, what="100 kwok pods Running")
    items = (await kube.list(rest.PODS, namespace))["items"]
    assert {p["spec"]["nodeName"] for p in items} <= {"kwok-0", "kwok-1"}


async def test_ordinary_pods_land_on_real_nodes(
    kube: rest.Kube, testbed: Testbed, namespace: str
) -> None:
    await kube.create(rest.PODS, pod("plain", ["sleep", "300"]), namespace)

    async def bound() -> str:
        got = await kube.get(rest.PODS, "plain", namespace)
        return str(got["spec"].get("nodeName", ""))

    node = await wait_for(bound, timeout=30, what="pod scheduled")
    assert node in testbed.load().real_nodes


async def test_restart_policy_restarts_a_failed_container_until_it_succeeds(
    kube: rest.Kube, namespace: str
) -> None:
    # Fails on its first run only (a marker in an emptyDir survives the restart), then exits 0.
    cmd = ["sh", "-c", "if [ -e /m/once ]; then exit 0; else touch /m/once; exit 1; fi"]
    spec = pod("flaky", cmd, restart="OnFailure", volumes=[{"name": "m", "emptyDir": {}}])
    spec["spec"]["containers"][0]["volumeMounts"] = [{"name": "m", "mountPath": "/m"}]
    await kube.create(rest.PODS, spec, namespace)

    async def succeeded() -> JSON | None:
        got = await kube.get(rest.PODS, "flaky", namespace)
        return got if (got.get("status") or {}).get("phase") == "Succeeded" else None

    got = await wait_for(succeeded, timeout=90, what="pod Succeeded after one restart")
    assert got["status"]["containerStatuses"][0]["restartCount"] == 1


async def test_slurm_ping_with_jwt_and_bad_token_is_refused(
    testbed: Testbed, slurm: SlurmRest
) -> None:
    status, body = await slurm.call("GET", "ping")
    assert status == 200
    assert body["pings"][0]["pinged"] == "UP"
    async with httpx2.AsyncClient(base_url=testbed.slurm_rest_url, timeout=20) as http:
        # No token at all: slurmrestd itself answers 401.
        resp = await http.get("/slurm/v0.0.44/nodes", headers={"X-SLURM-USER-NAME": "root"})
        assert resp.status_code == 401
        # A token signed with another key: slurmctld refuses it; slurmrestd 26.05 reports
        # that as HTTP 511 with Slurm error 1007 (Protocol authentication error).
        bad = jwt.encode({"sun": "root", "iat": 0, "exp": 2**31}, b"not-the-key" * 3, "HS256")
        resp = await http.get(
            "/slurm/v0.0.44/nodes", headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": bad}
        )
        assert resp.status_code in (401, 511)
        assert [e["error_number"] for e in resp.json()["errors"]] == [1007]


def test_env_prints_what_a_shell_needs(testbed: Testbed) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "slinky_testbed.cli", "testbed", "--dir", str(testbed.dir), "env"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    for var in ("KUBECONFIG", "SLURM_REST_URL", "SLURM_JWT", "SLURM_JWT_KEY", "SLURMCTLD_ADDR"):
        assert f"export {var}=" in out


async def test_a_crashed_scheduler_or_controller_manager_is_started_again_and_works(
    kube: rest.Kube, testbed: Testbed, namespace: str
) -> None:
    """What a kubelet does for static pods, the soak's supervisor does through this (the
    kube-scheduler exits by design when it finds its cache corrupted, which an apiserver
    kill -9 under a Binding can cause)."""
    for name in ("scheduler", "kcm"):
        testbed.kill_component(name)
        testbed.start_component(name)
    await kube.create(rest.PODS, pod("after-restart", ["sleep", "300"]), namespace)

    async def bound() -> str:
        got = await kube.get(rest.PODS, "after-restart", namespace)
        return str(got["spec"].get("nodeName", ""))

    assert await wait_for(bound, timeout=60, what="pod scheduled by the new kube-scheduler")
