"""Shared setup for benchmarks: a dedicated test bed that stays up between runs."""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from slinky_testbed import paths
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
