"""Fixtures for slurm-bridge tests: the bridge running as a process with a ServiceAccount
token bound to config/rbac/bridge_*.yaml (not as cluster admin), its webhook registered with
the real apiserver (a CA made here, `clientConfig.url` on loopback), and Node objects the
tests create themselves (so no other test's pods are ever evicted by the managed-node taint).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from slinky.bridge.admission import manifests
from slinky.bridge.config import parse_config
from slinky.kube import rest
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.models import Node
from slinky.slurm.tokens import MintedToken
from slinky_testbed import paths, pki, procs
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for
from tests.e2e.operator_fixtures import RBAC_RES, apply_file, soon_after

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
BRIDGE_NS = "slinky-system"
SCHEDULER = "slurm-bridge-scheduler"
PARTITION = "slurm-bridge"
MUTATING = rest.Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
VALIDATING = rest.Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingwebhookconfigurations",
    "ValidatingWebhookConfiguration",
    namespaced=False,
)


# ---------------------------------------------------------------- certificates


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(directory: Path) -> Path:
    """A fresh CA in `directory` (ca.key, ca.crt) for the webhook's serving certificate."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("genrsa", "-out", "ca.key", "2048", cwd=directory)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "30",
        "-subj", "/CN=slurm-bridge-e2e-ca", "-out", "ca.crt", cwd=directory,
    )  # fmt: skip
    return directory / "ca.crt"


def issue_serving_cert(ca_dir: Path, out_dir: Path) -> None:
    """A new loopback serving certificate from the CA in `ca_dir`, written to out_dir as
    tls.crt/tls.key by rename, as a Secret volume update would."""
    for stale in ("webhook.crt", "webhook.key"):
        (ca_dir / stale).unlink(missing_ok=True)
    crt, key = pki.serving_cert(ca_dir, "webhook", ["127.0.0.1", "localhost"])
    out_dir.mkdir(parents=True, exist_ok=True)
    for src, name in ((key, "tls.key"), (crt, "tls.crt")):
        tmp = out_dir / f".{name}.tmp"
        tmp.write_bytes(src.read_bytes())
        tmp.replace(out_dir / name)


# ---------------------------------------------------------------- the bridge process


@dataclass
class BridgeProcess:
    proc: subprocess.Popen[bytes]
    argv: list[str]
    env: dict[str, str]
    log_path: Path
    probe_url: str
    metrics_url: str
    webhook_port: int

    def log_tail(self, n: int = 60, contains: str | None = None) -> str:
        return procs.log_tail(self.log_path, n, contains)

    def stop(self, timeout: float = 40) -> int:
        return procs.terminate(self.proc, self.log_path, timeout)

    def lost_leadership(self) -> bool:
        """Exited because the apiserver was unreachable past the renew deadline (another
        test restarts the apiserver): by design, as a pod would, to be restarted."""
        return self.proc.poll() == 1 and "lost leadership; exiting" in self.log_tail(5)

    async def restart(self) -> None:
        logf = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT, env=self.env)
        logf.close()
        await wait_ready(self)

    def metric_sum(self, name: str, *label_parts: str) -> float:
        """The sum of a metric's samples whose labels contain every one of `label_parts`."""
        total = 0.0
        for line in httpx2.get(f"{self.metrics_url}/metrics", timeout=5).text.splitlines():
            if line.startswith(name + "{") and all(p in line for p in label_parts):
                total += float(line.rsplit(" ", 1)[1])
        return total


async def bridge_kubeconfig(kube: rest.Kube, testbed: Testbed, path: Path) -> Path:
    """A kubeconfig holding a TokenRequest token of the bridge's ServiceAccount."""
    with contextlib.suppress(rest.ApiError):
        await kube.create(rest.NAMESPACES, {"metadata": {"name": BRIDGE_NS}})
    for f in (
        "bridge_role.yaml",
        "bridge_leader_election_role.yaml",
        "bridge_service_account.yaml",
    ):
        await apply_file(kube, REPO / "config" / "rbac" / f)
    tr = await kube.request(
        "POST",
        RBAC_RES["ServiceAccount"].path(BRIDGE_NS, "slurm-bridge", "token"),
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 24 * 3600},
        },
    )
    admin = yaml.safe_load(testbed.kubeconfig.read_text())
    admin["users"] = [{"name": "slurm-bridge", "user": {"token": tr["status"]["token"]}}]
    admin["contexts"][0]["context"]["user"] = "slurm-bridge"
    path.write_text(yaml.safe_dump(admin))
    return path


# What the e2e tests' pods may ask of Slurm in the managed namespaces: jobs run as nobody
# (the default's first user), or as www-data (uid 33, in the test bed's Slurm root) when a pod
# asks with the user-id annotation; the partition that does not exist is allowed so that
# Slurm's own refusal of it is seen.
E2E_RULE: JSON = {
    "users": ["65534", "33"],
    "groups": ["65534", "33"],
    "accounts": ["physics"],
    "partitions": ["no-such-part"],
    "allowPriority": True,
}


TEST_CONDITION = "SlinkyTestProblem"


def bridge_config(testbed: Testbed, managed: list[str], **overrides: Any) -> JSON:
    config: JSON = {
        "schedulerName": SCHEDULER,
        "slurmRestApi": testbed.slurm_rest_url,
        "managedNamespaces": managed,
        "partition": PARTITION,
        "slurmAuth": {"jwtKeyFile": str(testbed.jwt_key_path), "user": "root"},
        "slurmPollInterval": "500ms",
        "policy": {"namespaces": dict.fromkeys(managed, E2E_RULE)},
        # NotReady drains too (the default); this condition as Node Problem Detector's would.
        "nodeHealth": {"conditions": [TEST_CONDITION]},
    }
    config.update(overrides)
    return config


def start_bridge(
    kubeconfig: Path,
    config: Path,
    cert_dir: Path,
    log_path: Path,
    *extra: str,
    lease: tuple[str, str] = ("12s", "9s"),
) -> BridgeProcess:
    mport, pport, wport = procs.free_ports(3)
    argv = [
        sys.executable,
        "-m",
        "slinky.bridge.main",
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--namespace={BRIDGE_NS}",
        f"--metrics-bind-address=127.0.0.1:{mport}",
        f"--health-probe-bind-address=127.0.0.1:{pport}",
        f"--webhook-bind-address=127.0.0.1:{wport}",
        f"--webhook-cert-path={cert_dir}",
        "--webhook-cert-reload-interval=500ms",
        "--leader-election-id=slurm-bridge-e2e",
        # A renewal may take seconds on a loaded 2-core machine; a replica that takes over
        # does so when the Lease is released on SIGTERM, not by waiting for it to expire.
        f"--leader-election-lease-duration={lease[0]}",
        f"--leader-election-renew-deadline={lease[1]}",
        "--leader-election-retry-period=1s",
        "--log-level=debug",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("SLURM_JWT", None)
    logf = open(log_path, "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env)
    logf.close()
    return BridgeProcess(
        proc,
        argv,
        env,
        log_path,
        f"http://127.0.0.1:{pport}",
        f"http://127.0.0.1:{mport}",
        wport,
    )


async def wait_ready(bridge: BridgeProcess) -> None:
    async def ready() -> bool:
        if bridge.proc.poll() is not None:
            raise AssertionError(f"bridge exited {bridge.proc.returncode}:\n{bridge.log_tail()}")
        async with httpx2.AsyncClient(timeout=2) as http:
            return (await http.get(f"{bridge.probe_url}/readyz")).status_code == 200

    await wait_for(ready, timeout=90, what="bridge /readyz", ignore=(httpx2.HTTPError,))


def rbac_denials(log_path: Path, apiserver_restarts: list[float] | None = None) -> list[str]:
    """Denials in a text log, less those in the minute after an apiserver restart (the new
    apiserver's RBAC cache is still filling; clients retry)."""
    return [
        line
        for line in log_path.read_text().splitlines()
        if 'User "system:serviceaccount:' in line
        and "cannot" in line
        and not soon_after(line, apiserver_restarts or [], window_s=60)
    ]


# ---------------------------------------------------------------- the environment


@dataclass
class BridgeEnv:
    kube: rest.Kube
    slurm: SlurmClient
    testbed: Testbed
    bridge: BridgeProcess
    managed_namespace: str
    # Managed too, but no webhook covers it: its pods name the scheduler and tolerate the
    # managed nodes themselves (and can be created while the bridge, webhook included, is
    # stopped or killed).
    direct_namespace: str
    ca_dir: Path
    cert_dir: Path
    work: Path
    nodes: list[str] = field(default_factory=list)

    def kubectl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [str(paths.bin_dir() / "kubectl"), f"--kubeconfig={self.testbed.kubeconfig}", *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        if check and out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{out.stderr}")
        return out

    async def slurm_node(self, name: str) -> Node | None:
        try:
            return await self.slurm.get_node(name)
        except errors.SlurmNotFound:
            return None

    async def create_node(
        self,
        *,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        cpu: str = "4",
        memory: str = "8Gi",
        address: str = "127.0.0.1",
    ) -> str:
        """A Node object with allocatable resources and an InternalIP, and no kubelet:
        nothing runs there, so the taints the tests cause evict nobody."""
        name = f"bridge-e2e-{uuid.uuid4().hex[:6]}"
        self.nodes.append(name)
        await self.kube.create(
            rest.NODES,
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "labels": labels or {},
                    "annotations": annotations or {},
                },
            },
        )
        await self.set_allocatable(name, cpu=cpu, memory=memory, address=address)
        return name

    async def set_allocatable(self, name: str, *, cpu: str, memory: str, address: str) -> None:
        resources = {"cpu": cpu, "memory": memory, "pods": "110"}
        await self.kube.patch(
            rest.NODES,
            name,
            {
                "status": {
                    "capacity": resources,
                    "allocatable": resources,
                    "addresses": [
                        {"type": "InternalIP", "address": address},
                        {"type": "Hostname", "address": name},
                    ],
                }
            },
            subresource="status",
        )

    async def node(self, name: str) -> JSON:
        return await self.kube.get(rest.NODES, name)

    async def taint_values(self, name: str) -> list[str]:
        node = await self.node(name)
        return [
            f"{t.get('value')}:{t.get('effect')}"
            for t in (node.get("spec") or {}).get("taints") or []
            if t.get("key") == "slinky.slurm.net/managed-node"
        ]

    async def events_for(self, name: str, reason: str) -> list[JSON]:
        """Events about a Node (cluster-scoped objects' events live in `default`)."""
        items = (await self.kube.list(rest.EVENTS, "default"))["items"]
        return [
            e
            for e in items
            if (e.get("regarding") or {}).get("name") == name and e.get("reason") == reason
        ]

    async def submit_placeholder(self, node: str) -> int:
        """An EXTERNAL job occupying `node`, as the bridge's scheduler will submit."""
        return await self.slurm.submit_job(
            {
                "name": "bridge-e2e-placeholder",
                "flags": ["EXTERNAL_JOB"],
                "partition": PARTITION,
                "required_nodes": [node],
                "minimum_nodes": 1,
                "maximum_nodes": 1,
                "tasks": 1,
                "current_working_directory": "/tmp",
                "environment": ["PATH=/usr/bin:/bin"],
                "time_limit": {"set": True, "number": 10},
            }
        )

    async def delete_node_and_wait(self, name: str) -> None:
        """Delete a test's Node and wait until the bridge has removed its Slurm node."""
        with contextlib.suppress(rest.ApiError):
            await self.kube.delete(rest.NODES, name)

        async def gone() -> bool:
            return await self.slurm_node(name) is None

        await wait_for(gone, timeout=60, what=f"slurm node {name} removed after its Node")


async def wait_slurm_node(
    env: BridgeEnv, name: str, ok: Callable[[Node | None], bool], what: str, timeout: float = 30
) -> Node | None:
    seen: list[Node | None] = []

    async def check() -> bool:
        node = await env.slurm_node(name)
        seen[:] = [node]
        return ok(node)

    await wait_for(check, timeout=timeout, what=what)
    return seen[0]


async def wait_kube(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 30) -> None:
    await wait_for(check, timeout=timeout, what=what)


async def register_webhooks(kube: rest.Kube, objects: list[JSON]) -> None:
    for obj in objects:
        res = MUTATING if obj["kind"] == "MutatingWebhookConfiguration" else VALIDATING
        await kube.apply(res, obj, field_manager="slinky-e2e")


async def unregister_webhooks(kube: rest.Kube, name: str) -> None:
    for res in (MUTATING, VALIDATING):
        with contextlib.suppress(rest.ApiError):
            await kube.delete(res, name)


@pytest.fixture(scope="session")
async def bridge_env(
    kube: rest.Kube, testbed: Testbed, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[BridgeEnv]:
    """The bridge under test (all components in one process), started once per session, its
    webhook registered for the first of its two managed namespaces."""
    work = tmp_path_factory.mktemp("bridge")
    digest = uuid.uuid4().hex[:6]
    managed, direct = f"bridge-managed-{digest}", f"bridge-direct-{digest}"
    for ns in (managed, direct):
        await kube.create(rest.NAMESPACES, {"metadata": {"name": ns}})
    ca_dir, cert_dir = work / "ca", work / "certs"
    make_ca(ca_dir)
    issue_serving_cert(ca_dir, cert_dir)
    config = bridge_config(testbed, [managed, direct])
    config_path = work / "config.yaml"
    config_path.write_text(yaml.safe_dump(config))
    kubeconfig = await bridge_kubeconfig(kube, testbed, work / "kubeconfig")
    # A Lease that outlasts an apiserver restart, as the session operator's: tests on the
    # other xdist worker restart it, and a bridge that lost its Lease in the middle of a test
    # (by design it exits, to be restarted) fails that test.
    bridge = start_bridge(
        kubeconfig, config_path, cert_dir, work / "bridge.log", lease=("30s", "25s")
    )
    await wait_ready(bridge)
    name = f"slurm-bridge-e2e-{managed[-6:]}"
    await register_webhooks(
        kube,
        manifests.webhook_configurations(
            parse_config(bridge_config(testbed, [managed])),
            own_namespace=BRIDGE_NS,
            name=name,
            url=f"https://127.0.0.1:{bridge.webhook_port}",
            ca_bundle=(ca_dir / "ca.crt").read_bytes(),
        ),
    )
    slurm = SlurmClient(
        testbed.slurm_rest_url, MintedToken(testbed.jwt_key_path.read_bytes(), user="root")
    )
    env = BridgeEnv(kube, slurm, testbed, bridge, managed, direct, ca_dir, cert_dir, work)
    try:
        yield env
    finally:
        await unregister_webhooks(kube, name)
        await slurm.close()
        for ns in (managed, direct):
            with contextlib.suppress(rest.ApiError):
                await kube.delete(rest.NAMESPACES, ns)
        if not bridge.lost_leadership():
            code = bridge.stop()
            assert code == 0, (
                f"bridge did not exit cleanly on SIGTERM ({code}):\n{bridge.log_tail()}"
            )
        denied = rbac_denials(bridge.log_path, testbed.restarted_at("apiserver"))
        assert not denied, "bridge hit RBAC denials:\n" + "\n".join(denied[:10])


@pytest.fixture
async def bridge(bridge_env: BridgeEnv) -> AsyncIterator[BridgeEnv]:
    """The session's bridge for one test; the Nodes the test created are deleted afterwards
    (and their Slurm nodes waited for, so no test leaks into Slurm)."""
    if bridge_env.bridge.lost_leadership():
        await bridge_env.bridge.restart()  # as the kubelet would restart the pod
    first = len(bridge_env.nodes)
    yield bridge_env
    for name in bridge_env.nodes[first:]:
        await bridge_env.delete_node_and_wait(name)
    del bridge_env.nodes[first:]
