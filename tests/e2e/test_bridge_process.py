"""The `slurm-bridge` process: a bad config stops start-up naming the key, components are
chosen by flag and run apart (the webhook needs no Slurm settings), each leader-elected
component has its own Lease, SIGTERM exits cleanly and releases it."""

from __future__ import annotations

import contextlib
import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx2
import pytest
import yaml

from slinky.bridge.labels import EXTERNAL_NODE
from slinky.bridge.nodes.registration import registered_for
from slinky.kube import rest
from slinky.kube.conditions import now_micro
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import WaitTimeout, wait_for
from tests.e2e.bridge_fixtures import (
    BRIDGE_NS,
    BridgeEnv,
    bridge_kubeconfig,
    issue_serving_cert,
    make_ca,
    rbac_denials,
    start_bridge,
    wait_ready,
    wait_slurm_node,
)

pytestmark = pytest.mark.e2e

DUMMY_KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [{"name": "u", "user": {"token": "x"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "c",
}


def run_bridge(tmp_path: Path, config: object, *flags: str) -> subprocess.CompletedProcess[str]:
    cfg = tmp_path / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(DUMMY_KUBECONFIG))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("SLURM_JWT", None)
    return subprocess.run(
        [
            sys.executable, "-m", "slinky.bridge.main", f"--config={cfg}",
            f"--kubeconfig={kubeconfig}", "--metrics-bind-address=0",
            "--health-probe-bind-address=0", *flags,
        ],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip


def test_a_bad_config_stops_start_up_naming_the_key(tmp_path: Path) -> None:
    out = run_bridge(tmp_path, {"managedNodeTaint": {"effect": "NoRun"}})
    assert out.returncode == 2, out.stderr
    assert "managedNodeTaint.effect: must be one of NoExecute, NoSchedule" in out.stderr

    out = run_bridge(tmp_path, {"schedulerNmae": "x"})
    assert out.returncode == 2, out.stderr
    assert "schedulerNmae: unknown key; did you mean 'schedulerName'?" in out.stderr


def test_the_node_controller_refuses_to_start_without_slurm_settings(tmp_path: Path) -> None:
    out = run_bridge(tmp_path, {"managedNamespaces": ["a"]}, "--components=nodes")
    assert out.returncode == 2, out.stderr
    assert "slurmRestApi: required by the node controller" in out.stderr


def test_an_unknown_component_is_refused(tmp_path: Path) -> None:
    out = run_bridge(tmp_path, {}, "--components=admission,schedular")
    assert out.returncode == 2
    assert (
        "unknown component 'schedular' (available: all, admission, nodes, scheduler, workload)"
        in out.stderr
    )


async def test_the_webhook_runs_alone_with_a_namespace_selector_and_no_slurm_settings(
    kube: rest.Kube, testbed: Testbed, namespace: str, tmp_path: Path
) -> None:
    make_ca(tmp_path / "ca")
    issue_serving_cert(tmp_path / "ca", tmp_path / "certs")
    label = "e2e.slinky.slurm.net/bridge-managed"
    config = tmp_path / "config.yaml"
    config.write_text(
        yaml.safe_dump({"managedNamespaceSelector": {"matchLabels": {label: namespace}}})
    )
    kubeconfig = await bridge_kubeconfig(kube, testbed, tmp_path / "kubeconfig")
    bridge = start_bridge(
        kubeconfig, config, tmp_path / "certs", tmp_path / "bridge.log", "--components=admission"
    )
    ca = ssl.create_default_context(cafile=str(tmp_path / "ca" / "ca.crt"))

    async def mutate(ns: str) -> dict[str, object]:
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"u-{ns}",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE",
                "namespace": ns,
                "object": {"metadata": {"name": "p"}, "spec": {"containers": []}},
            },
        }
        async with httpx2.AsyncClient(verify=ca, timeout=10) as http:
            resp = await http.post(
                f"https://127.0.0.1:{bridge.webhook_port}/mutate-v1-pod", json=review
            )
        answer: dict[str, object] = resp.json()["response"]
        assert answer["uid"] == f"u-{ns}" and answer["allowed"]
        return answer

    try:
        await wait_ready(bridge)
        assert "patch" not in await mutate(namespace)  # not labelled (yet)
        await kube.patch(rest.NAMESPACES, namespace, {"metadata": {"labels": {label: namespace}}})

        async def managed_now() -> bool:
            return (await mutate(namespace)).get("patchType") == "JSONPatch"

        await wait_for(managed_now, timeout=30, what=f"namespace {namespace} managed by label")
    finally:
        code = bridge.stop()
    assert code == 0, bridge.log_tail()
    assert "components admission," in bridge.log_path.read_text()
    assert not rbac_denials(bridge.log_path)


async def test_a_second_replica_waits_for_the_node_controller_lease_then_takes_over(
    bridge: BridgeEnv,
) -> None:
    env = bridge
    second = start_bridge(
        env.work / "kubeconfig",
        env.work / "config.yaml",
        env.cert_dir,
        env.work / "second.log",
        "--components=nodes",
    )
    try:
        await wait_ready(second)  # a standby is ready: it waits for the Lease
        assert "slurm-bridge-e2e-nodes: " in second.log_path.read_text()
        assert "acquired the lease" not in second.log_path.read_text()
        assert env.bridge.stop() == 0  # releases the Lease

        def took_over() -> bool:
            return "acquired the lease" in second.log_path.read_text()

        await wait_for(took_over, timeout=30, what="the second replica acquiring the Lease")
        name = await env.create_node(labels={EXTERNAL_NODE: "true"})
        await wait_slurm_node(
            env,
            name,
            lambda n: n is not None and registered_for(n) == name,
            f"slurm node {name} registered by the second replica",
        )
    finally:
        code = second.stop()
        await env.bridge.restart()
    assert code == 0, second.log_tail()


async def test_a_replica_whose_leases_are_taken_exits_1_promptly_to_be_restarted(
    bridge: BridgeEnv,
) -> None:
    """Losing a Lease (here: another holder writes it, as after an apiserver outage longer
    than the renew deadline) stops every component and ends the process with exit 1, within
    its graceful-shutdown timeout: the kubelet restarts it clean. A replica that lingers
    instead holds no Lease and schedules nothing (CI once saw one outlive SIGTERM)."""
    env = bridge
    election = f"slurm-bridge-lost-{env.managed_namespace[-6:]}"
    replica = start_bridge(
        env.work / "kubeconfig",
        env.work / "config.yaml",
        env.cert_dir,
        env.work / "lost.log",
        f"--leader-election-id={election}",
        lease=("4s", "3s"),
    )
    leases = [f"{election}-{c}" for c in ("nodes", "scheduler", "workload")]
    try:
        await wait_ready(replica)

        def leading() -> bool:
            return replica.log_path.read_text().count("acquired the lease") == len(leases)

        await wait_for(leading, timeout=60, what="the replica leading its three components")
        for name in leases:
            lease = await env.kube.get(rest.LEASES, name, BRIDGE_NS)
            lease["spec"].update(
                {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600,
                 "renewTime": now_micro()}
            )  # fmt: skip
            await env.kube.request("PUT", rest.LEASES.path(BRIDGE_NS, name), body=lease)

        def exited() -> bool:
            return replica.proc.poll() is not None

        try:
            await wait_for(exited, timeout=60, what="the replica exiting after losing its Leases")
        except WaitTimeout:
            replica.stop(timeout=0.1)  # raises with where it hangs
        assert replica.proc.returncode == 1, replica.log_tail()
        assert "lost leadership; exiting" in replica.log_tail(5)
        assert not rbac_denials(replica.log_path)
    finally:
        if replica.proc.poll() is None:
            replica.proc.kill()
        for name in leases:
            with contextlib.suppress(rest.ApiError):
                await env.kube.delete(rest.LEASES, name, BRIDGE_NS)
