"""Retry policy of the Slurm client, with a scripted transport (pure client logic)."""

from __future__ import annotations

import httpx2
import pytest

from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.tokens import StaticToken
from tests.unit.fake_http import MockTransport

OPENAPI = {"paths": {"/slurm/v0.0.45/ping/": {}}}


def client(handler: object, retries: int = 3) -> SlurmClient:
    tokens = StaticToken("secret-token-value", user="u")
    c = SlurmClient("http://slurm.test", tokens, retries=retries)
    c.http = MockTransport(c.url, handler)
    return c


async def test_connection_errors_are_retried_then_reported_unavailable() -> None:
    calls = []

    def handler(req: httpx2.Request) -> httpx2.Response:
        calls.append(req.url.path)
        raise httpx2.ConnectError("refused", request=req)

    c = client(handler, retries=2)
    with pytest.raises(errors.SlurmUnavailable, match="unreachable"):
        await c.list_nodes()
    assert len(calls) == 3, "one try and two retries"


async def test_an_http_error_answer_is_never_retried() -> None:
    calls = []

    def handler(req: httpx2.Request) -> httpx2.Response:
        calls.append(req.url.path)
        if req.url.path == "/openapi/v3":
            return httpx2.Response(200, json=OPENAPI)
        return httpx2.Response(
            404, json={"errors": [{"error_number": 2017, "error": "Invalid job id"}]}
        )

    c = client(handler)
    with pytest.raises(errors.SlurmNotFound):
        await c.get_job(7)
    assert calls == ["/openapi/v3", "/slurm/v0.0.45/job/7"]


async def test_a_refused_token_is_refreshed_once_then_auth_error() -> None:
    calls = []

    def handler(req: httpx2.Request) -> httpx2.Response:
        calls.append(req.headers.get("X-SLURM-USER-TOKEN"))
        return httpx2.Response(401, text="Authentication failure")

    c = client(handler)
    with pytest.raises(errors.SlurmAuthError) as info:
        await c.ping()
    assert calls == ["secret-token-value", "secret-token-value"]
    assert "secret-token-value" not in str(info.value) + repr(info.value)


async def test_the_client_reads_slurmrestds_doubled_error_answers() -> None:
    """slurmrestd writes each error answer twice on a connection it closes; the client keeps
    the first (Slurm's error, classified), where aiohttp alone reported no answer at all
    (tests/unit/test_transport.py)."""
    import asyncio
    import json

    from slinky.slurm import errors
    from slinky.slurm.client import SlurmClient
    from slinky.slurm.tokens import StaticToken

    paths = json.dumps({"paths": {"/slurm/v0.0.45/ping/": {}}}).encode()
    missing = json.dumps({"errors": [{"error_number": 2017, "error": "Invalid job id"}]})

    def answer(status: str, body: bytes, close: bool) -> bytes:
        extra = b"Connection: Close\r\n" if close else b""
        head = f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n".encode()
        return head + extra + b"\r\n" + body

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer("200 OK", paths, False))
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer("404 NOT FOUND", missing.encode(), True))
        writer.write(answer("404 NOT FOUND", b"Invalid job id", True))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    c = SlurmClient(f"http://127.0.0.1:{port}", StaticToken("t", user="root"), retries=0)
    with pytest.raises(errors.SlurmError) as e:
        await c.call("GET", "job/1")
    assert not isinstance(e.value, errors.SlurmUnavailable)
    assert e.value.status == 404
    await c.close()
    server.close()
    await server.wait_closed()
