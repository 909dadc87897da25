"""Retry policy of the Slurm client, with a scripted transport (pure client logic)."""

from __future__ import annotations

import httpx2
import pytest

from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.tokens import StaticToken

OPENAPI = {"paths": {"/slurm/v0.0.45/ping/": {}}}


def client(handler: object, retries: int = 3) -> SlurmClient:
    tokens = StaticToken("secret-token-value", user="u")
    c = SlurmClient("http://slurm.test", tokens, retries=retries)
    c.http = httpx2.AsyncClient(base_url=c.url, transport=httpx2.MockTransport(handler))  # type: ignore[arg-type]
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
