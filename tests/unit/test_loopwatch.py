"""A blocked event loop is reported by the watch thread with every thread's stack, and a
loop held for a while says so once it runs again."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from slinky import loopwatch
from slinky.kube import logs
from slinky.loopwatch import LoopWatch


def hold_the_loop_for(seconds: float) -> None:
    time.sleep(seconds)  # what a synchronous call inside a reconcile would do


@contextlib.asynccontextmanager
async def watching(out: Path, **settings: Any) -> AsyncIterator[LoopWatch]:
    """A watch of the running loop, its reports written to `out`, stopped on leaving."""
    with out.open("wb") as f:
        watch = LoopWatch(asyncio.get_running_loop(), interval=0.05, fd=f.fileno(), **settings)
        watch.start()
        try:
            yield watch
        finally:
            watch.stop()


async def test_a_loop_blocked_past_the_stall_gets_every_threads_stack_once(
    tmp_path: Path,
) -> None:
    out = tmp_path / "stderr"
    async with watching(out, stall=0.3, again=60.0) as watch:
        await asyncio.sleep(0.1)
        hold_the_loop_for(1.0)
        await asyncio.sleep(0.1)
    text = out.read_text()
    assert watch.dumps == 1
    assert " ERROR slinky.loopwatch: the event loop has been blocked for" in text
    assert "hold_the_loop_for" in text  # the frame the loop is held in
    assert "most recent call first" in text


async def test_a_loop_blocked_long_is_reported_again_and_a_free_loop_never(
    tmp_path: Path,
) -> None:
    async with watching(tmp_path / "stderr", stall=0.2, again=0.4) as watch:
        for _ in range(10):
            await asyncio.sleep(0.05)
        assert watch.dumps == 0
        hold_the_loop_for(1.0)
    assert watch.dumps >= 2


async def test_a_held_loop_says_for_how_long_once_free(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(loopwatch, "LATE_S", 0.2)
    caplog.set_level(logging.WARNING, logger="slinky.loopwatch")
    async with watching(tmp_path / "stderr", stall=60.0) as watch:
        hold_the_loop_for(0.5)
        await asyncio.sleep(0.15)
    assert any("the event loop was held for" in r.getMessage() for r in caplog.records)
    assert watch.dumps == 0


async def test_with_json_logs_the_error_line_is_a_json_record(tmp_path: Path) -> None:
    out = tmp_path / "stderr"
    async with watching(out, stall=0.3, formatter=logs.formatter("json")):
        hold_the_loop_for(0.8)
    record = json.loads(out.read_text().splitlines()[0])
    assert record["level"] == "error" and record["logger"] == "slinky.loopwatch"
    assert record["msg"].startswith("the event loop has been blocked for")


def test_json_log_times_are_utc_whatever_the_hosts_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `Z` of `ts` is true on a host that is not on UTC too."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        record = logging.LogRecord("x", logging.INFO, __file__, 1, "hello", (), None)
        record.created = 1796140800.25  # 2026-12-01T16:00:00.250Z
        record.msecs = 250.0
        line = json.loads(logs.formatter("json").format(record))
        assert line["ts"] == "2026-12-01T16:00:00.250Z"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
