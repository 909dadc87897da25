"""`slurm-bridge` entry point (placeholder until the bridge is built)."""

from __future__ import annotations

import sys


def main() -> None:
    print("slurm-bridge: not yet implemented in this release", file=sys.stderr)
    sys.exit(2)
