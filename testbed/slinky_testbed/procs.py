"""Processes the test bed started, identified by PID *and* start time so that `down` never
signals a recycled PID."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path


def stat_fields(pid: int | str) -> list[str] | None:
    """/proc/<pid>/stat from field 3 (state) on, or None if the process is gone; the command
    name (field 2) may hold spaces, so it is split after its ')'."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()


def start_time(pid: int) -> int | None:
    """The process' start time in clock ticks since boot, or None if it is gone."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[19])  # field 22


@dataclass(frozen=True)
class Proc:
    """A process we started."""

    pid: int
    started: int

    @classmethod
    def of(cls, pid: int) -> Proc:
        started = start_time(pid)
        if started is None:
            raise ProcessLookupError(pid)
        return cls(pid, started)

    def alive(self) -> bool:
        if start_time(self.pid) != self.started:
            return False
        fields = stat_fields(self.pid)
        return fields is not None and fields[0] != "Z"

    def signal(self, sig: int, *, group: bool = False) -> None:
        if not self.alive():
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group and os.getpgid(self.pid) == self.pid:
                os.killpg(self.pid, sig)
            else:
                os.kill(self.pid, sig)


def stop_all(procs: list[Proc], *, grace: float = 10.0) -> list[Proc]:
    """SIGTERM each process (and its process group if it leads one), SIGKILL what is left
    after `grace` seconds. Returns what still runs (normally nothing)."""
    for p in procs:
        p.signal(signal.SIGTERM, group=True)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(p.alive() for p in procs):
        reap()
        time.sleep(0.05)
    for p in procs:
        p.signal(signal.SIGKILL, group=True)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(p.alive() for p in procs):
        reap()
        time.sleep(0.05)
    return [p for p in procs if p.alive()]


def reap() -> None:
    """Collect this process' exited children, so they leave the process table."""
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def free_ports(n: int) -> list[int]:
    """`n` distinct free ports (held open together so they differ)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def ask_stacks(send: Callable[[int], None], log_path: Path, wait: float = 5.0) -> str:
    """Ask one of our processes where it hangs and return what it wrote to its log since:
    SIGUSR1 logs each asyncio task's stack (when its loop is free), SIGQUIT each thread's
    (faulthandler, even with the loop blocked). The process goes on."""
    size = log_path.stat().st_size
    send(signal.SIGUSR1)
    send(signal.SIGQUIT)
    deadline = time.monotonic() + wait
    while (
        time.monotonic() < deadline
        and b"most recent call first" not in log_path.read_bytes()[size:]
    ):
        time.sleep(0.1)
    time.sleep(0.2)  # SIGUSR1's report is written by the loop, after the dump
    return log_path.read_bytes()[size:].decode(errors="replace")


def log_tail(path: Path, n: int, contains: str | None = None) -> str:
    """The last `n` lines of a process's log (of those containing `contains`, if given)."""
    lines = path.read_text(errors="replace").splitlines()
    if contains is not None:
        lines = [line for line in lines if contains in line]
    return "\n".join(lines[-n:])


def terminate(proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> int:
    """SIGTERM one of our processes and wait `timeout` s for its exit code. One that does not
    exit is asked where it hangs (SIGUSR1: each asyncio task's stack; SIGQUIT: each thread's,
    even with its loop blocked), killed, and the failure carries the end of its log."""
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        pass
    ask_stacks(proc.send_signal, log_path)
    proc.kill()
    proc.wait(10)
    tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-150:])
    raise AssertionError(f"{proc.args!r} did not exit {timeout:.0f}s after SIGTERM:\n{tail}")
