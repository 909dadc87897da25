"""Structured logs: one line per decision, as text or JSON (`--log-format json`)."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

_STD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line; `ts` is UTC (RFC 3339, milliseconds, `Z`) whatever the
    host's time zone."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in record.__dict__.items():
            if k not in _STD and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["error"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def formatter(fmt: str = "text") -> logging.Formatter:
    """The formatter of our log lines (`--log-format`)."""
    return JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT)


def setup(level: str = "info", fmt: str = "text") -> None:
    """Configure the root logger once for a process."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "httpx2", "httpcore", "httpcore2", "aiohttp.access", "aiohttp.client"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
