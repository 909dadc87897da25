"""The HTTP transport both clients use, against a real local HTTP server.

Why aiohttp: a client sending 4,000 small PATCH requests (16 at a time, keep-alive, JSON
answers of 1 KB) to a local aiohttp server spent 591 us of CPU per request with httpx2 and
102 us with aiohttp on the development machine (one run each, 2026-11-29).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from slinky.kube import rest
from slinky.transport import Framing, Session, TransportError, query


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, list[web.Request]]]:
    seen: list[web.Request] = []

    async def echo(req: web.Request) -> web.StreamResponse:
        seen.append(req)
        if req.path.endswith("/watch"):
            resp = web.StreamResponse()
            await resp.prepare(req)
            await resp.write(b'{"type":"ADDED","object":{"big":"' + b"x" * 100_000 + b'"}}\n')
            await resp.write(b'{"type":"MODIFIED",')
            await resp.write(b'"object":{}}\n\n{"type":"ERROR","object":{"code":410}}\n')
            return resp
        if req.path == "/moved":
            raise web.HTTPFound("/elsewhere")
        if req.path == "/broken":
            assert req.transport is not None
            req.transport.close()
            return web.Response()
        return web.json_response(
            {"method": req.method, "query": list(req.query.items()), "body": await req.text()},
            status=int(req.query.get("status", "200")),
        )

    app = web.Application()
    app.router.add_route("*", "/{p:.*}", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", seen
    await runner.cleanup()


def test_query_values_are_sent_as_the_clients_sent_them_before() -> None:
    assert query({"a": True, "b": False, "c": None, "d": 3}) == [
        ("a", "true"),
        ("b", "false"),
        ("c", ""),
        ("d", "3"),
    ]
    assert query([("k", "1"), ("k", "2")]) == [("k", "1"), ("k", "2")]
    assert query(None) is None


async def test_an_answer_is_read_whole_with_its_status(
    server: tuple[str, list[web.Request]],
) -> None:
    url, _ = server
    http = Session(url)
    try:
        reply = await http.request(
            "PATCH", "/x", params={"status": 422, "dry": True}, content=b'{"a":1}'
        )
        assert reply.status_code == 422
        assert reply.json() == {
            "method": "PATCH",
            "query": [["status", "422"], ["dry", "true"]],
            "body": '{"a":1}',
        }
    finally:
        await http.aclose()


async def test_a_redirect_is_the_callers_and_a_closed_session_opens_again(
    server: tuple[str, list[web.Request]],
) -> None:
    """A POST redirected is not sent again as a GET elsewhere (with its token); a session
    closed (the bridge's Slurm client when its components lose the lead) serves again."""
    url, seen = server
    http = Session(url)
    reply = await http.request("POST", "/moved", content=b"{}", headers={"X-Token": "t"})
    assert reply.status_code == 302
    assert [r.path for r in seen] == ["/moved"]
    await http.aclose()
    assert (await http.request("GET", "/x")).status_code == 200
    await http.aclose()


async def test_no_answer_is_a_transport_error_that_says_whether_it_was_sent(
    server: tuple[str, list[web.Request]],
) -> None:
    url, _ = server
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    refused = Session(f"http://127.0.0.1:{closed}")
    with pytest.raises(TransportError) as e:
        await refused.request("POST", "/x", content=b"{}")
    assert not e.value.sent
    await refused.aclose()
    http = Session(url)
    with pytest.raises(TransportError) as e:
        await http.request("POST", "/broken", content=b"{}")
    assert e.value.sent  # it reached the server: a POST is not sent again
    assert isinstance(e.value, OSError)  # callers that catch OSError catch it
    await http.aclose()


async def test_a_watch_yields_events_of_any_length_and_raises_its_error_event(
    server: tuple[str, list[web.Request]],
) -> None:
    url, _ = server
    kube = rest.Kube(Session(url), None, rest.Credentials(None))  # type: ignore[arg-type]
    events = []

    async def run() -> None:
        async for event in kube.watch(rest.Resource("", "v1", "watch", "X", namespaced=False)):
            events.append(event)

    with pytest.raises(rest.ApiError) as e:
        await run()
    assert e.value.code == 410
    assert [ev["type"] for ev in events] == ["ADDED", "MODIFIED"]
    assert len(events[0]["object"]["big"]) == 100_000  # aiohttp's line reader stops at 64 KiB
    await kube.close()


async def test_a_refused_token_file_is_read_again_once(
    tmp_path: Path, server: tuple[str, list[web.Request]]
) -> None:
    """The kubelet rotates a pod's service-account token in its file: a 401 makes the client
    read the file again and send the request once more."""
    from lightkube.config.client_adapter import BearerTokenFileAuth

    url, seen = server
    token = tmp_path / "token"
    token.write_text("old\n")
    creds = rest.Credentials(BearerTokenFileAuth(str(token)))
    assert await creds.headers() == {"Authorization": "Bearer old"}
    token.write_text("new\n")
    assert await creds.headers() == {"Authorization": "Bearer old"}  # kept: no read per request
    await creds.refresh("Bearer old")
    assert await creds.headers() == {"Authorization": "Bearer new"}
    await creds.refresh("Bearer old")  # a second request refused with the old one: no change
    assert creds.header == "Bearer new"

    kube = rest.Kube(Session(url), None, creds)  # type: ignore[arg-type]
    token.write_text("newer\n")
    with pytest.raises(rest.ApiError):
        await kube.request("GET", "/x", params={"status": 401})
    assert [r.headers["Authorization"] for r in seen] == ["Bearer new", "Bearer newer"]
    await kube.close()


DOUBLED = (
    b"HTTP/1.1 404 NOT FOUND\r\nConnection: Close\r\nContent-Length: 13\r\n"
    b"Content-Type: application/json\r\n\r\n"
    b'{"errors":[]}'
    b"HTTP/1.1 404 NOT FOUND\r\nConnection: Close\r\nContent-Length: 9\r\n\r\nnot found"
)
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}"


@pytest.mark.parametrize("cut", [1, 5, 40, 80, 95, 97, len(DOUBLED)])
def test_framing_keeps_answers_and_drops_what_follows_a_closing_one(cut: int) -> None:
    stream = OK + b"HTTP/1.1 304 Not Modified\r\nContent-Length: 7\r\n\r\n" + OK + DOUBLED
    first = DOUBLED.index(b"HTTP/1.1", 1)
    f = Framing()
    kept = b"".join(f.keep(stream[i : i + cut]) for i in range(0, len(stream), cut))
    assert kept == stream[: len(stream) - len(DOUBLED) + first]


@pytest.mark.parametrize(
    "head",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n{}",  # a latin-1 superscript 2
        b"HTTP/1.1 200 OK\r\n\r\n{}",
        b"garbage\r\n\r\n",
    ],
)
def test_framing_stands_aside_for_answers_it_cannot_frame(head: bytes) -> None:
    f = Framing()
    assert f.keep(head) == head
    assert f.keep(DOUBLED) == DOUBLED  # blind from then on: aiohttp's parser decides


async def test_a_doubled_error_answer_is_read_as_its_first(tmp_path: Path) -> None:
    """slurmrestd writes each error answer twice on a connection it closes; aiohttp alone
    refuses the bytes after the first and loses it (the e2e test of a refused submission
    saw `Data after Connection: close` where Slurm's error should have been)."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(OK)  # a kept-alive answer first, then the doubled error on the same
        await writer.drain()
        await reader.readuntil(b"\r\n\r\n")
        writer.write(DOUBLED)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    for drop, expect_error in ((True, False), (False, True)):
        http = Session(url, drop_after_close=drop)
        assert (await http.request("GET", "/a")).status_code == 200
        if expect_error:
            with pytest.raises(TransportError):
                await http.request("GET", "/b")
        else:
            reply = await http.request("GET", "/b")
            assert (reply.status_code, reply.json()) == (404, {"errors": []})
        await http.aclose()
    server.close()
    await server.wait_closed()
