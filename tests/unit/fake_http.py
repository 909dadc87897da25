"""A slurmrestd (or any server) in a function, behind `slinky.transport.Transport`.

Handlers take an `httpx2.Request` and give an `httpx2.Response` (httpx2's models are handy
for building answers); an httpx2 connection error raised by a handler becomes the
TransportError the real transport raises: `sent=False` for a refused or timed-out connect.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import httpx2

from slinky.transport import Params, Reply, TransportError, query

Handler = Callable[[httpx2.Request], httpx2.Response | Awaitable[httpx2.Response]]
_NOT_SENT = (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout)


class MockTransport:
    def __init__(self, base_url: str, handler: Handler) -> None:
        self.base_url = base_url.rstrip("/")
        self.handler = handler

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        timeout: float | None = None,
    ) -> Reply:
        pairs: Any = query(params)
        req = httpx2.Request(
            method, self.base_url + path, params=pairs, headers=headers, content=content
        )
        try:
            resp = self.handler(req)
            if inspect.isawaitable(resp):
                resp = await resp
        except httpx2.HTTPError as e:
            sent = not isinstance(e, _NOT_SENT)
            raise TransportError(f"{type(e).__name__}: {e}", sent=sent) from None
        return Reply(resp.status_code, resp.read(), resp.reason_phrase)

    async def aclose(self) -> None:
        pass
