"""The slurmd container's preStop hook (`builder.pre_stop`), run by a real /bin/sh against a
stand-in `scontrol` (and `sleep`) that answer from a script of replies and log each call.

What it must do: DRAIN, wait while jobs run, DOWN, delete the node record; with the NodeSet's
own partition (`$SLINKY_PARTITION`), delete the record only once the node has left that
partition and slurmctld had time to save it so (a start from a saved partition that names a
node the saved nodes lack is fatal), and never when the node did not leave it or Slurm could
not say; end at once when the operator already deleted the node."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

from slinky.operator.nodeset import builder

# A reply per line of `plan` ("<rc> <text>"), the last one repeated; every call logged.
FAKE = """#!/bin/sh
echo "${0##*/} $*" >> "$FAKE_DIR/calls"
[ "${0##*/}" = sleep ] && exit 0
[ "$1 $2" = "-o show" ] || exit 0
n=$(cat "$FAKE_DIR/n" 2>/dev/null || echo 0); echo $((n + 1)) > "$FAKE_DIR/n"
reply=$(sed -n "$((n + 1))p" "$FAKE_DIR/plan")
[ -n "$reply" ] || reply=$(tail -n 1 "$FAKE_DIR/plan")
echo "${reply#* }"
exit "${reply%% *}"
"""


def shown(state: str, partitions: str = "all,cpu") -> tuple[str, int]:
    line = f"NodeName=cpu-0 Arch=x86_64 CPUs=2 State={state} ThreadsPerCore=1"
    if partitions:
        line += f" Partitions={partitions}"
    return (line + " BootTime=None", 0)


ABSENT = ("Node cpu-0 not found", 1)
UNREACHABLE = ("slurm_load_node error: Unable to contact slurm controller (connect failure)", 1)


def run(tmp_path: Path, plan: list[tuple[str, int]], partition: str | None) -> list[str]:
    """Run the hook; return the commands it ran, in order."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("scontrol", "sleep"):
        path = bin_dir / tool
        path.write_text(FAKE)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "plan").write_text("".join(f"{rc} {text}\n" for text, rc in plan))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOSTNAME": "cpu-0", "FAKE_DIR": str(tmp_path)}
    if partition is not None:
        env[builder.ENV_PARTITION] = partition
    script = builder.pre_stop()["exec"]["command"]
    subprocess.run(script, env={**os.environ, **env}, check=True, timeout=60)
    calls = (tmp_path / "calls").read_text().splitlines()
    return [c for c in calls if not c.startswith("scontrol -o show")]


def test_without_a_partition_it_drains_waits_for_jobs_downs_and_deletes(tmp_path: Path) -> None:
    plan = [shown("IDLE"), shown("IDLE"), shown("MIXED+DRAIN"), shown("IDLE+DRAIN")]
    calls = run(tmp_path, plan, partition=None)
    assert calls == [
        "scontrol update nodename=cpu-0 state=DRAIN reason=slurm-operator: pod terminating",
        "sleep 1",  # a job still ran
        "scontrol update nodename=cpu-0 state=DOWN reason=slurm-operator: pod terminating",
        "scontrol delete nodename=cpu-0",
    ]


def test_a_node_the_operator_deleted_ends_the_hook_at_once(tmp_path: Path) -> None:
    assert run(tmp_path, [ABSENT], partition="cpu") == []


def test_with_a_partition_it_deletes_only_after_the_node_left_it_and_a_save(
    tmp_path: Path,
) -> None:
    # The operator takes the terminating pod's node out of the partition after two looks.
    inside = shown("DOWN+DRAIN", "all,cpu")
    drained = shown("IDLE+DRAIN")
    plan = [drained, drained, drained, inside, inside, shown("DOWN+DRAIN", "all")]
    calls = run(tmp_path, plan, partition="cpu")
    assert calls == [
        "scontrol update nodename=cpu-0 state=DOWN reason=slurm-operator: pod terminating",
        "sleep 1",
        "sleep 1",
        f"sleep {builder.STATE_SAVE_S:.0f}",  # slurmctld saves the partition without it
        "scontrol delete nodename=cpu-0",
    ]


def test_a_partition_of_a_similar_name_is_not_the_nodesets(tmp_path: Path) -> None:
    plan = [shown("IDLE+DRAIN", "all,cpu-big")]
    calls = run(tmp_path, plan, partition="cpu")
    assert calls[-2:] == [f"sleep {builder.STATE_SAVE_S:.0f}", "scontrol delete nodename=cpu-0"]


def test_a_node_still_in_the_partition_or_slurm_unreachable_is_never_deleted(
    tmp_path: Path,
) -> None:
    # Slurm answers, then cannot be reached: "cannot tell" counts as still inside.
    plan = [shown("IDLE+DRAIN"), shown("IDLE+DRAIN"), shown("DOWN+DRAIN"), UNREACHABLE]
    calls = run(tmp_path, plan, partition="cpu")
    assert not any("delete" in c for c in calls), calls
    assert calls.count("sleep 1") == builder.PRESTOP_PARTITION_WAIT_S


def test_a_node_put_back_into_the_partition_meanwhile_waits_again(tmp_path: Path) -> None:
    # Out at the first look, back in after the wait for slurmctld's save (a pod informer
    # that lagged), then out again: the wait starts over before the delete.
    drained, out = shown("IDLE+DRAIN"), shown("DOWN+DRAIN", "all")
    inside = shown("DOWN+DRAIN", "all,cpu")
    plan = [drained, drained, drained, out, inside, inside, out, out]
    calls = run(tmp_path, plan, partition="cpu")
    save = f"sleep {builder.STATE_SAVE_S:.0f}"
    assert calls[1:] == [save, "sleep 1", save, "scontrol delete nodename=cpu-0"], calls


def test_slurm_unreachable_while_a_job_runs_is_waited_on_as_busy(tmp_path: Path) -> None:
    """slurmctld down (or restarting) while the pod stops: a failed read is "still busy",
    so slurmd is not let go under a job that may run; the wait ends once Slurm says the
    node is idle (the job ended meanwhile) or that it is gone."""
    plan = [shown("MIXED"), shown("MIXED"), UNREACHABLE, UNREACHABLE, UNREACHABLE]
    plan += [shown("MIXED+DRAIN"), shown("IDLE+DRAIN")]
    calls = run(tmp_path, plan, partition=None)
    assert calls.count("sleep 1") == 4, calls  # 3 unreachable looks + 1 busy one
    assert calls[-2:] == [
        "scontrol update nodename=cpu-0 state=DOWN reason=slurm-operator: pod terminating",
        "scontrol delete nodename=cpu-0",
    ]


def test_a_node_deleted_while_the_hook_waits_ends_it(tmp_path: Path) -> None:
    plan = [shown("MIXED"), shown("MIXED"), UNREACHABLE, ABSENT]
    calls = run(tmp_path, plan, partition=None)
    assert not any("DOWN" in c or "delete" in c for c in calls), calls
