"""A TLS server certificate read from files (a Secret mounted by Helm or cert-manager) and read
again whenever either file changes, so a rotated certificate is served without a restart; a
half-written pair is ignored until it is complete. The bridge's webhook and secure /metrics
serve with it."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from pathlib import Path

from slinky.background import BackgroundLoop

log = logging.getLogger(__name__)


class ServingCertificate(BackgroundLoop):
    """An SSLContext whose certificate follows the files on disk.

    A changed pair is loaded into a fresh context and served only once it loaded whole: loading
    into the live context would leave it with the new certificate and no matching key after a
    failed load (a half-written rotation, a wrong key), and every handshake would fail while
    (a webhook with failurePolicy Fail: every pod refused). The
    serving context's SNI callback, which OpenSSL calls on every handshake (with or without a
    server name), hands each connection the newest good context.
    """

    def __init__(self, cert: Path, key: Path, *, interval: float = 1.0) -> None:
        self.cert = cert
        self.key = key
        self.interval = interval
        self.loads = 0
        self._stamp = self._stat()
        self.context = self._load()  # a bad pair fails start-up
        self.context.sni_callback = self._pick_current
        self._current = self.context

    def _load(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        return context

    def _pick_current(
        self, conn: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None, _ctx: ssl.SSLContext
    ) -> None:
        if conn.context is not self._current:
            conn.context = self._current

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        out = []
        for path in (self.cert, self.key):
            st = os.stat(path)
            out.append((st.st_mtime_ns, st.st_size, st.st_ino))
        return tuple(out)

    def task_name(self) -> str:
        return f"certificate reloader ({self.cert})"

    def reload_if_changed(self) -> bool:
        try:
            stamp = self._stat()
            if stamp == self._stamp:
                return False
            fresh = self._load()
        except (OSError, ssl.SSLError) as e:
            log.warning("certificate %s not reloaded (keeping the old one): %s", self.cert, e)
            return False
        self._current = fresh
        self._stamp = stamp
        self.loads += 1
        log.info("certificate %s reloaded", self.cert)
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            self.reload_if_changed()
