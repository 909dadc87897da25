"""The webhook's HTTPS server on loopback: certificate rotation and bodies that are not an
AdmissionReview (real TLS handshakes and HTTP requests, no apiserver)."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import httpx2
import pytest

from slinky.bridge.admission.server import (
    MUTATE_PATH,
    VALIDATE_PATH,
    AdmissionHandlers,
    AdmissionServer,
)
from slinky.bridge.config import parse_config
from slinky.kube.tls import ServingCertificate


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed loopback certificate and key named `name`."""
    crt, key = directory / f"{name}.crt", directory / f"{name}.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
         "-nodes", "-days", "1", "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(crt)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return crt, key


async def served_name(port: int, ca: Path) -> str:
    """The CN of the certificate the server on `port` presents (verified against `ca`)."""
    client = ssl.create_default_context(cafile=str(ca))
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client)
    try:
        peer = writer.get_extra_info("peercert")
        return str(dict(rdn[0] for rdn in peer["subject"])["commonName"])
    finally:
        writer.close()
        await writer.wait_closed()


async def test_a_failed_reload_keeps_serving_the_old_pair_and_a_whole_pair_is_served(
    tmp_path: Path,
) -> None:
    old_crt, old_key = self_signed(tmp_path, "old")
    new_crt, new_key = self_signed(tmp_path, "new")
    live = tmp_path / "live"
    live.mkdir()
    (live / "tls.crt").write_bytes(old_crt.read_bytes())
    (live / "tls.key").write_bytes(old_key.read_bytes())
    cert = ServingCertificate(live / "tls.crt", live / "tls.key")
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0, ssl=cert.context)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await served_name(port, old_crt) == "old"
        # Half-way through a rotation: the new certificate, the old key.
        (live / "tls.crt").write_bytes(new_crt.read_bytes())
        assert not cert.reload_if_changed()
        assert await served_name(port, old_crt) == "old"
        (live / "tls.key").write_bytes(new_key.read_bytes())
        assert cert.reload_if_changed()
        assert await served_name(port, new_crt) == "new"
    finally:
        server.close()
        await server.wait_closed()


async def never_managed(namespace: str) -> bool:
    return False


@pytest.fixture
async def webhook(tmp_path: Path) -> AsyncIterator[tuple[str, Path]]:
    crt, key = self_signed(tmp_path, "webhook")
    server = AdmissionServer(
        AdmissionHandlers(parse_config({}, environ={}), never_managed), ServingCertificate(crt, key)
    )
    await server.start("127.0.0.1:0")
    try:
        yield f"https://127.0.0.1:{server.port}", crt
    finally:
        await server.stop()


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b'{"request": "x"}',
        b'{"request": {"uid": 7}}',
        b'{"request": {"uid": "u", "kind": "Pod"}}',
        b'{"request": {"uid": "u", "object": []}}',
        b'{"request": {"uid": "u", "oldObject": 1}}',
    ],
)
@pytest.mark.parametrize("path", [MUTATE_PATH, VALIDATE_PATH])
async def test_a_body_that_is_not_an_admission_review_gets_400(
    webhook: tuple[str, Path], path: str, body: bytes
) -> None:
    url, ca = webhook
    async with httpx2.AsyncClient(verify=ssl.create_default_context(cafile=str(ca))) as http:
        answer = await http.post(url + path, content=body)
    assert answer.status_code == 400
    assert "AdmissionReview" in answer.text


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, path: str) -> bytes:
    """One POST on an open connection; the answer's head."""
    body = b"not json"
    writer.write(
        f"POST {path} HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    return head.lower()


async def test_a_draining_server_answers_with_connection_close_so_kept_connections_move_on(
    tmp_path: Path,
) -> None:
    """After SIGTERM the replica keeps serving while its endpoint leaves the Service; a
    connection the apiserver kept open must not stay on it until it closes under a review."""
    crt, key = self_signed(tmp_path, "webhook")
    server = AdmissionServer(
        AdmissionHandlers(parse_config({}, environ={}), never_managed), ServingCertificate(crt, key)
    )
    await server.start("127.0.0.1:0")
    client = ssl.create_default_context(cafile=str(crt))
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port, ssl=client)
    try:
        first = await exchange(reader, writer, MUTATE_PATH)
        assert b"connection: close" not in first  # kept alive while serving
        server.drain()
        second = await exchange(reader, writer, MUTATE_PATH)  # the same connection still answers
        assert b" 400 " in second
        assert b"connection: close" in second
        assert await asyncio.wait_for(reader.read(), timeout=5) == b""  # then closed by the server
    finally:
        writer.close()
        await server.stop()
