"""Run every benchmark module in this package."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path


def main() -> None:
    here = Path(__file__).parent
    found = [m.name for m in pkgutil.iter_modules([str(here)]) if m.name.startswith("bench_")]
    if not found:
        print("no benchmarks yet")
    for name in sorted(found):
        importlib.import_module(f"bench.{name}").main()


if __name__ == "__main__":
    main()
