"""Shared setup for benchmarks: a dedicated test bed that stays up between runs."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from slinky_testbed import paths, procs
from slinky_testbed.bed import Testbed

BENCH_DIR = Path(
    os.environ.get("SLINKY_BENCH_TESTBED_DIR", paths.cache_dir() / "testbeds" / "bench")
)


def bench_testbed_if_running() -> Path | None:
    """The benchmark test bed's directory if any of its processes still runs."""
    bed = Testbed(Path(BENCH_DIR))
    return Path(BENCH_DIR) if bed.status_lines(only_running=True) else None


def bench_testbed(kwok_nodes: int = 4) -> Testbed:
    """The benchmark test bed, started if it is not running, and started again if it runs
    with fewer kwok nodes than `kwok_nodes` (a bench before this one brought it up smaller:
    the bridge's bursts on 4 nodes instead of 16 would measure something else)."""
    bed = Testbed(Path(BENCH_DIR))
    if bed.status_lines(only_running=True):
        have = len(bed.load().kwok_nodes)
        if have >= kwok_nodes:
            return bed
        print(f"the bench test bed runs {have} kwok nodes, {kwok_nodes} wanted: starting it again")
        bed.down(log=print)
    bed.up(real_nodes=3, kwok_nodes=kwok_nodes, log=print)
    return bed


def pct(values: list[float], p: float) -> float:
    """The p-th percentile (0-100) of `values`."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return ordered[k]


def mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else float("nan")


# What each process of the machine is, for `CpuMeter`: the first pattern found in its
# command line names it (the bridge's own and the bench's Python processes apart).
CPU_PARTS = (
    ("slinky.bridge.main", "bridge"),
    ("slinky.operator.main", "operator"),
    ("kube-apiserver", "apiserver"),
    ("etcd", "etcd"),
    ("kube-controller-manager", "controller-manager"),
    ("kube-scheduler", "kube-scheduler"),
    ("kwok", "kwok"),
    ("slurmrestd", "slurmrestd"),
    ("slurmctld", "slurmctld"),
    ("bench.", "bench"),
)


def cpu_seconds() -> dict[str, float]:
    """CPU seconds (user + system) used so far by the machine's processes, by `CPU_PARTS`
    name (the rest as `other`), from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = procs.stat_fields(entry.name)
        try:
            cmd = (
                Path(entry.path, "cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        except OSError:
            continue  # gone meanwhile
        if fields is None:
            continue
        used = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        part = next((name for pattern, name in CPU_PARTS if pattern in cmd), "other")
        out[part] = out.get(part, 0.0) + used
    return out


class CpuMeter:
    """The CPU the machine's processes used between `start` and `stop`, by part (a process
    that started or ended in between counts from 0 or until its last reading)."""

    def __init__(self) -> None:
        self.before: dict[str, float] = {}
        self.used: dict[str, float] = {}

    def start(self) -> None:
        self.before = cpu_seconds()

    def stop(self) -> dict[str, float]:
        after = cpu_seconds()
        self.used = {k: max(0.0, v - self.before.get(k, 0.0)) for k, v in after.items()}
        return self.used

    def per(self, n: int) -> str:
        """Milliseconds of CPU per item over `n` items, largest part first, and the total."""
        parts = sorted(((v, k) for k, v in self.used.items() if v * 1000 / n >= 0.5), reverse=True)
        total = sum(self.used.values()) * 1000 / n
        said = ", ".join(f"{k} {v * 1000 / n:.1f}" for v, k in parts)
        return f"{total:.0f} ms ({said})"
