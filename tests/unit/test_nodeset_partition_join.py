"""A registered Slurm node joins its NodeSet's partition only once slurmctld has saved it
(`slinky.operator.nodeset.joins`; soak seed 17: a rolled pod's node was written into the
partition before anything made slurmctld save its registration, and for 5.6 s the state on
disk was one slurmctld refuses to start from). Against the stand-in slurmrestd of
test_nodeset_partition_leave, with the monotonic clock moved by hand."""

from __future__ import annotations

import pytest

from slinky.operator.nodeset.joins import JOIN_AFTER_S
from tests.unit.test_nodeset_partition_leave import Bed, Clock, Slurm, a_pod, slurm_node


def registered(name: str) -> dict[str, object]:
    """A dynamic node as slurmd registers it: no comment yet (the operator writes it)."""
    return {**slurm_node(name, ["IDLE"]), "comment": ""}


async def test_a_new_node_joins_only_once_its_comment_write_has_had_time_to_be_saved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock(monkeypatch)
    slurm = Slurm([slurm_node("cpu-0", ["IDLE"]), registered("cpu-1")], "cpu-0")
    bed = Bed(slurm, [a_pod("cpu-0"), a_pod("cpu-1")], shown="cpu-0")
    outcome = await bed.partitions.sync(bed.ctx, bed.view())
    assert outcome is not None and outcome.ok and outcome.recheck is None
    assert slurm.writes == [], "registered only: slurmctld has not saved it"

    slurm.nodes["cpu-1"] = slurm_node("cpu-1", ["IDLE"])  # the operator's comment write
    bed.show_nodes("cpu-0")
    outcome = await bed.partitions.sync(bed.ctx, bed.view())
    assert outcome is not None and outcome.recheck == JOIN_AFTER_S
    assert "new nodes join in 2s" in outcome.message
    clock.now += JOIN_AFTER_S - 1
    outcome = await bed.partitions.sync(bed.ctx, bed.view())
    assert slurm.writes == [] and outcome is not None and outcome.recheck == 1.0

    clock.now += 1
    outcome = await bed.partitions.sync(bed.ctx, bed.view())
    assert slurm.writes == [("partition", "cpu-0,cpu-1")]
    assert outcome is not None and outcome.recheck is None


async def test_a_node_registered_again_under_a_name_the_partition_had_waits_too(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """cpu-1's record was deleted (by an admin) and its slurmd registered again: Slurm
    dropped it from the partition, and our last write still names it."""
    clock = Clock(monkeypatch)
    slurm = Slurm([slurm_node("cpu-0", ["IDLE"]), slurm_node("cpu-1", ["IDLE"])], "cpu-[0-1]")
    bed = Bed(slurm, [a_pod("cpu-0"), a_pod("cpu-1")], shown="cpu-[0-1]")
    await bed.partitions.sync(bed.ctx, bed.view())
    del slurm.nodes["cpu-1"]
    bed.show_nodes("cpu-0")
    await bed.partitions.sync(bed.ctx, bed.view())
    assert slurm.writes == [("partition", "cpu-0")]  # written again, so slurmctld saves it

    slurm.nodes["cpu-1"] = registered("cpu-1")
    bed.show_nodes("cpu-0")
    await bed.partitions.sync(bed.ctx, bed.view())
    slurm.nodes["cpu-1"] = slurm_node("cpu-1", ["IDLE"])
    bed.show_nodes("cpu-0")
    await bed.partitions.sync(bed.ctx, bed.view())
    assert slurm.writes == [("partition", "cpu-0")]
    clock.now += JOIN_AFTER_S
    await bed.partitions.sync(bed.ctx, bed.view())
    assert slurm.writes == [("partition", "cpu-0"), ("partition", "cpu-0,cpu-1")]


async def test_nodes_the_partition_names_stay_across_an_operator_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A new process knows no clock: what Slurm's partition names is in, and stays."""
    Clock(monkeypatch)
    slurm = Slurm([slurm_node(n, ["IDLE"]) for n in ("cpu-0", "cpu-1")], "cpu-[0-1]")
    bed = Bed(slurm, [a_pod("cpu-0"), a_pod("cpu-1")], shown="cpu-[0-1]")
    outcome = await bed.partitions.sync(bed.ctx, bed.view())
    assert outcome is not None and outcome.ok and outcome.recheck is None
    assert slurm.writes == []
    bed.show_nodes(None)  # then slurmctld loses the partition: made again with both at once
    await bed.partitions.sync(bed.ctx, bed.view())
    assert slurm.writes == [("partition", "cpu-0,cpu-1")]
