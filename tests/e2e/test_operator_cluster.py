"""The Cluster controller in the real operator process (RBAC-limited ServiceAccount token),
against the real apiserver and slurmrestd; and the CRDs' validation."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from pathlib import Path
from typing import Any

import jwt
import pytest

from slinky.kube import rest
from slinky.operator.resources import CLUSTERS, NODESETS
from slinky_testbed import paths, procs
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for
from tests.e2e.operator_fixtures import (
    DENIALS_EXPECTED_IN,
    OPERATOR_NS,
    RBAC_RES,
    SECRETS_ROLE,
    OperatorProcess,
    cluster,
    condition,
    operator_may,
    secret,
    wait_rbac_effective,
)

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]


async def get_cluster(kube: rest.Kube, ns: str, name: str) -> JSON:
    return await kube.get(CLUSTERS, name, ns)


async def wait_reason(
    kube: rest.Kube, ns: str, name: str, reason: str, timeout: float = 30
) -> JSON:
    async def check() -> JSON | None:
        obj = await get_cluster(kube, ns, name)
        return obj if condition(obj).get("reason") == reason else None

    try:
        return await wait_for(check, timeout=timeout, what=f"Cluster {name} Ready reason {reason}")
    except AssertionError:
        obj = await get_cluster(kube, ns, name)
        raise AssertionError(f"status now: {obj.get('status')}") from None


def bad_token() -> str:
    now = int(time.time())
    return jwt.encode({"sun": "root", "iat": now, "exp": now + 3600}, b"x" * 32, "HS256")


async def test_cluster_with_token_becomes_ready_and_kubectl_shows_columns(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str
) -> None:
    await kube.create(
        rest.SECRETS, secret("slurm-token", **{"auth-token": testbed.mint_slurm_token()}), namespace
    )
    await kube.create(
        CLUSTERS,
        cluster("slurm", testbed.slurm_rest_url, token={"secretRef": "slurm-token"}),
        namespace,
    )
    obj = await wait_reason(kube, namespace, "slurm", "Connected", timeout=30)
    st = obj["status"]
    assert st["isReady"] is True and st["slurmVersion"] == "26.05.5"
    assert st["apiVersion"] == "v0.0.45" and st["lastPingTime"]
    assert st["observedGeneration"] == obj["metadata"]["generation"]
    assert "slinky.slurm.net/finalizer" in obj["metadata"]["finalizers"]
    out = subprocess.run(
        [
            str(paths.bin_dir() / "kubectl"),
            f"--kubeconfig={testbed.kubeconfig}",
            "get",
            "slurmcluster",
            "-n",
            namespace,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "READY", "SERVER", "VERSION", "AGE"]
    assert row.split()[:4] == ["slurm", "true", testbed.slurm_rest_url, "26.05.5"]

    evs = (await kube.list(rest.EVENTS, namespace))["items"]
    assert any(e["reason"] == "Connected" and e["regarding"]["name"] == "slurm" for e in evs)


async def test_each_failure_has_its_reason_and_fixing_it_recovers(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str
) -> None:
    await kube.create(
        CLUSTERS, cluster("c", testbed.slurm_rest_url, token={"secretRef": "tok"}), namespace
    )
    obj = await wait_reason(kube, namespace, "c", "SecretNotFound")
    assert f"Secret {namespace}/tok" in condition(obj)["message"]
    assert obj["status"]["isReady"] is False

    await kube.create(rest.SECRETS, secret("tok", wrong=bad_token()), namespace)
    obj = await wait_reason(kube, namespace, "c", "SecretKeyMissing")
    assert "'auth-token'" in condition(obj)["message"] and "wrong" in condition(obj)["message"]

    await kube.patch(rest.SECRETS, "tok", secret("tok", **{"auth-token": bad_token()}), namespace)
    obj = await wait_reason(kube, namespace, "c", "Unauthorized")
    assert bad_token()[:20] not in condition(obj)["message"], "the token never shows"

    await kube.patch(
        rest.SECRETS, "tok", secret("tok", **{"auth-token": testbed.mint_slurm_token()}), namespace
    )
    await wait_reason(kube, namespace, "c", "Connected")

    closed = procs.free_port()
    await kube.patch(CLUSTERS, "c", {"spec": {"server": f"http://127.0.0.1:{closed}"}}, namespace)
    obj = await wait_reason(kube, namespace, "c", "Unreachable")
    assert f"127.0.0.1:{closed}" in condition(obj)["message"]
    await kube.patch(CLUSTERS, "c", {"spec": {"server": testbed.slurm_rest_url}}, namespace)
    await wait_reason(kube, namespace, "c", "Connected")
    assert operator.proc.poll() is None, "no restart needed"


async def test_slurmctld_down_behind_a_running_slurmrestd_is_blamed_on_slurmctld(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str
) -> None:
    """slurmrestd answers (or accepts connections), slurmctld does not: the condition says
    slurmctld, not 'check that slurmrestd is running'."""
    await kube.create(
        rest.SECRETS, secret("tok", **{"auth-token": testbed.mint_slurm_token()}), namespace
    )
    await kube.create(
        CLUSTERS, cluster("c", testbed.slurm_rest_url, token={"secretRef": "tok"}), namespace
    )
    await wait_reason(kube, namespace, "c", "Connected")
    await asyncio.to_thread(testbed.stop_component, "slurmctld")
    try:
        # The operator pings every 5 s here; the deadline leaves room for slurmrestd's own
        # timeouts towards a slurmctld that is gone.
        obj = await wait_reason(kube, namespace, "c", "SlurmctldNotResponding", timeout=60)
        message = condition(obj)["message"]
        assert "slurmctld" in message and "check spec.server" not in message, message
    finally:
        await asyncio.to_thread(testbed.start_component, "slurmctld")
    await wait_reason(kube, namespace, "c", "Connected", timeout=60)


async def test_a_slurmctld_pod_waiting_for_its_claim_is_named_on_the_cluster(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str
) -> None:
    """What a chart install on a cluster without a StorageClass looks like: slurmctld's pod
    Pending on its claim, slurmrestd not answering. The Cluster names the pod and the claim
    (found through the Service of spec.controller.host), not slurmrestd."""
    await kube.create(
        rest.SERVICES,
        {
            "metadata": {"name": "ctld"},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "ctld-e2e"},
                "ports": [{"port": 6817}],
            },
        },
        namespace,
    )
    await kube.create(
        rest.PVCS,
        {
            "metadata": {"name": "state-ctld-0"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
        namespace,
    )
    await kube.create(
        rest.PODS,
        {
            "metadata": {"name": "ctld-0", "labels": {"app": "ctld-e2e"}},
            "spec": {
                "containers": [{"name": "slurmctld", "image": "localhost/none:0"}],
                "volumes": [
                    {"name": "state", "persistentVolumeClaim": {"claimName": "state-ctld-0"}}
                ],
            },
        },
        namespace,
    )  # fmt: skip
    await kube.create(
        rest.SECRETS, secret("tok", **{"auth-token": testbed.mint_slurm_token()}), namespace
    )
    closed = procs.free_port()
    spec = {
        "token": {"secretRef": "tok"},
        "controller": {"host": f"ctld.{namespace}.svc.cluster.local", "port": 6817},
    }
    await kube.create(CLUSTERS, cluster("c", f"http://127.0.0.1:{closed}", **spec), namespace)
    obj = await wait_reason(kube, namespace, "c", "SlurmctldPodPending", timeout=60)
    message = condition(obj)["message"]
    assert f"waiting for slurmctld's pod {namespace}/ctld-0: Pending" in message, message
    assert "its claim state-ctld-0 is Pending" in message, message


async def test_token_rotation_in_the_secret_is_picked_up(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str
) -> None:
    await kube.create(
        rest.SECRETS, secret("tok", **{"auth-token": testbed.mint_slurm_token()}), namespace
    )
    await kube.create(
        CLUSTERS, cluster("rot", testbed.slurm_rest_url, token={"secretRef": "tok"}), namespace
    )
    await wait_reason(kube, namespace, "rot", "Connected")
    # An expired token put in the Secret is used (and refused) at once...
    now = int(time.time())
    expired = jwt.encode(
        {"sun": "root", "iat": now - 600, "exp": now - 300},
        testbed.jwt_key_path.read_bytes(),
        "HS256",
    )
    await kube.patch(rest.SECRETS, "tok", secret("tok", **{"auth-token": expired}), namespace)
    await wait_reason(kube, namespace, "rot", "Unauthorized")
    # ...and the rotated, valid one too.
    await kube.patch(
        rest.SECRETS, "tok", secret("tok", **{"auth-token": testbed.mint_slurm_token()}), namespace
    )
    await wait_reason(kube, namespace, "rot", "Connected")


async def test_tokens_minted_from_the_jwt_key_are_renewed_before_expiry(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str
) -> None:
    key = testbed.jwt_key_path.read_bytes()
    await kube.create(rest.SECRETS, secret("jwt", **{"jwt_hs256.key": key}), namespace)
    await kube.create(
        CLUSTERS,
        cluster("minted", testbed.slurm_rest_url, username="root", jwtKeyRef={"name": "jwt"}),
        namespace,
    )
    obj = await wait_reason(kube, namespace, "minted", "Connected")
    assert "minted" in condition(obj)["message"]
    before = operator.metric('slinky_slurm_tokens_minted_total{user="root"}') or 0
    # The operator runs with --slurm-token-lifetime=6s and pings every 5s: across 15s it must
    # mint fresh tokens and never show Unauthorized.
    start = time.monotonic()
    reasons: set[str] = set()

    async def spanned() -> bool:
        o = await get_cluster(kube, namespace, "minted")
        reasons.add(condition(o).get("reason", ""))
        return time.monotonic() - start > 15

    await wait_for(spanned, timeout=30, interval=0.5, what="15 s of minted tokens")
    after = operator.metric('slinky_slurm_tokens_minted_total{user="root"}') or 0
    assert after - before >= 2, f"tokens minted: {before} -> {after}"
    assert reasons == {"Connected"}, reasons


async def test_deleting_a_cluster_stops_its_client_and_informer(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str
) -> None:
    await kube.create(
        rest.SECRETS, secret("tok", **{"auth-token": testbed.mint_slurm_token()}), namespace
    )
    await kube.create(
        CLUSTERS, cluster("gone", testbed.slurm_rest_url, token={"secretRef": "tok"}), namespace
    )
    await wait_reason(kube, namespace, "gone", "Connected")
    series = (
        f'slinky_slurm_client_info{{cluster="gone",namespace="{namespace}",'
        f'server="{testbed.slurm_rest_url}"}}'
    )
    assert operator.metric(series) == 1
    await kube.delete(CLUSTERS, "gone", namespace)

    async def gone() -> bool:
        try:
            await get_cluster(kube, namespace, "gone")
        except rest.ApiError as e:
            return e.not_found
        return False

    await wait_for(gone, timeout=20, what="Cluster gone (finalizer released)")
    assert operator.metric(series) is None, "client and informer removed"


async def grant_secrets_by_name(kube: rest.Kube, ns: str, *names: str) -> None:
    """Replace the namespace's Secrets grant by one for `names` only (`resourceNames`; none:
    no Secret at all), and wait until the authorizer says so."""
    with contextlib.suppress(rest.ApiError):
        await kube.delete(RBAC_RES["RoleBinding"], SECRETS_ROLE, ns)
    if names:
        role = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "secrets-by-name", "namespace": ns},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["secrets"],
                    "resourceNames": list(names),
                    "verbs": ["list", "watch"],
                }
            ],
        }
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "secrets-by-name", "namespace": ns},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "secrets-by-name",
            },
            "subjects": [
                {"kind": "ServiceAccount", "name": "slurm-operator", "namespace": OPERATOR_NS}
            ],
        }
        await kube.create(RBAC_RES["Role"], role, ns)
        await kube.create(RBAC_RES["RoleBinding"], binding, ns)
        await wait_rbac_effective(kube, "watch", "", "secrets", namespace=ns, name=names[0])
    await wait_rbac_effective(kube, "list", "", "secrets", namespace=ns, allowed=False)


def cached_secrets(operator: OperatorProcess, ns: str) -> float | None:
    return operator.metric(f'slinky_informer_objects{{namespace="{ns}",resource="secrets"}}')


async def wait_cluster_gone(kube: rest.Kube, ns: str, name: str) -> None:
    async def gone() -> bool:
        try:
            await get_cluster(kube, ns, name)
        except rest.ApiError as e:
            return e.not_found
        return False

    await wait_for(gone, timeout=20, what=f"Cluster {name} gone (finalizer released)")


async def test_the_operator_reads_only_the_secrets_clusters_reference(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str
) -> None:
    # The operator may list and watch Secret "tok" of this namespace, and no other Secret.
    await grant_secrets_by_name(kube, namespace, "tok")
    assert not await operator_may(kube, "list", "", "secrets"), "no cluster-wide Secret list"
    for name in ("unrelated-1", "unrelated-2"):
        await kube.create(rest.SECRETS, secret(name, **{"auth-token": "x"}), namespace)
    await kube.create(
        rest.SECRETS, secret("tok", **{"auth-token": testbed.mint_slurm_token()}), namespace
    )
    for name in ("a", "b"):
        await kube.create(
            CLUSTERS, cluster(name, testbed.slurm_rest_url, token={"secretRef": "tok"}), namespace
        )
    for name in ("a", "b"):
        await wait_reason(kube, namespace, name, "Connected", timeout=15)
    assert cached_secrets(operator, namespace) == 1, "only tok; unrelated Secrets never cached"
    assert operator.metric('slinky_informer_objects{namespace="",resource="secrets"}') is None

    # A change to the Secret still reaches every Cluster that names it...
    await kube.patch(rest.SECRETS, "tok", secret("tok", **{"auth-token": bad_token()}), namespace)
    for name in ("a", "b"):
        await wait_reason(kube, namespace, name, "Unauthorized")
    # ...and the cache lives as long as one of them does.
    await kube.delete(CLUSTERS, "a", namespace)
    await wait_cluster_gone(kube, namespace, "a")
    await kube.patch(
        rest.SECRETS, "tok", secret("tok", **{"auth-token": testbed.mint_slurm_token()}), namespace
    )
    await wait_reason(kube, namespace, "b", "Connected")
    assert cached_secrets(operator, namespace) == 1
    await kube.delete(CLUSTERS, "b", namespace)
    await wait_cluster_gone(kube, namespace, "b")

    async def uncached() -> bool:
        return cached_secrets(operator, namespace) is None

    await wait_for(uncached, timeout=10, what="tok's informer stopped with its last Cluster")


async def test_a_secret_created_after_its_cluster_makes_it_ready(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str
) -> None:
    await grant_secrets_by_name(kube, namespace, "late-key")
    await kube.create(
        CLUSTERS,
        cluster("late", testbed.slurm_rest_url, username="root", jwtKeyRef={"name": "late-key"}),
        namespace,
    )
    obj = await wait_reason(kube, namespace, "late", "SecretNotFound")
    assert f"Secret {namespace}/late-key" in condition(obj)["message"]
    pid = operator.proc.pid
    key = testbed.jwt_key_path.read_bytes()
    await kube.create(rest.SECRETS, secret("late-key", **{"jwt_hs256.key": key}), namespace)
    await wait_reason(kube, namespace, "late", "Connected", timeout=10)
    assert operator.proc.pid == pid and operator.proc.poll() is None, "no restart needed"


async def test_a_secret_the_operator_may_not_read_says_which_grant_is_missing(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str
) -> None:
    DENIALS_EXPECTED_IN.add(namespace)
    await grant_secrets_by_name(kube, namespace)  # the admin forgot this namespace
    await kube.create(
        rest.SECRETS, secret("tok", **{"auth-token": testbed.mint_slurm_token()}), namespace
    )
    await kube.create(
        CLUSTERS, cluster("c", testbed.slurm_rest_url, token={"secretRef": "tok"}), namespace
    )
    obj = await wait_reason(kube, namespace, "c", "SecretNotReadable")
    message = condition(obj)["message"]
    assert f"Secret {namespace}/tok" in message and "forbidden" in message, message
    assert f"slurm-operator-secrets in namespace {namespace}" in message, message

    await grant_secrets_by_name(kube, namespace, "tok")  # granted: picked up without a restart
    await wait_reason(kube, namespace, "c", "Connected", timeout=45)


def nodeset(name: str, **spec: Any) -> JSON:
    base: JSON = {
        "clusterName": "slurm",
        "replicas": 1,
        "selector": {"matchLabels": {"app": name}},
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {"containers": [{"name": "slurmd", "image": "slurmd"}]},
        },
    }
    base.update(spec)
    return {
        "apiVersion": "slinky.slurm.net/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": name},
        "spec": base,
    }


async def rejected(kube: rest.Kube, res: rest.Resource, obj: JSON, ns: str) -> str:
    with pytest.raises(rest.ApiError) as info:
        # kubectl's default: unknown fields are errors, not warnings.
        await kube.request("POST", res.path(ns), body=obj, params={"fieldValidation": "Strict"})
    assert info.value.code in (400, 422), info.value
    return info.value.message


async def test_invalid_custom_resources_are_rejected_naming_the_field(
    kube: rest.Kube, crds: None, namespace: str
) -> None:
    assert "spec.replicas" in await rejected(kube, NODESETS, nodeset("a", replicas=-1), namespace)
    bogus = nodeset("b")
    bogus["spec"]["bogus"] = 1
    assert 'unknown field "spec.bogus"' in await rejected(kube, NODESETS, bogus, namespace)
    mismatch = nodeset("c", selector={"matchLabels": {"app": "other"}})
    msg = await rejected(kube, NODESETS, mismatch, namespace)
    assert "spec.selector" in msg and "must match" in msg
    no_slurmd = nodeset("h")
    no_slurmd["spec"]["template"]["spec"]["containers"][0]["name"] = "main"
    msg = await rejected(kube, NODESETS, no_slurmd, namespace)
    assert "spec.template" in msg and "container named slurmd" in msg, msg
    zero = nodeset("d", updateStrategy={"rollingUpdate": {"maxUnavailable": 0}})
    assert "maxUnavailable" in await rejected(kube, NODESETS, zero, namespace)
    # A typo in the pod template is refused as in a StatefulSet (the schema was
    # x-kubernetes-preserve-unknown-fields: `resurces` was kept and the pod had no limits).
    typo = nodeset("t")
    typo["spec"]["template"]["spec"]["containers"][0]["resurces"] = {"limits": {"cpu": 1}}
    msg = await rejected(kube, NODESETS, typo, namespace)
    assert 'unknown field "spec.template.spec.containers[0].resurces"' in msg, msg
    typo["spec"]["template"]["spec"]["containers"][0].pop("resurces")
    typo["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limts": {"cpu": 1}}
    msg = await rejected(kube, NODESETS, typo, namespace)
    assert 'unknown field "spec.template.spec.containers[0].resources.limts"' in msg, msg
    # What kubectl's dry-run writes (a null creationTimestamp) and a float quantity still fit.
    fine = nodeset("f", replicas=0)
    fine["spec"]["template"]["metadata"]["creationTimestamp"] = None
    fine["spec"]["template"]["spec"]["containers"][0]["resources"] = {"limits": {"cpu": 0.5}}
    made = await kube.request(
        "POST", NODESETS.path(namespace), body=fine, params={"fieldValidation": "Strict"}
    )
    assert made["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] == 0.5
    msg = await rejected(
        kube, CLUSTERS, cluster("e", "not-a-url", token={"secretRef": "x"}), namespace
    )
    assert "spec.server" in msg
    msg = await rejected(kube, CLUSTERS, cluster("f", "http://x:1"), namespace)
    assert "spec.token.secretRef" in msg and "spec.jwtKeyRef" in msg

    await kube.create(NODESETS, nodeset("g"), namespace)
    with pytest.raises(rest.ApiError) as info:
        await kube.patch(NODESETS, "g", {"spec": {"clusterName": "other"}}, namespace)
    assert "clusterName is immutable" in info.value.message
    created = await kube.get(NODESETS, "g", namespace)
    assert created["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1, "partition": 0},
    }


async def test_upstream_v1alpha1_manifest_applies_unchanged(
    testbed: Testbed, crds: None, namespace: str
) -> None:
    # The session's operator may be running and see these Clusters, but nobody granted it
    # this namespace's Secrets: its 403s here are expected.
    DENIALS_EXPECTED_IN.add(namespace)
    manifest = Path(__file__).parent / "data" / "upstream-v1alpha1.yaml"
    out = subprocess.run(
        [
            str(paths.bin_dir() / "kubectl"),
            f"--kubeconfig={testbed.kubeconfig}",
            "apply",
            "-n",
            namespace,
            "-f",
            str(manifest),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "cluster.slinky.slurm.net/slurm created" in out.stdout
    assert "nodeset.slinky.slurm.net/slurm-compute-debug created" in out.stdout
