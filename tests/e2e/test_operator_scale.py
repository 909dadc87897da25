"""The operator at a scale where its watches outnumber its pooled request connections: 20
watched namespaces (seven watched resources each, 141 watches with the Nodes) and 100
Secrets that Clusters name (one watch each). Its Lease stays its own and it still acts.

Before watches had a connection pool of their own, the watches held all 100 connections of
the request pool and the Lease renewal waited behind them: the operator lost its Lease a
few seconds after its caches synced and exited."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import httpx2
import pytest

from slinky.kube import rest
from slinky.operator.resources import CLUSTERS
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for
from tests.e2e.operator_fixtures import (
    OPERATOR_NS,
    cluster,
    condition,
    grant_secrets,
    operator_kubeconfig,
    secret,
    start_operator,
    wait_ready,
)

pytestmark = pytest.mark.e2e

NAMESPACES = 20
CLUSTERS_PER_NAMESPACE = 5  # one token Secret each: 100 Secrets
RENEWALS = 3


async def populate(kube: rest.Kube, ns: str) -> None:
    """Five Clusters, each naming a Secret of its own that lacks the token's key (so the
    operator reads it and says so, without a Slurm connection to make)."""
    await kube.create(rest.NAMESPACES, {"metadata": {"name": ns}})
    await grant_secrets(kube, ns)
    for i in range(CLUSTERS_PER_NAMESPACE):
        await kube.create(rest.SECRETS, secret(f"token-{i}", other="x"), ns)
        body = cluster(f"c{i}", "http://127.0.0.1:9", token={"secretRef": f"token-{i}"})
        await kube.create(CLUSTERS, body, ns)


async def test_twenty_namespaces_and_a_hundred_secrets_keep_the_lease_and_reconcile(
    kube: rest.Kube, testbed: Testbed, crds: None, tmp_path: Path
) -> None:
    tag = uuid.uuid4().hex[:6]
    namespaces = [f"t-scale-{tag}-{i:02}" for i in range(NAMESPACES)]
    kubeconfig = await operator_kubeconfig(kube, testbed, tmp_path / "kubeconfig")
    lease = f"e2e-scale-{tag}"
    op = None
    deleted = False
    try:
        await asyncio.gather(*(populate(kube, ns) for ns in namespaces))
        # A Lease a loaded 2-core CI machine keeps (start_operator's quick 4 s one, with a
        # 3 s renew deadline, was lost once under a load of 20 with every pool its own); the
        # starvation this test is about kept the old operator from ever taking it.
        op = start_operator(
            kubeconfig,
            tmp_path / "op.log",
            *(f"--namespace={ns}" for ns in namespaces),
            f"--leader-election-id={lease}",
            "--leader-election-lease-duration=15s",
            "--leader-election-renew-deadline=10s",
            "--leader-election-retry-period=2s",
        )
        await wait_ready(op)

        def secrets_cached() -> float:
            assert op is not None and op.proc.poll() is None, op.log_tail() if op else ""
            try:
                text = op.metrics()
            except httpx2.HTTPError as e:
                raise AssertionError(f"/metrics: {e}\n{op.log_tail()}") from None
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("slinky_informer_objects{")
                and 'resource="secrets"' in line
                and f'namespace="t-scale-{tag}' in line
            )

        await wait_for(
            lambda: secrets_cached() == NAMESPACES * CLUSTERS_PER_NAMESPACE,
            timeout=60,
            what="the operator caches the 100 Secrets (one by-name watch each)",
        )

        async def told_every_cluster() -> bool:
            text = op.log_path.read_text(errors="replace")
            return all(
                f"cluster {ns}/c{i}: not ready: SecretKeyMissing" in text
                for ns in namespaces
                for i in range(CLUSTERS_PER_NAMESPACE)
            )

        await wait_for(told_every_cluster, timeout=60, what="every Cluster reconciled")

        first = (await kube.get(rest.LEASES, lease, OPERATOR_NS))["spec"]
        renewals: set[str] = {first["renewTime"]}

        async def renewed() -> bool:
            spec = (await kube.get(rest.LEASES, lease, OPERATOR_NS))["spec"]
            assert spec["holderIdentity"] == first["holderIdentity"], spec
            assert spec["leaseTransitions"] == first["leaseTransitions"], spec
            assert op is not None and op.proc.poll() is None, op.log_tail()
            renewals.add(spec["renewTime"])
            return len(renewals) > RENEWALS

        await wait_for(renewed, timeout=30, what=f"{RENEWALS} renewals by the same holder")

        # Still acting: a Secret changed now reaches its Cluster's status.
        ns = namespaces[-1]
        await kube.patch(rest.SECRETS, "token-4", {"data": {"newkey": "eA=="}}, ns)

        async def acted() -> bool:
            ready = condition(await kube.get(CLUSTERS, "c4", ns))
            return "it has: newkey, other" in ready.get("message", "")

        await wait_for(acted, timeout=30, what="the changed Secret in the Cluster's status")
        assert f"cluster {ns}/c4: not ready: SecretKeyMissing" in op.log_tail(2000, "newkey")
        assert "lost the lease" not in op.log_path.read_text(errors="replace")

        # Deleted while the operator runs, so it removes its finalizers.
        await asyncio.gather(*(kube.delete(rest.NAMESPACES, ns) for ns in namespaces))
        deleted = True

        async def clusters_gone() -> bool:
            left = [await kube.list(CLUSTERS, ns) for ns in namespaces]
            return not any(page["items"] for page in left)

        await wait_for(clusters_gone, timeout=60, what="the Clusters finalized and gone")
        code = op.stop()
        assert code == 0, op.log_tail()
    finally:
        if not deleted:  # a failed test leaves nothing behind (its Clusters finalized or not)
            await asyncio.gather(
                *(kube.delete(rest.NAMESPACES, ns) for ns in namespaces), return_exceptions=True
            )
        if op is not None and op.proc.poll() is None:
            op.kill()
