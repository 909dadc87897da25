"""The test bed's stop of one of our processes that ignores SIGTERM: the failure says where
it hung."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from slinky_testbed import procs

HANGS = """
import faulthandler, signal, time
faulthandler.register(signal.SIGQUIT, all_threads=True)
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
print("ready", flush=True)
def stuck_here():
    time.sleep(120)
stuck_here()
"""


def test_a_process_that_ignores_sigterm_is_killed_and_its_stacks_are_in_the_failure(
    tmp_path: Path,
) -> None:
    log = tmp_path / "p.log"
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-c", HANGS], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while b"ready" not in log.read_bytes():  # its handlers are set
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    with pytest.raises(AssertionError, match="did not exit 1s after SIGTERM") as failed:
        procs.terminate(proc, log, timeout=1)
    assert "stuck_here" in str(failed.value)
    assert proc.returncode is not None


def test_a_process_that_exits_gives_its_code(tmp_path: Path) -> None:
    log = tmp_path / "p.log"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    assert procs.terminate(proc, log, timeout=10) == -15
