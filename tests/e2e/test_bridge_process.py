"""The `slurm-bridge` process: a bad config stops start-up naming the key, components are
chosen by flag and run apart (the webhook needs no Slurm settings), SIGTERM exits cleanly."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from pathlib import Path

import httpx2
import yaml

from slinky.kube import rest
from slinky_testbed.bed import Testbed
from tests.e2e.bridge_fixtures import (
    bridge_kubeconfig,
    issue_serving_cert,
    make_ca,
    rbac_denials,
    start_bridge,
    wait_ready,
)

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
    assert "unknown component 'schedular' (available: all, admission, nodes)" in out.stderr


async def test_the_webhook_runs_alone_without_slurm_settings(
    kube: rest.Kube, testbed: Testbed, tmp_path: Path
) -> None:
    make_ca(tmp_path / "ca")
    issue_serving_cert(tmp_path / "ca", tmp_path / "certs")
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"managedNamespaces": ["alone"]}))
    kubeconfig = await bridge_kubeconfig(kube, testbed, tmp_path / "kubeconfig")
    bridge = start_bridge(
        kubeconfig, config, tmp_path / "certs", tmp_path / "bridge.log", "--components=admission"
    )
    try:
        await wait_ready(bridge)
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "operation": "CREATE",
                "namespace": "alone",
                "object": {"metadata": {"name": "p"}, "spec": {"containers": []}},
            },
        }
        ca = ssl.create_default_context(cafile=str(tmp_path / "ca" / "ca.crt"))
        async with httpx2.AsyncClient(verify=ca, timeout=10) as http:
            resp = await http.post(
                f"https://127.0.0.1:{bridge.webhook_port}/mutate-v1-pod", json=review
            )
        answer = resp.json()["response"]
        assert answer["uid"] == "u-1" and answer["allowed"] and answer["patchType"] == "JSONPatch"
    finally:
        code = bridge.stop()
    assert code == 0, bridge.log_tail()
    assert "components admission," in bridge.log_path.read_text()
    assert not rbac_denials(bridge.log_path)
