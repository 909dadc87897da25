"""What slurmctld would start from if it were killed now: its saved partition and node state,
read from the StateSaveLocation as they are on disk.

slurmctld (with `ReconfigFlags=KeepPartInfo`) refuses to start when a saved partition names a
node its saved node state lacks ("fatal: Invalid node names in partition"). Node names are
plain strings in both files (a partition's in the hostlist form its node list was written
in), so the names of a NodeSet's pods (`<nodeset>-<n>`) are found without parsing Slurm's
packing.

slurmctld writes a state file as `<file>.new`, then renames `<file>` to `<file>.old` and
`<file>.new` to `<file>`, about 0.2 ms apart (strace of 26.05). A read in between finds no
`node_state`, and so would a start (it does not fall back to `.old`: "No node state file ...
to recover"): that window is slurmctld's own, whatever its clients do, so the read is made
again once the rename is done."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from slinky.slurm.models import expand_hostlist

STATE_DIR = Path("var/spool/slurmctld")  # inside the Slurm root (slurm.conf StateSaveLocation)
RENAME_TRIES = 5
RENAME_PAUSE_S = 0.01  # the rename window is ~0.2 ms; slurmctld's thread may be descheduled


def saved_names(path: Path, nodesets: Iterable[str]) -> set[str]:
    """The names `<nodeset>-<n>` in one state file (none when it is not there)."""
    data = read_state(path)
    return names_in(data, nodesets) if data is not None else set()


def names_in(data: bytes, nodesets: Iterable[str]) -> set[str]:
    out: set[str] = set()
    for nodeset in nodesets:
        pattern = re.compile(rf"{re.escape(nodeset)}-(?:\[[0-9,\-]+\]|[0-9]+)".encode())
        out |= {n for m in pattern.findall(data) for n in expand_hostlist(m.decode())}
    return out


def read_state(path: Path) -> bytes | None:
    """The file's bytes; None when it is not there (not yet written, or between renames)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _pause() -> None:
    time.sleep(RENAME_PAUSE_S)


def unknown_in_partitions(
    root: Path, nodesets: Iterable[str], pause: Callable[[], None] = _pause
) -> set[str]:
    """Nodes of these NodeSets that the saved partitions name and the saved nodes lack: a
    start from these files is fatal. The partitions are read first (a newer file may follow
    while the nodes are read; the other order could miss a node deleted in between). A
    missing `node_state` is read again after `pause` (slurmctld may be between its two
    renames), up to RENAME_TRIES times."""
    names = list(nodesets)
    state = root / STATE_DIR
    in_partitions = saved_names(state / "part_state", names)
    if not in_partitions:
        return set()
    for _ in range(RENAME_TRIES):
        if (data := read_state(state / "node_state")) is not None:
            return in_partitions - names_in(data, names)
        pause()
    return in_partitions
