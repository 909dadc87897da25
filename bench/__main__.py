"""Run every benchmark module in this package, except those that say `IN_MAKE_BENCH = False`
(run alone: `python -m bench.<module>`)."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from bench.common import bench_testbed_if_running


def main() -> None:
    here = Path(__file__).parent
    found = [m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_")]
    if not found:
        print("no benchmarks yet")
    try:
        for name in sorted(found):
            module = importlib.import_module(f"bench.{name}")
            if getattr(module, "IN_MAKE_BENCH", True):
                module.main()
            else:
                print(f"bench.{name}: not part of make bench; run python -m bench.{name}")
    finally:
        left = bench_testbed_if_running()
        if left:
            print(
                f"\nThe benchmark test bed is left running in {left} (reused by the next "
                f"`make bench`). Stop it with:\n  .venv/bin/slinky testbed --dir {left} down"
            )


if __name__ == "__main__":
    main()
