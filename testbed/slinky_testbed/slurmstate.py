"""What slurmctld would start from if it were killed now: its saved partition and node state,
read from the StateSaveLocation as they are on disk.

slurmctld (with `ReconfigFlags=KeepPartInfo`) refuses to start when a saved partition names a
node its saved node state lacks ("fatal: Invalid node names in partition"). Node names are
plain strings in both files (a partition's in the hostlist form its node list was written
in), so the names of a NodeSet's pods (`<nodeset>-<n>`) are found without parsing Slurm's
packing."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from slinky.slurm.models import expand_hostlist

STATE_DIR = Path("var/spool/slurmctld")  # inside the Slurm root (slurm.conf StateSaveLocation)


def saved_names(path: Path, nodesets: Iterable[str]) -> set[str]:
    """The names `<nodeset>-<n>` in one state file (none when it is not there)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return set()
    out: set[str] = set()
    for nodeset in nodesets:
        pattern = re.compile(rf"{re.escape(nodeset)}-(?:\[[0-9,\-]+\]|[0-9]+)".encode())
        out |= {n for m in pattern.findall(data) for n in expand_hostlist(m.decode())}
    return out


def unknown_in_partitions(root: Path, nodesets: Iterable[str]) -> set[str]:
    """Nodes of these NodeSets that the saved partitions name and the saved nodes lack: a
    start from these files is fatal. The partitions are read first (a newer file may follow
    while the nodes are read; the other order could miss a node deleted in between)."""
    names = list(nodesets)
    state = root / STATE_DIR
    in_partitions = saved_names(state / "part_state", names)
    return in_partitions - saved_names(state / "node_state", names) if in_partitions else set()
