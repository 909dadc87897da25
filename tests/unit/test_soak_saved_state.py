"""Reading slurmctld's saved state as a restart would (`slinky_testbed.slurmstate`), and the
soak's spans of state a restart refuses."""

from __future__ import annotations

import struct
from pathlib import Path

from bench.soak_report import spans

from slinky_testbed import slurmstate


def packed(*strings: str) -> bytes:
    """Strings as Slurm packs them (a 32-bit length, the bytes, a NUL) amid other fields."""
    out = b"\x00\x0bPROTOCOL_VERSION\x00\x2a\x00"
    for s in strings:
        raw = s.encode() + b"\x00"
        out += struct.pack(">I", len(raw)) + raw + b"\x00\x00\x00\x01"
    return out


def write(root: Path, part: bytes | None, node: bytes | None) -> None:
    state = root / slurmstate.STATE_DIR
    state.mkdir(parents=True, exist_ok=True)
    for name, data in (("part_state", part), ("node_state", node)):
        if data is not None:
            (state / name).write_bytes(data)


def test_the_names_of_a_nodeset_in_either_form(tmp_path: Path) -> None:
    path = tmp_path / "part_state"
    path.write_bytes(packed("all", "ALL", "compute", "compute-[0-2],compute-7", "big", "big-1"))
    assert slurmstate.saved_names(path, ["compute"]) == {f"compute-{i}" for i in (0, 1, 2, 7)}
    assert slurmstate.saved_names(path, ["big", "none"]) == {"big-1"}
    assert slurmstate.saved_names(tmp_path / "missing", ["compute"]) == set()


def test_a_partition_naming_a_node_the_saved_nodes_lack_is_found(tmp_path: Path) -> None:
    part = packed("all", "ALL", "compute", "compute-[0-1],compute-10", "big", "big-1")
    write(tmp_path, part, packed("compute-0", "{}", "compute-10", "big-1"))
    assert slurmstate.unknown_in_partitions(tmp_path, ["compute", "big"]) == {"compute-1"}
    write(tmp_path, part, packed("compute-0", "compute-1", "compute-10", "big-1"))
    assert slurmstate.unknown_in_partitions(tmp_path, ["compute", "big"]) == set()


def test_a_read_between_slurmctlds_two_renames_is_made_again(tmp_path: Path) -> None:
    """The soak's one-sample span (seed 11): slurmctld had renamed node_state to .old and
    not yet node_state.new into place. That read is made again once the rename is done; a
    node_state that stays missing still counts as lacking every node."""
    part = packed("compute", "compute-[0-1]")
    write(tmp_path, part, None)
    state = tmp_path / slurmstate.STATE_DIR
    (state / "node_state.old").write_bytes(packed("compute-0"))
    (state / "node_state.new").write_bytes(packed("compute-0", "compute-1"))
    renames: list[str] = []

    def rename() -> None:
        renames.append("node_state.new")
        (state / "node_state.new").rename(state / "node_state")

    assert slurmstate.unknown_in_partitions(tmp_path, ["compute"], pause=rename) == set()
    assert renames == ["node_state.new"]

    (state / "node_state").unlink()
    (state / "node_state.new").write_bytes(packed("compute-0", "compute-1"))
    waited: list[int] = []
    missing = slurmstate.unknown_in_partitions(
        tmp_path, ["compute"], pause=lambda: waited.append(1)
    )
    assert missing == {"compute-0", "compute-1"}
    assert len(waited) == slurmstate.RENAME_TRIES


def test_no_state_yet_is_nothing_to_refuse(tmp_path: Path) -> None:
    assert slurmstate.unknown_in_partitions(tmp_path, ["compute"]) == set()
    write(tmp_path, None, packed("compute-0"))
    assert slurmstate.unknown_in_partitions(tmp_path, ["compute"]) == set()


def test_samples_join_into_spans() -> None:
    samples = [(10.0, ["a"]), (10.5, ["b"]), (11.0, ["a"]), (20.0, ["c"])]
    assert spans(samples, gap=2.0) == [(10.0, 11.0, ["a", "b"]), (20.0, 20.0, ["c"])]
