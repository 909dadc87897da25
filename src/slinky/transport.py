"""HTTP exchanges over pooled aiohttp connections, for the Kubernetes and slurmrestd clients.

Both clients used httpx2 before; on the bridge's hot path (a pod placed is about six
requests) it spent about 0.5 ms of CPU per request in its pool and models, aiohttp about
0.1 ms (tests/unit/test_transport.py has the measurement script's numbers in its docstring).
This module keeps what the two clients need and nothing more: one pooled session per
server, bytes in and out, and one exception for "no HTTP answer" that says whether the
request may have reached the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl as ssl_module
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp
from aiohttp.client_proto import ResponseHandler

from slinky import jsonio

Params = Mapping[str, Any] | Sequence[tuple[str, Any]] | None


class TransportError(OSError):
    """No HTTP answer: refused, lost or timed out. `sent`: the request may have reached the
    server (only an idempotent one may be sent again)."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass(frozen=True, slots=True)
class Reply:
    """An HTTP answer read whole."""

    status_code: int
    content: bytes
    reason_phrase: str = ""

    @property
    def text(self) -> str:
        return self.content.decode(errors="replace")

    def json(self) -> Any:
        return jsonio.loads(self.content)


def query(params: Params) -> list[tuple[str, str]] | None:
    """Query pairs as strings: booleans as `true`/`false`, None as an empty value (what the
    clients sent before)."""
    if not params:
        return None
    pairs = params.items() if isinstance(params, Mapping) else params
    out = []
    for k, v in pairs:
        if isinstance(v, bool):
            out.append((k, "true" if v else "false"))
        else:
            out.append((k, "" if v is None else str(v)))
    return out


def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    """`seconds` to connect and between two reads, no limit on the whole (a long list that
    keeps coming is not cut off)."""
    return aiohttp.ClientTimeout(total=None, connect=seconds, sock_read=seconds)


def _failure(e: BaseException) -> TransportError:
    not_sent = isinstance(e, aiohttp.ClientConnectorError | aiohttp.ConnectionTimeoutError)
    return TransportError(f"{type(e).__name__}: {e}", sent=not not_sent)


class Transport(Protocol):
    """What a client needs of its HTTP connection (a fake in unit tests)."""

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        content: bytes | None = None,
        timeout: float | None = None,
    ) -> Reply: ...

    async def aclose(self) -> None: ...


class Stream:
    """A streamed answer: its status, then its body line by line."""

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self.status_code = resp.status
        self.reason_phrase = resp.reason or ""
        self._resp = resp

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except (aiohttp.ClientError, TimeoutError) as e:
            raise _failure(e) from None

    async def lines(self) -> AsyncIterator[bytes]:
        """Lines of any length (aiohttp's own line reader stops at 64 KiB)."""
        buf = bytearray()
        try:
            async for chunk in self._resp.content.iter_any():
                buf += chunk
                while (end := buf.find(b"\n")) >= 0:
                    yield bytes(buf[:end])
                    del buf[: end + 1]
        except (aiohttp.ClientError, TimeoutError) as e:
            raise _failure(e) from None
        if buf:
            yield bytes(buf)


_NO_BODY = {204, 304}
_MAX_HEAD = 1 << 16


class Framing:
    """Where each answer on a connection ends, to drop what a server writes after an answer
    marked `Connection: close`.

    slurmrestd writes every error answer twice (its JSON answer marked `Connection: Close`,
    then a short text one) and closes the connection. aiohttp refuses any byte after an
    answer marked `Connection: close` and loses the first answer with them; h11 (httpx2)
    read the first and ignored the rest. Answers are followed by their `Content-Length`; one
    framed otherwise (chunked, no length, a head it cannot read) stops the tracking and
    everything passes as is. It does not know the request's method: no HEAD request on a
    connection that uses it (an answer to HEAD has a length and no body).
    """

    def __init__(self) -> None:
        self.head = bytearray()
        self.body_left = 0
        self.closing = False
        self.done = False
        self.blind = False

    def keep(self, data: bytes) -> bytes:
        """The part of `data` that belongs to answers the connection may carry."""
        if self.blind:
            return data
        if self.done:
            return b""
        try:
            return self._keep(data)
        except (ValueError, IndexError):  # a head it cannot read: aiohttp's parser decides
            self.blind = True
            return data

    def _keep(self, data: bytes) -> bytes:
        out = bytearray()
        pos = 0
        while pos < len(data):
            if self.body_left:
                take = min(self.body_left, len(data) - pos)
                out += data[pos : pos + take]
                pos += take
                self.body_left -= take
                if not self.body_left and self.closing:
                    self.done = True
                    break
                continue
            before = len(self.head)
            self.head += data[pos:]
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                out += data[pos:]
                self.blind = len(self.head) > _MAX_HEAD
                break
            used = end + 4 - before
            out += data[pos : pos + used]
            pos += used
            head = bytes(self.head[: end + 4])
            self.head.clear()
            if not self._framed(head):
                self.blind = True
                out += data[pos:]
                break
            if not self.body_left and self.closing:
                self.done = True
                break
        return bytes(out)

    def _framed(self, head: bytes) -> bool:
        """Read an answer's head: False when its end cannot be told from it."""
        lines = head.decode("latin-1").split("\r\n")
        try:
            status = int(lines[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            return False
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip().lower()
        self.closing = "close" in fields.get("connection", "")
        if status < 200 or status in _NO_BODY:
            self.body_left = 0
            return True
        length = fields.get("content-length", "")
        if "transfer-encoding" in fields or not (length.isascii() and length.isdigit()):
            return False
        self.body_left = int(length)
        return True


class _FramedHandler(ResponseHandler):
    """aiohttp's protocol, fed only what `Framing` keeps."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self._framing = Framing()

    def data_received(self, data: bytes) -> None:
        kept = self._framing.keep(data) if data else data
        if kept or not data:
            super().data_received(kept)


class Session:
    """One server's pooled connections. The aiohttp sessions are made at the first request,
    inside the event loop that uses them, and again at the first request after `aclose`
    (the bridge closes its Slurm client when its last component loses the lead, and uses it
    again when one leads again). Redirects are not followed (an answer 3xx is the caller's,
    as with httpx2: a POST redirected would come back a GET that succeeded, with the Slurm
    token sent to wherever it pointed); an idle connection is kept 5 s.

    Requests and streams use two pools. A request holds its connection for as long as its
    answer takes; `max_connections` of them at once, more wait for a free one. A stream (a
    watch) holds its connection for minutes, one each over HTTP/1.1: in the same bounded
    pool, as many open watches as the limit (an operator watching 20 namespaces has 141)
    would make every request wait until one of them ends, the leader's Lease renewal among
    them. Streams therefore have a pool of their own with no limit: each open stream is one
    connection, whatever the number, and none of them is ever one a request waits for."""

    def __init__(
        self,
        base_url: str,
        *,
        ssl: ssl_module.SSLContext | None = None,
        timeout: float = 30.0,
        max_connections: int = 100,
        drop_after_close: bool = False,
    ) -> None:
        """`max_connections`: requests in flight at once (streams are not counted).
        `drop_after_close`: ignore what the server writes after an answer marked
        `Connection: close` (slurmrestd: see `Framing`)."""
        self.base_url = base_url.rstrip("/")
        self._drop_after_close = drop_after_close
        self.timeout = timeout
        self._ssl = ssl
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._streams: aiohttp.ClientSession | None = None

    def sibling(self, max_connections: int) -> Session:
        """A session to the same server with pools of its own (the leader's Lease: nothing
        else the process sends can make its renewal wait)."""
        return Session(
            self.base_url,
            ssl=self._ssl,
            timeout=self.timeout,
            max_connections=max_connections,
            drop_after_close=self._drop_after_close,
        )

    def _make(self, limit: int) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(
            limit=limit,
            keepalive_timeout=5.0,
            ssl=self._ssl if self._ssl is not None else True,
        )
        if self._drop_after_close:  # aiohttp has no public hook for the protocol
            connector._factory = functools.partial(  # type: ignore[assignment]
                _FramedHandler, loop=asyncio.get_running_loop()
            )
        return aiohttp.ClientSession(
            connector=connector,
            timeout=_timeout(self.timeout),
            trust_env=False,
        )

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = self._make(self._max_connections)
        return self._session

    def _open_streams(self) -> aiohttp.ClientSession:
        if self._streams is None or self._streams.closed:
            self._streams = self._make(0)  # 0: no limit
        return self._streams

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
        extra: dict[str, Any] = {}
        if timeout is not None:
            extra["timeout"] = _timeout(timeout)
        try:
            async with self._open().request(
                method,
                self.base_url + path,
                params=query(params),
                headers=headers,
                data=content,
                allow_redirects=False,
                **extra,
            ) as resp:
                body = await resp.read()
                return Reply(resp.status, body, resp.reason or "")
        except (aiohttp.ClientError, TimeoutError) as e:
            raise _failure(e) from None

    @contextlib.asynccontextmanager
    async def stream(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        headers: Mapping[str, str] | None = None,
        connect_timeout: float = 30.0,
    ) -> AsyncIterator[Stream]:
        """An answer read as it comes, with no time limit once connected (watches), over a
        connection of the streams' pool."""
        timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout)
        try:
            resp = await self._open_streams().request(
                method,
                self.base_url + path,
                params=query(params),
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, TimeoutError) as e:
            raise _failure(e) from None
        try:
            yield Stream(resp)
        finally:
            resp.release()

    async def aclose(self) -> None:
        for session in (self._session, self._streams):
            if session is not None:
                await session.close()
        self._session = self._streams = None
