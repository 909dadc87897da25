"""Each pytest-xdist worker runs its own test beds, side by side on the host."""

from __future__ import annotations

import os
from pathlib import Path

from slinky_testbed import paths


def worker_bed_dir(env_var: str, name: str) -> Path:
    """`$env_var`, else `~/.cache/slinky/testbeds/<name>`; suffixed with the xdist worker's id
    (`-gw1`) when the run is split across workers."""
    base = Path(os.environ.get(env_var, paths.cache_dir() / "testbeds" / name))
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    return base.with_name(f"{base.name}-{worker}") if worker else base
