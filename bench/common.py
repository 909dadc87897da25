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
    """The benchmark test bed (started if it is not running)."""
    bed = Testbed(Path(BENCH_DIR))
    if not bed.status_lines(only_running=True):
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
