"""slinky.slurm against the test bed's real slurmctld + slurmrestd: node and job operations,
typed errors, token providers, and the Slurm informer (events, deletions, outages)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import jwt
import pytest

from slinky.kube import rest
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmEvent, SlurmInformer
from slinky.slurm.tokens import MintedToken, StaticToken, TokenFile
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for
from tests.e2e.nodeset_fixtures import slurm_key_secret, slurmd_pod_spec

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]


@pytest.fixture
async def client(testbed: Testbed) -> AsyncIterator[SlurmClient]:
    c = SlurmClient(
        testbed.slurm_rest_url, MintedToken.from_file(testbed.jwt_key_path, user="root")
    )
    yield c
    await c.close()


SlurmdFactory = Callable[[str], Awaitable[str]]


@pytest.fixture
async def slurmd(
    kube: rest.Kube, testbed: Testbed, namespace: str, client: SlurmClient
) -> AsyncIterator[SlurmdFactory]:
    """Start a slurmd pod on a real node; returns the Slurm node name once IDLE."""
    started: list[str] = []
    await kube.create(rest.SECRETS, slurm_key_secret(testbed), namespace)

    async def start(feature: str) -> str:
        name = f"n{uuid.uuid4().hex[:8]}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": slurmd_pod_spec(
                [
                    "-D",
                    "-Z",
                    "--conf-server",
                    testbed.slurmctld_addr,
                    "--conf",
                    f"CPUs=2 RealMemory=1000 Features={feature}",
                ]
            ),
        }
        await kube.create(rest.PODS, pod, namespace)
        started.append(name)

        async def idle() -> bool:
            with contextlib.suppress(errors.SlurmNotFound):
                return (await client.get_node(name)).state.is_idle
            return False

        await wait_for(idle, timeout=60, what=f"slurmd {name} IDLE")
        return name

    yield start
    for name in started:
        with contextlib.suppress(rest.ApiError):
            await kube.delete(rest.PODS, name, namespace, grace_period=0)
        with contextlib.suppress(errors.SlurmError):
            await client.delete_node(name)


async def test_version_negotiated_to_newest_served_and_ping(client: SlurmClient) -> None:
    ping = await client.ping()
    assert client.version == "v0.0.45"
    assert ping.responding and ping.slurm_version.startswith("26.05")
    assert (await client.diag())["req_time"]


async def test_older_client_falls_back_to_what_both_speak(testbed: Testbed) -> None:
    c = SlurmClient(
        testbed.slurm_rest_url,
        MintedToken.from_file(testbed.jwt_key_path, user="root"),
        versions=("v0.0.99", "v0.0.44"),
    )
    try:
        await c.ping()
        assert c.version == "v0.0.44"
        c2 = SlurmClient(c.url, c.tokens, versions=("v0.0.99",))
        with pytest.raises(errors.SlurmVersionUnsupported, match=r"v0\.0\.45"):
            await c2.ping()
        await c2.close()
    finally:
        await c.close()


async def test_drain_and_undrain_round_trip_reason(
    client: SlurmClient, slurmd: SlurmdFactory
) -> None:
    name = await slurmd("drainme")
    await client.drain_node(name, "slurm-operator: test drain")
    node = await client.get_node(name)
    assert node.state.is_drain and node.state.is_drained
    assert node.reason == "slurm-operator: test drain"
    assert "drainme" in node.features
    await client.undrain_node(name)

    async def undrained() -> bool:
        n = await client.get_node(name)
        return not n.state.is_drain and n.state.is_idle

    await wait_for(undrained, timeout=10, what="node back to IDLE")
    await client.update_node(name, comment='{"podName": "x"}')
    assert (await client.get_node(name)).comment == '{"podName": "x"}'


async def test_busy_node_delete_is_distinguishable_and_job_completes(
    client: SlurmClient, slurmd: SlurmdFactory
) -> None:
    name = await slurmd("busy")
    job_id = await client.submit_job(
        {
            "name": "busy",
            "constraints": "busy",
            "tasks": 1,
            "current_working_directory": "/tmp",
            "environment": ["PATH=/usr/bin:/bin"],
            "time_limit": {"set": True, "number": 5},
        },
        script="#!/bin/sh\nsleep 30\n",
    )

    async def running() -> bool:
        return (await client.get_job(job_id)).is_running

    await wait_for(running, timeout=30, what="job running")
    await client.update_job(job_id, {"comment": "slinky e2e"})
    assert (await client.get_job(job_id)).comment == "slinky e2e"
    node = await client.get_node(name)
    assert node.state.is_busy and not node.state.is_drained
    await client.drain_node(name, "slurm-operator: test")
    assert not (await client.get_node(name)).state.is_drained, "DRAIN while a job runs"
    with pytest.raises(errors.SlurmNodeBusy):
        await client.delete_node(name)
    await client.cancel_job(job_id)
    await client.cancel_job(job_id)  # idempotent


async def test_not_found_answers_are_typed(client: SlurmClient) -> None:
    with pytest.raises(errors.SlurmNotFound):
        await client.get_node("no-such-node")
    with pytest.raises(errors.SlurmNotFound):
        await client.drain_node("no-such-node", "x")
    with pytest.raises(errors.SlurmNotFound):
        await client.delete_node("no-such-node")
    with pytest.raises(errors.SlurmNotFound):
        await client.get_job(999_999)
    await client.cancel_job(999_999)


async def test_external_node_and_placeholder_job_allocation(client: SlurmClient) -> None:
    node = f"ext-{uuid.uuid4().hex[:6]}"
    feature = f"f{uuid.uuid4().hex[:6]}"
    await client.create_node(
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs=4 RealMemory=4000 Features={feature}"
        " State=EXTERNAL"
    )
    try:
        assert "EXTERNAL" in str((await client.get_node(node)).state)
        job_id = await client.submit_job(
            {
                "name": "placeholder",
                "flags": ["EXTERNAL_JOB"],
                "constraints": feature,
                "minimum_nodes": 1,
                "tasks": 1,
                "cpus_per_task": 2,
                "time_limit": {"set": True, "number": 10},
                "current_working_directory": "/tmp",
                "environment": ["PATH=/usr/bin:/bin"],
            }
        )

        async def allocated() -> Any:
            job = await client.get_job(job_id)
            return job if job.is_running and job.nodes else None

        job = await wait_for(allocated, timeout=30, what="placeholder job allocated")
        assert job.nodes == node and job.time_limit_min == 10
        res = await client.job_resources(job_id)
        assert node in str(res.raw)
        await client.cancel_job(job_id)

        async def freed() -> bool:
            return (await client.get_node(node)).state.base == "IDLE"

        await wait_for(freed, timeout=30, what="cancel frees the node")
    finally:
        with contextlib.suppress(errors.SlurmError):
            await client.delete_node(node)
    with pytest.raises(errors.SlurmNotFound):
        await client.get_node(node)


async def test_partitions_and_reservations_list(client: SlurmClient) -> None:
    parts = await client.list_partitions()
    assert "all" in [p.name for p in parts]
    assert (await client.get_partition("all")).name == "all"
    with pytest.raises(errors.SlurmNotFound):
        await client.get_partition("no-such-partition")
    assert isinstance(await client.list_reservations(), list)


# ---------------------------------------------------------------- tokens


async def test_expired_token_is_refreshed_transparently(testbed: Testbed) -> None:
    key = testbed.jwt_key_path.read_bytes()
    tokens = MintedToken(key, user="root", lifetime=60)
    now = int(time.time())
    # Hand out a token that has already expired, as if the process slept through its renewal.
    tokens._token = jwt.encode({"sun": "root", "iat": now - 120, "exp": now - 60}, key, "HS256")
    tokens._expires = time.time() + 3600
    c = SlurmClient(testbed.slurm_rest_url, tokens)
    try:
        await c.list_nodes()
        assert tokens.minted == 1, "refused token replaced by a freshly minted one"
    finally:
        await c.close()


async def test_minted_tokens_renew_before_expiry(testbed: Testbed) -> None:
    tokens = MintedToken.from_file(
        testbed.jwt_key_path, user="root", lifetime=3, refresh_before=1.5
    )
    c = SlurmClient(testbed.slurm_rest_url, tokens)
    try:
        first = await tokens.token()
        await c.ping()
        await wait_for(lambda: _differs(tokens, first), timeout=5, what="token renewed")
        await c.list_nodes()
    finally:
        await c.close()


async def _differs(tokens: MintedToken, first: str) -> bool:
    return await tokens.token() != first


async def test_wrong_key_gives_auth_error_without_the_token(testbed: Testbed) -> None:
    tokens = MintedToken(b"definitely-not-the-slurm-jwt-key", user="root")
    c = SlurmClient(testbed.slurm_rest_url, tokens)
    try:
        with pytest.raises(errors.SlurmAuthError) as info:
            await c.list_nodes()
        token = await tokens.token()
        assert tokens.minted == 2, "one refresh before giving up"
        assert token not in str(info.value) and token not in repr(info.value)
        assert "authentication" in str(info.value).lower()
    finally:
        await c.close()


async def test_token_file_is_reread_when_it_changes(testbed: Testbed, tmp_path: Any) -> None:
    path = tmp_path / "token"
    path.write_text("garbage\n")
    c = SlurmClient(testbed.slurm_rest_url, TokenFile(path, user="root"))
    try:
        with pytest.raises(errors.SlurmAuthError):
            await c.list_nodes()
        path.write_text(testbed.mint_slurm_token() + "\n")
        await c.list_nodes()
        assert "garbage" not in repr(c.tokens)
    finally:
        await c.close()


async def test_static_token_missing_credentials_is_auth_error(testbed: Testbed) -> None:
    c = SlurmClient(testbed.slurm_rest_url, StaticToken("", user="root"))
    try:
        with pytest.raises(errors.SlurmAuthError):
            await c.ping()
    finally:
        await c.close()


# ---------------------------------------------------------------- informer


async def test_informer_reports_scontrol_drain_and_deletes(
    client: SlurmClient, slurmd: SlurmdFactory, testbed: Testbed
) -> None:
    inf = SlurmInformer(client, poll_interval=0.5, resync_interval=5)
    seen: list[SlurmEvent] = []
    inf.subscribe(seen.append)
    inf.start()
    try:
        await asyncio.wait_for(inf.wait_synced(), 10)
        name = await slurmd("inf")
        await wait_for(lambda: name in inf.nodes, timeout=5, what="node cached")
        seen.clear()
        drain = ["scontrol", "update", f"nodename={name}", "state=drain", "reason=admin: maint"]
        out = await asyncio.to_thread(testbed.slurm, drain)
        assert out.returncode == 0

        def drained() -> bool:
            return any(
                e.type == "UPDATED" and e.name == name and e.new.state.is_drain for e in seen
            )

        # Deadline: two poll intervals, plus 1 s for scontrol and the poll itself.
        await wait_for(drained, timeout=2 * 0.5 + 1.0, interval=0.02, what="drain event")
        assert inf.nodes[name].reason == "admin: maint"
        # Deleted behind the informer's back (the slurmd is stopped first, then the record).
        down = ["scontrol", "update", f"nodename={name}", "state=down", "reason=gone"]
        await asyncio.to_thread(testbed.slurm, down)
        await asyncio.to_thread(testbed.slurm, ["scontrol", "delete", f"nodename={name}"])
        await wait_for(
            lambda: any(e.type == "DELETED" and e.name == name for e in seen),
            timeout=inf.resync_interval + 2,
            what="delete event",
        )
        assert name not in inf.nodes
    finally:
        await inf.stop()


async def test_informer_keeps_state_and_reports_stale_while_slurmrestd_is_down(
    client: SlurmClient, slurmd: SlurmdFactory, testbed: Testbed
) -> None:
    name = await slurmd("outage")
    inf = SlurmInformer(client, poll_interval=0.5, resync_interval=5, max_backoff=2)
    seen: list[SlurmEvent] = []
    inf.subscribe(seen.append)
    inf.start()
    try:
        await asyncio.wait_for(inf.wait_synced(), 10)
        assert name in inf.nodes and not inf.stale
        await asyncio.to_thread(testbed.stop_component, "slurmrestd")
        try:
            await wait_for(lambda: inf.stale, timeout=10, what="informer stale")
            assert name in inf.nodes, "the last known state is kept"
            assert any(e.type == "STALE" for e in seen)
            stale_since = time.monotonic()
            await wait_for(
                lambda: time.monotonic() - stale_since >= 10 and inf.stale,
                timeout=20,
                interval=0.5,
                what="10 s of outage",
            )
        finally:
            await asyncio.to_thread(testbed.start_component, "slurmrestd")
        await wait_for(lambda: not inf.stale, timeout=15, what="informer recovered by itself")
        assert any(e.type == "FRESH" for e in seen)
        assert name in inf.nodes
    finally:
        await inf.stop()


async def test_idle_informer_sends_few_requests(client: SlurmClient) -> None:
    inf = SlurmInformer(client, poll_interval=0.2, resync_interval=60)
    inf.start()
    try:
        await asyncio.wait_for(inf.wait_synced(), 10)
        # Other tests' slurmd may still be leaving Slurm: start once things are quiet.
        start = inf.unchanged_polls
        await wait_for(lambda: inf.unchanged_polls >= start + 3, timeout=30, what="quiet Slurm")
        polls, unchanged = inf.polls, inf.unchanged_polls
        await wait_for(lambda: inf.polls >= polls + 10, timeout=10, what="10 polls")
        assert inf.unchanged_polls - unchanged >= 8, "304s, not lists, while nothing changes"
    finally:
        await inf.stop()
