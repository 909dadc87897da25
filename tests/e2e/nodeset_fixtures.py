"""Shared pieces of the NodeSet end-to-end tests: a Ready Cluster in the test namespace, the
NodeSet manifest the tests start from, and small waits on Slurm state. The one place that
says what a slurmd pod of the test bed looks like: a container from the Slurm image on a real
node, truly configless (`--conf-server` to slurmctld at the address pods reach; nothing
mounted but the Slurm key)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest

from slinky.kube import rest
from slinky.operator.nodeset.builder import ANNOTATION_CONDEMNED
from slinky.operator.resources import CLUSTERS, NODESETS
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.models import Job
from slinky.slurm.tokens import MintedToken
from slinky_testbed.bed import Testbed
from slinky_testbed.pods import slurm_key_secret, slurmd_pod_spec
from slinky_testbed.waiting import WaitTimeout, wait_for
from tests.e2e.operator_fixtures import OperatorProcess, cluster, condition, secret

JSON = dict[str, Any]
__all__ = ["slurm_key_secret", "slurmd_pod_spec"]


@dataclass
class Env:
    kube: rest.Kube
    slurm: SlurmClient
    testbed: Testbed
    namespace: str
    operator: OperatorProcess

    async def pods(self, nodeset: str) -> list[JSON]:
        items = (
            await self.kube.list(
                rest.PODS,
                self.namespace,
                params={"labelSelector": f"nodeset.slinky.slurm.net/name={nodeset}"},
            )
        )["items"]
        return sorted(items, key=lambda p: p["metadata"]["name"])

    async def live_pod_names(self, nodeset: str) -> list[str]:
        return [
            p["metadata"]["name"]
            for p in await self.pods(nodeset)
            if not p["metadata"].get("deletionTimestamp")
        ]

    async def nodeset(self, name: str) -> JSON:
        return await self.kube.get(NODESETS, name, self.namespace)

    async def scale(self, name: str, replicas: int) -> None:
        """Through the scale subresource, as `kubectl scale` and HPA do."""
        await self.kube.patch(
            NODESETS, name, {"spec": {"replicas": replicas}}, self.namespace, subresource="scale"
        )

    async def change_template(self, name: str) -> JSON:
        """A new pod template revision (one annotation), which a RollingUpdate rolls; the
        NodeSet as patched."""
        return await self.kube.patch(
            NODESETS,
            name,
            {"spec": {"template": {"metadata": {"annotations": {"e2e/version": "2"}}}}},
            self.namespace,
        )

    async def explain(self, nodeset: str, job_id: int | None = None) -> str:
        """What a failed wait on `nodeset` saw last: its status and conditions, each pod's
        phase, deletion and condemnation, its Slurm node's state and reason, and the job's
        state (a test's timeout message, as CI shows no more than the report)."""
        obj = await self.nodeset(nodeset)
        st = obj.get("status") or {}
        conds = [
            f"{c.get('type')}={c.get('status')} {c.get('reason')}: {c.get('message')}"
            for c in st.get("conditions") or []
        ]
        out = [f"NodeSet replicas={obj['spec'].get('replicas')} status={st.get('replicas')}"]
        out += [f"  condition {c}" for c in conds]
        for p in await self.pods(nodeset):
            meta = p["metadata"]
            notes = meta.get("annotations") or {}
            name = meta["name"]
            node = await self.slurm_node(name)
            slurm = f"{node.state} {node.raw.get('reason')!r}" if node is not None else "absent"
            out.append(
                f"  pod {name} {(p.get('status') or {}).get('phase')}"
                f" deleting={bool(meta.get('deletionTimestamp'))}"
                f" condemned={notes.get(ANNOTATION_CONDEMNED)}"
                f" slurm={slurm}"
            )
        if job_id is not None:
            job = await self.slurm.get_job(job_id)
            out.append(f"  job {job_id} {job.state} on {job.nodes!r} ({job.state_reason})")
        return "\n".join(out)

    async def slurm_node(self, name: str) -> Any:
        try:
            return await self.slurm.get_node(name)
        except errors.SlurmNotFound:
            return None

    async def submit(self, feature: str, seconds: int, *, name: str = "e2e", then: str = "") -> int:
        """A 1-node batch job on `feature` sleeping `seconds`, then running `then` (if any)."""
        return await self.slurm.submit_job(
            {
                "name": name,
                "constraints": feature,
                "minimum_nodes": 1,
                "maximum_nodes": 1,
                "tasks": 1,
                "current_working_directory": "/tmp",
                "environment": ["PATH=/usr/bin:/bin"],
                "time_limit": {"set": True, "number": 10},
            },
            script=f"#!/bin/sh\nsleep {seconds}\n{then}\n",
        )

    async def running_on(self, job_id: int, timeout: float = 30) -> str:
        async def running() -> str | None:
            job = await self.slurm.get_job(job_id)
            return job.nodes if job.is_running and job.nodes else None

        return await wait_for(running, timeout=timeout, what=f"job {job_id} running")

    async def job_state(self, job_id: int) -> list[str]:
        return (await self.slurm.get_job(job_id)).state

    async def completed_once(self, job_id: int, timeout: float = 60) -> Job:
        return await completed_once(self.slurm, job_id, timeout)


async def completed_once(slurm: SlurmClient, job_id: int, timeout: float = 60) -> Job:
    """Wait for the job to end and settle (no COMPLETING flag: the epilog has run); it must
    end COMPLETED and never have been requeued."""

    async def settled() -> Job | None:
        job = await slurm.get_job(job_id)
        return job if job.is_finished and "COMPLETING" not in job.state else None

    job = await wait_for(settled, timeout=timeout, interval=0.3, what=f"job {job_id} ended")
    assert job.state == ["COMPLETED"], f"job {job_id} ended {job.state} ({job.state_reason})"
    assert int(job.raw.get("restart_cnt") or 0) == 0, f"job {job_id} was requeued"
    return job


@pytest.fixture
async def env(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str
) -> AsyncIterator[Env]:
    """A Ready Cluster in the test namespace (tokens minted from the JWT key)."""
    await kube.create(
        rest.SECRETS,
        secret("slurm-jwt", **{"jwt_hs256.key": testbed.jwt_key_path.read_bytes()}),
        namespace,
    )
    await kube.create(rest.SECRETS, slurm_key_secret(testbed), namespace)
    host, port = testbed.slurmctld_addr.split(":")
    await kube.create(
        CLUSTERS,
        cluster(
            "slurm",
            testbed.slurm_rest_url,
            username="root",
            jwtKeyRef={"name": "slurm-jwt"},
            controller={"host": host, "port": int(port)},
        ),
        namespace,
    )

    async def connected() -> bool:
        return condition(await kube.get(CLUSTERS, "slurm", namespace)).get("reason") == "Connected"

    await wait_for(connected, timeout=30, what="Cluster connected")
    slurm = SlurmClient(
        testbed.slurm_rest_url, MintedToken.from_file(testbed.jwt_key_path, user="root")
    )
    e = Env(kube, slurm, testbed, namespace, operator)
    try:
        yield e
    finally:
        # Scale everything to zero first so that pods leave Slurm cleanly.
        for ns_obj in (await kube.list(NODESETS, namespace))["items"]:
            with contextlib.suppress(rest.ApiError):
                await kube.delete(NODESETS, ns_obj["metadata"]["name"], namespace)
        for job in (await slurm.list_jobs())[0] or []:
            if not job.is_finished and job.name.startswith("e2e"):
                await slurm.cancel_job(job.job_id)
        await slurm.close()


def nodeset_manifest(name: str, replicas: int, **spec: Any) -> JSON:
    return {
        "apiVersion": "slinky.slurm.net/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": name},
        "spec": {
            "clusterName": "slurm",
            "replicas": replicas,
            "selector": {"matchLabels": {"app.kubernetes.io/instance": name}},
            "template": {
                "metadata": {"labels": {"app.kubernetes.io/instance": name}},
                "spec": slurmd_pod_spec(["--conf", "CPUs=2 RealMemory=1000"]),
            },
            **spec,
        },
    }


async def wait_idle_nodes(e: Env, name: str, count: int, timeout: float = 120) -> list[str]:
    """Wait for `count` live pods of NodeSet `name`, each an IDLE, undrained Slurm node.

    A deadline, not a speed claim: on CI's loaded 2-core machine (other beds' QEMU guests
    beside it) three slurmd pods have taken over 60 s to start and register. A timeout names
    what was missing.
    """
    missing: list[str] = []

    async def idle() -> list[str] | None:
        missing.clear()
        names = await e.live_pod_names(name)
        if len(names) != count:
            missing.append(f"{len(names)}/{count} live pods")
            return None
        for n in names:
            node = await e.slurm_node(n)
            if node is None:
                missing.append(f"{n}: no Slurm node")
            elif not node.state.is_idle or node.state.is_drain:
                missing.append(f"{n}: {node.state}")
        return None if missing else names

    try:
        return await wait_for(idle, timeout=timeout, interval=0.2, what=f"{count} IDLE Slurm nodes")
    except WaitTimeout as err:
        raise WaitTimeout(f"{err}; missing: {'; '.join(missing)}") from None


async def gone(check: Callable[[], Awaitable[Any]]) -> bool:
    return (await check()) is None
