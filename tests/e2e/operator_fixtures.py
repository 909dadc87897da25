"""Fixtures for operator tests: CRDs installed, and the operator running as a process with a
ServiceAccount token bound to config/rbac (not as cluster admin), plus, in each test's
namespace, the Secrets grant an admin makes for a namespace holding Clusters."""

from __future__ import annotations

import base64
import datetime as dt
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
import pytest
import yaml

from slinky.kube import rest
from slinky_testbed import procs
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for
from tests.e2e.autoscale_fixtures import install_metrics_api, metrics_api_args

REPO = Path(__file__).resolve().parents[2]
OPERATOR_NS = "slinky-system"
OPERATOR_SA = f"system:serviceaccount:{OPERATOR_NS}:slurm-operator"
SECRETS_ROLE = "slurm-operator-secrets"
# Namespaces where a test withholds a grant on purpose: the operator's 403s there are expected.
DENIALS_EXPECTED_IN: set[str] = set()
RBAC = rest.Resource(
    "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False
)
RBAC_RES = {
    "ClusterRole": RBAC,
    "ClusterRoleBinding": rest.Resource(
        "rbac.authorization.k8s.io",
        "v1",
        "clusterrolebindings",
        "ClusterRoleBinding",
        namespaced=False,
    ),
    "Role": rest.Resource("rbac.authorization.k8s.io", "v1", "roles", "Role"),
    "RoleBinding": rest.Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
    "ServiceAccount": rest.Resource("", "v1", "serviceaccounts", "ServiceAccount"),
    "CustomResourceDefinition": rest.CRDS,
}


async def apply_file(kube: rest.Kube, path: Path) -> None:
    """Server-side apply every document of a YAML file (as cluster admin)."""
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        res = RBAC_RES[doc["kind"]]
        await kube.apply(res, doc, field_manager="slinky-e2e")


async def install_crds(kube: rest.Kube) -> None:
    for path in sorted((REPO / "config" / "crd").glob("*.yaml")):
        await apply_file(kube, path)
    for name in ("clusters.slinky.slurm.net", "nodesets.slinky.slurm.net"):

        async def established(n: str = name) -> bool:
            crd = await kube.get(rest.CRDS, n)
            conds = (crd.get("status") or {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conds)

        await wait_for(established, timeout=30, what=f"CRD {name} established")


@dataclass
class OperatorProcess:
    proc: subprocess.Popen[bytes]
    metrics_url: str
    probe_url: str
    log_path: Path
    argv: list[str]
    env: dict[str, str]

    def kill(self) -> None:
        """SIGKILL: no cleanup, no Lease release."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    async def restart(self) -> None:
        logf = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.proc = subprocess.Popen(self.argv, stdout=logf, stderr=subprocess.STDOUT, env=self.env)
        logf.close()
        await wait_ready(self)

    def metrics(self) -> str:
        return httpx2.get(f"{self.metrics_url}/metrics", timeout=5).text

    def metric(self, prefix: str) -> float | None:
        for line in self.metrics().splitlines():
            if line.startswith(prefix):
                return float(line.rsplit(" ", 1)[1])
        return None

    def log_tail(self, n: int = 60, contains: str | None = None) -> str:
        return procs.log_tail(self.log_path, n, contains)

    def stop(self, timeout: float = 30) -> int:
        return procs.terminate(self.proc, self.log_path, timeout)

    def lost_leadership(self) -> bool:
        """Exited because the apiserver was unreachable past the renew deadline (a test that
        restarts the apiserver does that): by design, as a pod would, to be restarted."""
        return self.proc.poll() is not None and "lost leadership; exiting" in self.log_tail(5)


async def operator_may(
    kube: rest.Kube,
    verb: str,
    group: str,
    resource: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
) -> bool:
    """Whether the apiserver lets the operator's ServiceAccount do this (SubjectAccessReview)."""
    attributes = {"verb": verb, "group": group, "resource": resource}
    if namespace:
        attributes["namespace"] = namespace
    if name:
        attributes["name"] = name
    review = await kube.request(
        "POST",
        "/apis/authorization.k8s.io/v1/subjectaccessreviews",
        body={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": OPERATOR_SA,
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{OPERATOR_NS}"],
                "resourceAttributes": attributes,
            },
        },
    )
    return bool((review.get("status") or {}).get("allowed"))


async def wait_rbac_effective(
    kube: rest.Kube,
    verb: str,
    group: str,
    resource: str,
    *,
    namespace: str | None = None,
    name: str | None = None,
    allowed: bool = True,
) -> None:
    """Wait until the apiserver's authorizer has caught up with the RBAC objects just applied
    (or deleted), so the operator does not run into a moment of 403s."""

    async def effective() -> bool:
        got = await operator_may(kube, verb, group, resource, namespace=namespace, name=name)
        return got == allowed

    scope = f" {namespace}/{name or '*'}" if namespace else ""
    what = f"RBAC {'lets' if allowed else 'forbids'} {OPERATOR_SA} {verb} {resource}{scope}"
    await wait_for(effective, timeout=30, what=what)


async def grant_secrets(kube: rest.Kube, namespace: str) -> None:
    """What an admin does for a namespace holding Clusters (README): bind the operator's
    Secrets role there."""
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": SECRETS_ROLE, "namespace": namespace},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": SECRETS_ROLE,
        },
        "subjects": [
            {"kind": "ServiceAccount", "name": "slurm-operator", "namespace": OPERATOR_NS}
        ],
    }
    await kube.apply(RBAC_RES["RoleBinding"], binding, field_manager="slinky-e2e")
    await wait_rbac_effective(kube, "watch", "", "secrets", namespace=namespace)


async def operator_kubeconfig(kube: rest.Kube, testbed: Testbed, path: Path) -> Path:
    """A kubeconfig holding a TokenRequest token of the operator's ServiceAccount."""
    try:
        await kube.create(rest.NAMESPACES, {"metadata": {"name": OPERATOR_NS}})
    except rest.ApiError as e:
        if not e.conflict:
            raise
    for f in (
        "role.yaml",
        "secrets_role.yaml",
        "leader_election_role.yaml",
        "service_account.yaml",
    ):
        await apply_file(kube, REPO / "config" / "rbac" / f)
    await wait_rbac_effective(kube, "watch", "slinky.slurm.net", "nodesets")
    sa = RBAC_RES["ServiceAccount"]
    tr = await kube.request(
        "POST",
        sa.path(OPERATOR_NS, "slurm-operator", "token"),
        body={
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenRequest",
            "spec": {"expirationSeconds": 24 * 3600},
        },
    )
    admin = yaml.safe_load(testbed.kubeconfig.read_text())
    admin["users"] = [{"name": "slurm-operator", "user": {"token": tr["status"]["token"]}}]
    admin["contexts"][0]["context"]["user"] = "slurm-operator"
    path.write_text(yaml.safe_dump(admin))
    return path


def start_operator(kubeconfig: Path, log_path: Path, *extra: str) -> OperatorProcess:
    mport, pport = procs.free_ports(2)
    argv = [
        sys.executable,
        "-m",
        "slinky.operator.main",
        f"--kubeconfig={kubeconfig}",
        f"--metrics-bind-address=127.0.0.1:{mport}",
        f"--health-probe-bind-address=127.0.0.1:{pport}",
        f"--leader-election-namespace={OPERATOR_NS}",
        "--leader-election-lease-duration=4s",
        "--leader-election-renew-deadline=3s",
        "--leader-election-retry-period=1s",
        "--cluster-ping-interval=5s",
        # Tests wait for what the operator sees of Slurm (a job starting, an admin's drain);
        # the default 60 s between idle polls would make each such wait a minute long.
        "--slurm-idle-poll-interval=5s",
        # A Node condition the node-health test sets (as Node Problem Detector would).
        "--drain-node-conditions=SlinkyTestProblem",
        # The count-only GRES of the extended resource the GRES test gives the real nodes.
        "--gres-resources=nvidia.com/gpu=gpu,example.com/widget=widget",
        # Node labels the placement test sets: features, and the test bed's tree `racks`.
        "--node-feature-labels=features.slinky.test/",
        "--topology-labels=slinky.test/zone,slinky.test/rack",
        "--topology-root=racks:root",
        "--log-level=debug",
        *extra,
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    logf = open(log_path, "ab")  # noqa: SIM115 - owned by the child
    proc = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=env)
    logf.close()
    return OperatorProcess(
        proc, f"http://127.0.0.1:{mport}", f"http://127.0.0.1:{pport}", log_path, argv, env
    )


async def wait_ready(op: OperatorProcess) -> None:
    async def ready() -> bool:
        if op.proc.poll() is not None:
            raise AssertionError(f"operator exited {op.proc.returncode}:\n{op.log_tail()}")
        async with httpx2.AsyncClient(timeout=2) as http:
            return (await http.get(f"{op.probe_url}/readyz")).status_code == 200

    await wait_for(ready, timeout=60, what="operator /readyz", ignore=(httpx2.HTTPError,))


@pytest.fixture(scope="session")
async def crds(kube: rest.Kube) -> None:
    await install_crds(kube)


@pytest.fixture(scope="session")
async def operator_session(
    kube: rest.Kube, testbed: Testbed, crds: None, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[OperatorProcess]:
    """The operator under test, started once per session with its RBAC-limited token, serving
    external.metrics.k8s.io through the test bed's apiserver."""
    work = tmp_path_factory.mktemp("operator")
    kubeconfig = await operator_kubeconfig(kube, testbed, work / "kubeconfig")
    api_args, api_port = metrics_api_args(testbed)
    # A Lease that outlasts an apiserver restart (tests restart it): the quick 4 s Lease of
    # `start_operator` is for the tests that exercise failover with operators of their own.
    op = start_operator(
        kubeconfig,
        work / "operator.log",
        "--slurm-token-lifetime=6s",
        "--leader-election-lease-duration=20s",
        "--leader-election-renew-deadline=15s",
        *api_args,
    )
    await wait_ready(op)
    await install_metrics_api(kube, testbed, api_port)
    yield op
    if not op.lost_leadership():
        code = op.stop()
        assert code == 0, f"operator did not exit cleanly on SIGTERM ({code}):\n{op.log_tail()}"
    # A restarted apiserver answers 403 for a moment while its RBAC cache fills; the operator
    # retries those. Any other denial means config/rbac lacks a permission.
    restarts = testbed.restarted_at("apiserver")
    denied = [
        line
        for line in op.log_path.read_text().splitlines()
        if 'User "system:serviceaccount:' in line
        and "cannot" in line
        and not soon_after(line, restarts, window_s=60)
        and not any(f'namespace "{ns}"' in line for ns in DENIALS_EXPECTED_IN)
    ]
    assert not denied, "operator hit RBAC denials:\n" + "\n".join(denied[:10])


def soon_after(line: str, moments: list[float], *, window_s: float) -> bool:
    """Whether a log line (text format: local time first, as logging's asctime writes it) was
    written within `window_s` after one of `moments`."""
    try:
        at = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    except ValueError:
        return False
    t = at.timestamp()  # naive: local time, like asctime
    return any(0 <= t - m <= window_s for m in moments)


@pytest.fixture
async def operator(
    operator_session: OperatorProcess, kube: rest.Kube, namespace: str
) -> OperatorProcess:
    """The session's operator, started again first if it exited after losing its Lease (as the
    kubelet would restart its pod), so one apiserver restart does not fail every later test;
    it may read the Secrets of the test's namespace, as an admin grants it (README)."""
    if operator_session.lost_leadership():
        await operator_session.restart()
        # The old Lease must expire first (up to its 20 s): tests start once this one leads.
        await wait_for(
            lambda: operator_session.metric("leader_election_master_status") == 1,
            timeout=60,
            what="the restarted session operator leads",
            ignore=(httpx2.HTTPError,),
        )
    elif operator_session.proc.poll() is not None:
        raise AssertionError(
            f"the session operator exited {operator_session.proc.returncode}:\n"
            + operator_session.log_tail()
        )
    await grant_secrets(kube, namespace)
    return operator_session


def secret(name: str, **data: str | bytes) -> dict[str, Any]:
    enc = {
        k: base64.b64encode(v if isinstance(v, bytes) else v.encode()).decode()
        for k, v in data.items()
    }
    return {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name}, "data": enc}


def cluster(name: str, server: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "slinky.slurm.net/v1alpha1",
        "kind": "Cluster",
        "metadata": {"name": name},
        "spec": {"server": server, **spec},
    }


def condition(obj: dict[str, Any], type_: str = "Ready") -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}
