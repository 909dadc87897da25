"""The signals a hung process answers with its state (what `kubectl exec -- kill -USR1 1`
gives an operator of a stuck pod)."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

import pytest

from slinky import process


def parse(_argv: list[str] | None) -> argparse.Namespace:
    return argparse.Namespace(log_level="info", log_format="text")


async def test_sigusr1_logs_where_each_task_waits_and_the_process_goes_on(
    capfd: pytest.CaptureFixture[str],
) -> None:
    said = ""

    async def parked_somewhere() -> None:
        await asyncio.Event().wait()

    async def run(_args: argparse.Namespace, stop: asyncio.Event) -> int:
        parked = asyncio.create_task(parked_somewhere(), name="parked-task")
        await asyncio.sleep(0)
        os.kill(os.getpid(), signal.SIGUSR1)
        nonlocal said
        for _ in range(100):  # the handler runs on a later turn of the loop
            said += capfd.readouterr().err
            if "parked-task" in said:
                break
            await asyncio.sleep(0.01)
        parked.cancel()
        return 0 if not stop.is_set() else 9

    try:
        assert await process.amain(parse, run, []) == 0
    finally:
        asyncio.get_running_loop().remove_signal_handler(signal.SIGUSR1)
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().remove_signal_handler(sig)
    assert "SIGUSR1:" in said
    line = next(x for x in said.splitlines() if "parked-task" in x)
    assert "test_process_signals.py" in line  # the frame it waits in
