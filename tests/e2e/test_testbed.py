"""The test bed itself: real apiserver + controller manager + scheduler, kwok, the process
kubelet, and Slurm with JWT."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx2
import jwt
import pytest

from slinky.kube import rest
from slinky_testbed import paths, procs
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
            "containers": [{"name": "main", "image": "process", "command": command}],
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
                    "containers": [{"name": "c", "image": "process", "command": ["sleep", "3600"]}]
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


async def test_ordinary_pods_land_on_process_nodes(kube: rest.Kube, namespace: str) -> None:
    await kube.create(rest.PODS, pod("plain", ["sleep", "300"]), namespace)

    async def bound() -> str:
        got = await kube.get(rest.PODS, "plain", namespace)
        return str(got["spec"].get("nodeName", ""))

    node = await wait_for(bound, timeout=30, what="pod scheduled")
    assert node.startswith("proc-")


async def test_process_pod_exit_code_and_failed_phase(kube: rest.Kube, namespace: str) -> None:
    await kube.create(rest.PODS, pod("exit3", ["sh", "-c", "exit 3"]), namespace)

    async def failed() -> JSON | None:
        got = await kube.get(rest.PODS, "exit3", namespace)
        return got if (got.get("status") or {}).get("phase") == "Failed" else None

    got = await wait_for(failed, timeout=30, what="pod Failed")
    state = got["status"]["containerStatuses"][0]["state"]
    assert state["terminated"]["exitCode"] == 3


async def test_process_pod_restart_policy_restarts_and_succeeds(
    kube: rest.Kube, namespace: str
) -> None:
    # Fails on its first run only (a marker file survives in the shared root), then exits 0.
    marker = f"/tmp/{namespace}-once"
    cmd = [
        "sh",
        "-c",
        f"if [ -e {marker} ]; then rm {marker}; exit 0; else touch {marker}; exit 1; fi",
    ]
    await kube.create(rest.PODS, pod("flaky", cmd, restart="OnFailure"), namespace)

    async def succeeded() -> JSON | None:
        got = await kube.get(rest.PODS, "flaky", namespace)
        return got if (got.get("status") or {}).get("phase") == "Succeeded" else None

    got = await wait_for(succeeded, timeout=30, what="pod Succeeded after one restart")
    assert got["status"]["containerStatuses"][0]["restartCount"] == 1


async def test_slurmd_pod_registers_idle_and_prestop_runs_on_delete(
    kube: rest.Kube, slurm: SlurmRest, testbed: Testbed, namespace: str
) -> None:
    name = f"sd-{namespace[-6:]}"
    ctld = testbed.slurmctld_addr
    spec = pod(
        name,
        [
            "slurmd",
            "-Z",
            "-N",
            name,
            "--conf-server",
            ctld,
            "--conf",
            "CPUs=2 RealMemory=1000 Features=e2e",
        ],
        restart="Always",
    )
    spec["spec"]["containers"][0]["lifecycle"] = {
        "preStop": {
            "exec": {
                "command": [
                    "scontrol",
                    "update",
                    f"nodename={name}",
                    "state=down",
                    "reason=e2e: pod terminating",
                ]
            }
        }
    }
    await kube.create(rest.PODS, spec, namespace)

    async def idle() -> JSON | None:
        node = await slurm.node(name)
        return node if node and "IDLE" in node["state"] else None

    node = await wait_for(idle, timeout=60, what=f"Slurm node {name} IDLE")
    assert "e2e" in node["features"]

    async def container_id() -> str:
        got = await kube.get(rest.PODS, name, namespace)
        statuses = (got.get("status") or {}).get("containerStatuses") or []
        return str(statuses[0].get("containerID", "")) if statuses else ""

    cid = await wait_for(container_id, timeout=10, what="containerID in pod status")
    pid = int(cid.removeprefix("process://"))
    proc = procs.Proc.of(pid)
    assert "slurmd" in Path(f"/proc/{pid}/cmdline").read_text()

    await kube.delete(rest.PODS, name, namespace)

    async def gone() -> bool:
        try:
            await kube.get(rest.PODS, name, namespace)
        except rest.ApiError as e:
            return e.not_found
        return False

    await wait_for(gone, timeout=30, what="pod finalized")
    node = await slurm.node(name)
    assert node is not None and "DOWN" in node["state"], node
    assert node["reason"] == "e2e: pod terminating"
    assert not proc.alive()
    await slurm.call("DELETE", f"node/{name}")


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


async def test_second_testbed_runs_beside_and_teardown_leaves_no_process(
    tmp_path_factory: pytest.TempPathFactory, testbed: Testbed
) -> None:
    """Free ports per test bed, and `down` stops every PID it started (pods' included)."""
    bed = Testbed(
        Path(os.environ.get("SLINKY_E2E_SECOND_DIR", paths.cache_dir() / "testbeds" / "e2e-2"))
    )
    if bed.status_lines(only_running=True):
        bed.down(log=print)
    bed.up(process_nodes=1, kwok_nodes=0, log=print)
    try:
        assert set(bed.load().ports.values()).isdisjoint(testbed.load().ports.values())
        kube = rest.Kube.from_kubeconfig(bed.kubeconfig)
        try:
            await kube.create(rest.PODS, pod("sleeper", ["sleep", "600"]), "default")

            async def running() -> bool:
                got = await kube.get(rest.PODS, "sleeper", "default")
                return (got.get("status") or {}).get("phase") == "Running"

            await wait_for(running, timeout=30, what="sleeper Running")
        finally:
            await kube.close()
        tracked = [p for _, p in bed.tracked_processes(bed.load())]
        assert any(name.startswith("pod:") for name, _ in bed.tracked_processes(bed.load()))
    finally:
        bed.down(log=print)
    assert tracked and not [p.pid for p in tracked if p.alive()]
    assert not bed.status_lines(only_running=True)
    assert f" {bed.root}/proc " not in Path("/proc/mounts").read_text()
