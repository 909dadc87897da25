"""Where the test bed keeps its cached binaries and its per-instance state."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """The cache shared by all test beds on this machine (`~/.cache/slinky` by default)."""
    return Path(os.environ.get("SLINKY_CACHE", Path.home() / ".cache" / "slinky"))


def bin_dir() -> Path:
    """Built binaries: kube-*, kubectl, kwok, helm, etcd."""
    return cache_dir() / "bin"


def slurm_root_tarball() -> Path:
    """The zstd tarball of the Debian sid root file system holding Slurm."""
    return cache_dir() / "slurm-root-sid.tar.zst"


def kwok_stages_file() -> Path:
    """kwok's stage definitions (node and pod lifecycle), copied from its module at build."""
    return cache_dir() / "kwok-stages.yaml"


def default_state_dir() -> Path:
    """State of the default test bed (plain `slinky testbed up`; `make dev` uses `testbeds/dev`)."""
    return Path(os.environ.get("SLINKY_TESTBED_DIR", cache_dir() / "testbeds" / "default"))


def hack_dir() -> Path:
    """The repository's `hack/` folder holding the build scripts."""
    return Path(__file__).resolve().parents[2] / "hack"
