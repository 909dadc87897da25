"""Open watches never make a request wait, and the leader's Lease has connections of its own:
against a real local HTTP server whose watches never end (an apiserver's last minutes).

Before, watches and requests shared one pool of 100 connections: an operator watching 20
namespaces (seven watched resources each) or 100 referenced Secrets held all of them, and
every write and the Lease renewal waited for a watch to end; the Lease was lost."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from slinky.kube import rest
from slinky.kube.leader import LeaderElector
from slinky.transport import Session
from slinky_testbed.waiting import wait_for

DEADLINE_S = 5.0
LEASE_PATH = rest.LEASES.path("ns", "lead")


@dataclass
class Apiserver:
    """Watches open until `release`; GET /slow answers at `release` too; a Lease kept."""

    url: str = ""
    watches: int = 0
    slow: int = 0
    release: asyncio.Event = field(default_factory=asyncio.Event)
    lease: dict[str, object] | None = None
    lease_writes: list[str] = field(default_factory=list)

    async def handle(self, req: web.Request) -> web.StreamResponse:
        if req.query.get("watch") == "true":
            self.watches += 1
            try:
                resp = web.StreamResponse()
                await resp.prepare(req)
                await self.release.wait()
                return resp
            finally:
                self.watches -= 1
        if req.path == "/slow":
            self.slow += 1
            try:
                await self.release.wait()
            finally:
                self.slow -= 1
            return web.json_response({})
        if req.path.startswith(LEASE_PATH.rpartition("/")[0]):
            return await self.on_lease(req)
        return web.json_response({"method": req.method, "body": await req.json()})

    async def on_lease(self, req: web.Request) -> web.Response:
        if req.method == "GET":
            if self.lease is None:
                return web.json_response({"kind": "Status", "code": 404}, status=404)
            return web.json_response(self.lease)
        self.lease = await req.json()
        self.lease_writes.append(req.method)
        return web.json_response(self.lease, status=201 if req.method == "POST" else 200)


@pytest.fixture
async def apiserver() -> AsyncIterator[Apiserver]:
    api = Apiserver()
    app = web.Application()
    app.router.add_route("*", "/{p:.*}", api.handle)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    api.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    yield api
    api.release.set()
    await runner.cleanup()


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


async def watch(kube: rest.Kube, n: int) -> None:
    res = rest.Resource("", "v1", "secrets", "Secret")
    async for _ in kube.watch(res, f"ns{n}", params={"fieldSelector": f"metadata.name=s{n}"}):
        pass


async def test_a_write_completes_while_more_watches_than_the_pool_holds_stay_open(
    apiserver: Apiserver, tmp_path: Path
) -> None:
    """The operator's own client (from a kubeconfig, 100 connections for requests) with 110
    watches open: a PATCH is answered at once, and every watch is still open after it."""
    kube = rest.Kube.from_kubeconfig(kubeconfig(tmp_path / "kubeconfig", apiserver.url))
    watches = [asyncio.create_task(watch(kube, n)) for n in range(110)]
    try:
        # The old shared pool let exactly 100 through; the write then waited behind them.
        await wait_for(lambda: apiserver.watches >= 100, timeout=DEADLINE_S, what="watches open")
        async with asyncio.timeout(DEADLINE_S):
            out = await kube.patch(rest.SECRETS, "s1", {"data": {}}, "ns1")
        assert out == {"method": "PATCH", "body": {"data": {}}}
        await wait_for(lambda: apiserver.watches == 110, timeout=DEADLINE_S, what="110 watches")
        assert not any(t.done() for t in watches), "a watch ended before the server ended it"
    finally:
        for t in watches:
            t.cancel()
        await asyncio.gather(*watches, return_exceptions=True)
        await kube.close()


async def test_the_lease_is_taken_and_renewed_while_every_request_connection_is_busy(
    apiserver: Apiserver,
) -> None:
    kube = rest.Kube(Session(apiserver.url, max_connections=3), None, rest.Credentials(None))  # type: ignore[arg-type]
    busy = [asyncio.create_task(kube.request("GET", "/slow")) for _ in range(5)]
    stop = asyncio.Event()
    leading = asyncio.Event()

    async def lead(stop: asyncio.Event) -> None:
        leading.set()
        await stop.wait()

    elector = LeaderElector(
        kube,
        name="lead",
        namespace="ns",
        identity="me",
        lease_duration=3.0,
        renew_deadline=2.0,
        retry_period=0.2,
    )
    run = asyncio.create_task(elector.run(lead, stop))
    try:
        await wait_for(lambda: apiserver.slow == 3, timeout=DEADLINE_S, what="pool held")
        async with asyncio.timeout(DEADLINE_S):
            await leading.wait()
        await wait_for(
            lambda: apiserver.lease_writes.count("PUT") >= 2,
            timeout=DEADLINE_S,
            what="two renewals",
        )
        assert apiserver.slow == 3 and not any(t.done() for t in busy)
        assert not run.done()
        stop.set()
        async with asyncio.timeout(DEADLINE_S):
            await run  # releases the Lease and closes the Lease's connections
        assert apiserver.lease is not None
        assert apiserver.lease["spec"]["holderIdentity"] is None  # type: ignore[index]
    finally:
        stop.set()
        run.cancel()
        for t in busy:
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await run
        await asyncio.gather(*busy, return_exceptions=True)
        await kube.close()
