"""The JobSet and LeaderWorkerSet controllers of pinned releases (built by
hack/build-groups.sh into ~/.cache/slinky/bin, their CRDs and webhook manifests next to
them), run as processes against the test bed's apiserver, so the pods of the gang tests are
made by the controllers users run.

Both need their admission webhooks (LeaderWorkerSet's pod webhook writes the group labels,
JobSet's defaulting webhook fills the spec): each serves on loopback with a certificate of a
CA made here, and its webhook configurations are registered with `clientConfig.url` and
scoped to the one namespace the tests use (their pod webhooks also to their own pods), so no
other test's pods go through them. Leader election and the metrics servers are off; the
controllers talk to the apiserver as the test bed's admin, as infrastructure, not as the
system under test.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from slinky.kube import rest
from slinky_testbed import paths, procs
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for
from tests.e2e.bridge_fixtures import (
    BridgeEnv,
    issue_serving_cert,
    make_ca,
    register_webhooks,
    unregister_webhooks,
)

JSON = dict[str, Any]
JOBSET_VERSION = "v0.11.0"
LWS_VERSION = "v0.8.0"
# The label each controller's pod webhooks select on (as their releases' kustomize patches do).
POD_LABEL = {"jobset": "jobset.sigs.k8s.io/jobset-name", "lws": "leaderworkerset.sigs.k8s.io/name"}
CONFIG_API = {"jobset": "config.jobset.x-k8s.io/v1alpha1", "lws": "config.lws.x-k8s.io/v1alpha1"}


@dataclass
class GroupController:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    webhooks: list[str]

    def log_tail(self, n: int = 40) -> str:
        return procs.log_tail(self.log_path, n)


def binary(name: str, version: str) -> Path:
    path = paths.bin_dir() / f"{name}-controller"
    stamp = paths.bin_dir() / f".{name}-controller.version"
    if not path.exists() or not stamp.exists() or stamp.read_text().strip() != version:
        pytest.fail(
            f"{path} {version} not built: run `bash hack/build-groups.sh` (make testbed-build)"
        )
    return path


def manifests_dir(name: str, version: str) -> Path:
    return paths.cache_dir() / "groups" / f"{name}-{version}"


def webhook_configurations(
    name: str, version: str, *, instance: str, port: int, ca: bytes, namespace: str
) -> list[JSON]:
    """The release's webhook configurations, pointed at the process on loopback and scoped
    to `namespace` (pod webhooks: to the controller's own pods)."""
    out = []
    for doc in yaml.safe_load_all((manifests_dir(name, version) / "webhooks.yaml").read_text()):
        if not doc:
            continue
        doc["metadata"] = {"name": f"{instance}-{doc['metadata']['name']}"}
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca).decode(),
            }
            hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            if any("pods" in r.get("resources", []) for r in hook.get("rules", [])):
                hook["objectSelector"] = {
                    "matchExpressions": [{"key": POD_LABEL[name], "operator": "Exists"}]
                }
        out.append(doc)
    return out


async def install_crd(kube: rest.Kube, name: str, version: str) -> None:
    crd = yaml.safe_load((manifests_dir(name, version) / "crd.yaml").read_text())
    await kube.apply(rest.CRDS, crd, field_manager="slinky-e2e")

    async def established() -> bool:
        got = await kube.get(rest.CRDS, crd["metadata"]["name"])
        conds = (got.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

    await wait_for(established, timeout=60, what=f"CRD {crd['metadata']['name']} established")


async def start(
    kube: rest.Kube, testbed: Testbed, work: Path, name: str, *, version: str, namespace: str
) -> GroupController:
    exe = binary(name, version)
    await install_crd(kube, name, version)
    certs = work / f"{name}-certs"
    make_ca(work / f"{name}-ca")
    issue_serving_cert(work / f"{name}-ca", certs)
    webhook_port, probe_port = procs.free_ports(2)
    config = {
        "apiVersion": CONFIG_API[name],
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(certs)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
    }
    config_path = work / f"{name}-config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    log_path = work / f"{name}.log"
    logf = open(log_path, "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(
        [str(exe), f"--config={config_path}", f"--kubeconfig={testbed.kubeconfig}"],
        stdout=logf,
        stderr=subprocess.STDOUT,
        env={**os.environ, "KUBECONFIG": str(testbed.kubeconfig), "NAMESPACE": namespace},
    )
    logf.close()
    controller = GroupController(name, proc, log_path, [])

    async def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(
                f"{name} controller exited {proc.returncode}:\n{controller.log_tail()}"
            )
        async with httpx2.AsyncClient(timeout=2) as http:
            if (await http.get(f"http://127.0.0.1:{probe_port}/readyz")).status_code != 200:
                return False
        # readyz does not cover the webhook server: a webhook registered before it listens
        # refuses the apiserver ("connection refused") and the object is not created.
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", webhook_port)
        except OSError:
            return False
        writer.close()
        return True

    try:
        await wait_for(
            ready, timeout=120, what=f"{name} controller ready", ignore=(httpx2.HTTPError,)
        )
        configurations = webhook_configurations(
            name,
            version,
            instance=f"slinky-e2e-{name}-{namespace[-6:]}",
            port=webhook_port,
            ca=(work / f"{name}-ca" / "ca.crt").read_bytes(),
            namespace=namespace,
        )
        controller.webhooks = [c["metadata"]["name"] for c in configurations]
        await register_webhooks(kube, configurations)
    except BaseException:
        await stop(kube, controller)  # never left running by a failed start
        raise
    return controller


async def stop(kube: rest.Kube, controller: GroupController) -> None:
    for name in controller.webhooks:
        await unregister_webhooks(kube, name)
    if controller.proc.poll() is None:
        controller.proc.send_signal(signal.SIGTERM)
        try:
            controller.proc.wait(30)
        except subprocess.TimeoutExpired:
            controller.proc.kill()
            controller.proc.wait(10)


@dataclass
class GroupControllers:
    jobset: GroupController
    lws: GroupController


@pytest.fixture(scope="module")
async def group_controllers(
    bridge_env: BridgeEnv, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[GroupControllers]:
    """Both controllers for one module, their webhooks scoped to the bridge's managed
    namespace."""
    env = bridge_env
    work = tmp_path_factory.mktemp("group-controllers")
    ns = env.managed_namespace
    started: list[GroupController] = []
    try:
        for name, version in (("jobset", JOBSET_VERSION), ("lws", LWS_VERSION)):
            started.append(
                await start(env.kube, env.testbed, work, name, version=version, namespace=ns)
            )
        yield GroupControllers(*started)
    finally:
        for controller in started:
            with contextlib.suppress(rest.ApiError):
                await stop(env.kube, controller)
