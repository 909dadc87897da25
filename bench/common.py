"""Shared setup for benchmarks: a dedicated test bed that stays up between runs."""

from __future__ import annotations

import statistics
from pathlib import Path

from slinky_testbed import paths
from slinky_testbed.bed import Testbed


def bench_testbed(kwok_nodes: int = 4) -> Testbed:
    """The benchmark test bed (started if it is not running)."""
    bed = Testbed(Path(paths.cache_dir() / "testbeds" / "bench"))
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
