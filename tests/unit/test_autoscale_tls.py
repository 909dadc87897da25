"""The metrics API's TLS material is re-read when its files change (certificate rotation)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, cast

from slinky.operator.autoscale.extapi import MetricsAPI, TLSFiles
from slinky_testbed import pki


def api(tls: TLSFiles) -> MetricsAPI:
    none = cast(Any, None)
    return MetricsAPI(
        kube=none,
        clients=none,
        metrics=none,
        nodeset_get=lambda _k: None,
        leading=lambda: True,
        tls=tls,
        allowed_names=["front-proxy-client"],
    )


async def test_serving_certificate_and_client_ca_are_reloaded_when_changed(tmp_path: Path) -> None:
    pki.ensure_pki(tmp_path)
    pki.ensure_front_proxy_pki(tmp_path)
    crt, key = pki.serving_cert(tmp_path, "one", ["10.0.0.9"])
    live_crt, live_key = tmp_path / "live.crt", tmp_path / "live.key"
    shutil.copy(crt, live_crt)
    shutil.copy(key, live_key)
    server = api(TLSFiles(live_crt, live_key, tmp_path / "front-proxy-ca.crt"))
    assert await server.load() is True  # first load
    assert await server.load() is False  # nothing changed: nothing re-read

    crt2, key2 = pki.serving_cert(tmp_path, "two", ["10.0.0.9"])
    shutil.copy(crt2, live_crt)
    shutil.copy(key2, live_key)
    os.utime(live_crt, ns=(1, 1))  # a different stamp even within one mtime tick
    assert await server.load() is True
    assert await server.load() is False
