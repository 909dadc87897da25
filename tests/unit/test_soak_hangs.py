"""The chaos soak shows where a hung process of ours hangs (CI shows its report, not the log
files): the stacks its loop watch wrote when the loop was blocked, and those it answers
SIGQUIT/SIGUSR1 with when its /healthz still fails at the end. Real processes, real signals."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from bench import soak_report

from slinky_testbed import procs

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}

BLOCKED_BY_ITS_WATCH = textwrap.dedent(
    """
    import asyncio, logging, time
    from slinky.loopwatch import LoopWatch

    def stuck_in_a_reconcile():
        time.sleep(1.0)

    async def main():
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        watch = LoopWatch(asyncio.get_running_loop(), interval=0.05, stall=0.3)
        watch.start()
        await asyncio.sleep(0.1)
        stuck_in_a_reconcile()
        await asyncio.sleep(0.1)
        logging.getLogger("after").warning("free again")
        watch.stop()

    asyncio.run(main())
    """
)

HUNG_UNDER_AMAIN = textwrap.dedent(
    """
    import argparse, time
    from slinky import process

    def parse(_argv):
        return argparse.Namespace(log_level="info", log_format="text")

    def waits_for_ever():
        time.sleep(60)

    async def run(_args, _stop):
        print("started", flush=True)
        waits_for_ever()
        return 0

    process.main(parse, run, [])
    """
)


def test_the_report_carries_the_stacks_a_blocked_loop_wrote(tmp_path: Path) -> None:
    log = tmp_path / "bridge.log"
    with log.open("wb") as f:
        subprocess.run(
            [sys.executable, "-c", BLOCKED_BY_ITS_WATCH],
            stdout=f,
            stderr=f,
            env=ENV,
            check=True,
            timeout=30,
        )
    stall = soak_report.loop_stalls(log)
    assert soak_report.LOOP_BLOCKED in stall[0]
    assert any("stuck_in_a_reconcile" in line for line in stall)
    assert not any("free again" in line for line in stall)  # up to the next log line
    assert soak_report.log_errors(log)["error_lines"] == 1


def test_a_process_whose_loop_hangs_answers_with_its_stacks_and_goes_on(tmp_path: Path) -> None:
    log = tmp_path / "bridge.log"
    with log.open("wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-c", HUNG_UNDER_AMAIN], stdout=f, stderr=f, env=ENV
        )
    try:
        deadline = time.monotonic() + 20
        while b"started" not in log.read_bytes():
            assert time.monotonic() < deadline, log.read_text()
            assert proc.poll() is None, log.read_text()
            time.sleep(0.05)
        said = procs.ask_stacks(proc.send_signal, log)
        assert "waits_for_ever" in said
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(10)
