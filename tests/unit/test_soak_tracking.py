"""The chaos soak's bookkeeping of Slurm jobs (bench/soak_work.track_jobs): a job Slurm lost
in a slurmctld kill -9 is not mistaken for the job that was given its id afterwards."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, cast

from bench import soak_work
from bench.soak_state import Soak, TrackedJob

from slinky.slurm.models import Job
from slinky_testbed import dev_bridge


def soak(tmp_path: Path) -> Soak:
    return Soak(
        bed=cast(Any, None),
        kube=cast(Any, None),
        slurm=cast(Any, None),
        ports=cast(Any, None),
        out=tmp_path,
        echo=lambda _line: None,
    )


def listed(job_id: int, name: str, state: str, comment: str = "") -> Job:
    return Job.parse(
        {"job_id": job_id, "name": name, "job_state": [state], "admin_comment": comment}
    )


def test_a_lost_batch_job_whose_id_went_to_a_placeholder_job_is_retired_as_gone(
    tmp_path: Path,
) -> None:
    s = soak(tmp_path)
    s.track(TrackedJob(62, "soak-b38", "batch", 1, 5, 100.0), 100.0)
    soak_work.track_jobs(s, [listed(62, "soak-b38", "PENDING")], 101.0)
    soak_work.track_jobs(s, [], 105.0)  # slurmctld killed -9: the job is gone
    comment = json.dumps(
        {"pods": ["slurm-bridge/p"], "uids": ["u"], "scheduler": dev_bridge.SCHEDULER_NAME}
    )
    soak_work.track_jobs(s, [listed(62, "slurm-bridge/p", "RUNNING", comment)], 110.0)
    soak_work.track_jobs(s, [listed(62, "slurm-bridge/p", "CANCELLED", comment)], 120.0)

    lost, now = s.all_jobs()
    assert (lost.name, lost.vanished_at, lost.final_state) == ("soak-b38", 105.0, "PENDING")
    assert (now.name, now.placeholder, now.final_state) == ("slurm-bridge/p", True, "CANCELLED")
    assert s.jobs[62] is now


def test_a_new_submission_given_a_lost_jobs_id_keeps_both(tmp_path: Path) -> None:
    s = soak(tmp_path)
    s.track(TrackedJob(7, "soak-b1", "batch", 1, 5, 100.0), 100.0)
    s.track(TrackedJob(7, "soak-b2", "batch", 1, 5, 110.0), 110.0)
    assert [(j.name, j.vanished_at) for j in s.all_jobs()] == [
        ("soak-b1", 110.0),
        ("soak-b2", None),
    ]


def test_a_job_revived_and_requeued_by_a_slurmctld_kill_right_after_it_completed_is_slurms(
    tmp_path: Path,
) -> None:
    """The 30-minute soak: job 52 completed 0.6 s before slurmctld was killed -9; the restored
    state had it running, its batch script was gone from the node, Slurm requeued it and it
    completed again. The soak's polls never saw the first completion; slurmctld.log did."""
    from bench.soak_report import SLURM, judge_job

    s = soak(tmp_path)
    first_done = datetime(2026, 11, 26, 14, 35, 2, 32000).timestamp()
    job = TrackedJob(52, "soak-c3", "compute", 1, 38, first_done - 40)
    job.states = [(first_done - 38, "RUNNING"), (first_done + 150, "PENDING"),
                  (first_done + 190, "COMPLETED")]  # fmt: skip
    job.restart_cnt, job.first_end, job.ended_at = 1, "COMPLETED", first_done + 190
    job.last = listed(52, "soak-c3", "COMPLETED")
    s.slurmctld_kills.append(first_done + 0.6)
    log = {52: ["[2026-11-26T14:35:02.032] _job_complete: JobId=52 WEXITSTATUS 0"]}
    verdict = judge_job(s, job, log)
    assert verdict.verdict == SLURM, verdict
    assert "requeued it" in verdict.why


def test_a_job_whose_allocation_a_slurmctld_kill_lost_while_its_step_ran_is_slurms(
    tmp_path: Path,
) -> None:
    """The soak: job 49 was allocated batch-0 and launched; slurmctld was killed -9 before
    it saved that, came back with the job PENDING, found its step running on batch-0,
    revoked the credential there and failed the job's next launch."""
    from bench.soak_report import KILLED, SLURM, judge_job

    s = soak(tmp_path)
    allocated = datetime(2026, 11, 29, 15, 28, 30).timestamp()
    job = TrackedJob(49, "soak-b30", "batch", 1, 55, allocated - 180)
    job.states = [(allocated + 20, "FAILED")]
    job.first_end, job.ended_at = "FAILED", allocated + 20
    job.last = listed(49, "soak-b30", "FAILED")
    log = {
        49: [
            "[2026-11-29T15:28:30.000] sched: Allocate JobId=49 NodeList=batch-0 #CPUs=1",
            "[2026-11-29T15:28:37.013] error: Registered PENDING JobId=49 StepId=49.batch on "
            "node batch-0",
            "[2026-11-29T15:28:38.008] Killing non-startable batch JobId=49: Job credential "
            "revoked",
        ]
    }
    assert judge_job(s, job, log).verdict == KILLED  # no slurmctld kill: ours to explain
    s.slurmctld_kills.append(allocated + 0.8)
    verdict = judge_job(s, job, log)
    assert verdict.verdict == SLURM, verdict
    assert "revoked" in verdict.why


def test_a_breach_spanning_a_second_slurmctld_kill_gets_its_grace_from_the_last_kill() -> None:
    """The soak: pods bound where Slurm no longer allocated, right after a slurmctld kill -9;
    slurmctld was killed again 16.6 s later and the bridge repaired it 13.5 s after that
    restart, 32.5 s after the first: within the grace counted from the last kill."""
    from bench.soak_invariants import INVARIANTS, InvariantWatch

    misbound = next(i for i in INVARIANTS if i.name.startswith("pods bound where"))
    watch = InvariantWatch([100.0, 116.6])
    first = 100.2
    assert watch.allowed_until(misbound, first, now=110.0) == 130.0  # one kill so far
    assert watch.allowed_until(misbound, first, now=132.7) == 146.6  # the second restarts it
    far = InvariantWatch([10.0])  # a kill long before: no extra grace
    assert far.allowed_until(misbound, first, now=110.0) == first + misbound.grace_s


def test_a_bridge_pod_deleted_because_a_slurmctld_kill_lost_its_job_is_slurms(
    tmp_path: Path,
) -> None:
    """Soak run 14b: slurmctld killed -9 came back from state saved before a gang's and a
    pod's jobs: one job unknown, the other's id given to another pod's job. The bridge
    deleted the pods (their jobs were gone): Slurm's loss. Without a kill near, the same
    deletion is ours."""
    from bench.soak_report import POD_BAD, POD_SLURM, judge_pod
    from bench.soak_state import BridgePod

    s = soak(tmp_path)
    s.slurmctld_kills.append(146.5)
    for message in (
        "SlurmJobEnded: Slurm job 10 is no longer known to Slurm: deleting the pod",
        "SlurmJobEnded: Slurm job 9 is no longer this pod's (slurmctld restarted from older "
        "saved state and gave the id to another job): its own job is gone; deleting the pod",
    ):
        pod = BridgePod("p3", "", 26, False, created_at=135.5, bound_at=145.7, gone_at=157.8)
        verdict = judge_pod(s, pod, {"p3": [message]}, {})
        assert verdict.verdict == POD_SLURM, verdict
        s.slurmctld_kills.clear()
        assert judge_pod(s, pod, {"p3": [message]}, {}).verdict == POD_BAD
        s.slurmctld_kills.append(146.5)


def test_times_in_the_soak_log_round_to_a_valid_minute_and_second(tmp_path: Path) -> None:
    s = soak(tmp_path)
    s.started_at = 1000.0
    assert s.rel(1000.0 + 6 * 60 + 59.97) == "+07:00.0"  # printed "+06:60.0"
    assert s.rel(1000.0 + 6 * 60 + 59.94) == "+06:59.9"
    assert s.rel(999.0) == "+00:00.0"


def test_a_job_launched_twice_across_a_slurmctld_kill_and_held_is_slurms(
    tmp_path: Path,
) -> None:
    """Soak seed 1 (30 minutes): jobs 126 and 132 were allocated batch-0 and launched;
    slurmctld was killed -9 a second later, before it saved that, came back with them
    PENDING, allocated them batch-0 again, found them running there ("Duplicate jobid on
    nodes batch-0, set to state DRAIN") and requeued them held (JobHeldUser)."""
    from bench.soak_report import KILLED, SLURM, judge_job

    s = soak(tmp_path)
    allocated = datetime(2026, 12, 1, 21, 8, 15).timestamp()
    job = TrackedJob(126, "soak-b77", "batch", 1, 26, allocated - 300)
    job.states = [(allocated, "RUNNING"), (allocated + 7, "PENDING")]
    job.last = Job.parse(
        {"job_id": 126, "name": "soak-b77", "job_state": ["PENDING"], "state_reason": "JobHeldUser"}
    )
    log = {
        126: [
            "[2026-12-01T21:08:15.000] sched: Allocate JobId=126 NodeList=batch-0 #CPUs=1",
            "[2026-12-01T21:08:17.839] Recovered JobId=126 Assoc=0",
            "[2026-12-01T21:08:20.004] sched: Allocate JobId=126 NodeList=batch-0 #CPUs=1",
            "[2026-12-01T21:08:20.053] Requeuing JobId=126",
        ]
    }
    assert job.held
    assert judge_job(s, job, log).verdict == KILLED  # no slurmctld kill: ours to explain
    s.slurmctld_kills.append(allocated + 1.3)
    verdict = judge_job(s, job, log)
    assert verdict.verdict == SLURM, verdict
    assert "second launch" in verdict.why


def test_a_job_slurmctld_requeued_when_its_node_was_cut_off_is_slurms_unless_we_deleted_a_pod(
    tmp_path: Path,
) -> None:
    """The soak (seed 5): job 216 was given batch-2 a second after its node was cut off;
    slurmctld could not launch it there and requeued it itself. That is Slurm's handling of a
    partition, unless the operator deleted a pod of the job's nodes meanwhile."""
    from types import SimpleNamespace

    from bench.soak_report import KILLED, SLURM, judge_job
    from bench.soak_state import NodeFault

    s = soak(tmp_path)
    s.bed = cast(Any, SimpleNamespace(logs=tmp_path))
    allocated = datetime(2026, 12, 7, 3, 52, 13).timestamp()
    job = TrackedJob(216, "soak-b95", "batch", 2, 60, allocated - 170)
    job.running_since = allocated
    job.nodes_seen = {"batch-2", "batch-0"}
    job.states = [(allocated, "RUNNING"), (allocated + 130, "COMPLETED")]
    job.first_end, job.ended_at = "COMPLETED", allocated + 130
    job.restart_cnt = 1
    job.last = listed(216, "soak-b95", "COMPLETED")
    log = {
        216: [
            "[2026-12-07T03:52:13.002] sched: Allocate JobId=216 NodeList=batch-[2,0] #CPUs=2",
            "[2026-12-07T03:52:23.281] _job_complete: requeue JobId=216 per user/system request",
        ]
    }
    assert judge_job(s, job, log).verdict == KILLED  # no fault to explain it
    s.node_cuts.append(NodeFault(allocated - 5, "node-1", ["batch-1", "batch-2"], allocated + 55))
    verdict = judge_job(s, job, log)
    assert verdict.verdict == SLURM, verdict
    assert "cut off" in verdict.why
    (tmp_path / "operator.log").write_text(
        "2026-12-07 03:52:15,100 INFO slinky.operator.nodeset.podcontrol: "
        "deleted pod slurm/batch-2 (uid 1)\n"
    )
    assert judge_job(s, job, log).verdict == KILLED  # a pod of its nodes deleted by us


def test_a_job_slurm_could_not_launch_on_a_cut_off_node_is_slurms_whatever_came_later(
    tmp_path: Path,
) -> None:
    """Soak run 24, job 105: allocated batch-0 while the soak had cut node-0 off, slurmctld
    could not launch it and requeued it (logged as a status 0 end, then the requeue); it
    completed later. A rolling update deleted batch-0's pod 2.5 min after the requeue and
    slurmctld was killed -9 after that: neither explains it (the report said slurmctld had
    revived a completed job)."""
    from types import SimpleNamespace

    from bench.soak_report import SLURM, completed_in_log, judge_job
    from bench.soak_state import NodeFault

    s = soak(tmp_path)
    s.bed = cast(Any, SimpleNamespace(logs=tmp_path))
    allocated = datetime(2026, 12, 7, 11, 39, 23).timestamp()
    s.node_cuts.append(NodeFault(allocated - 5, "node-0", ["batch-0"], allocated + 75))
    (tmp_path / "operator.log").write_text(
        "2026-12-07 11:42:03,100 INFO slinky.operator.nodeset.podcontrol: deleted pod "
        "slurm/batch-0 (uid u)\n"
    )
    s.slurmctld_kills.append(allocated + 197)
    job = TrackedJob(105, "soak-b51", "batch", 1, 28, allocated - 240)
    job.running_since = allocated + 2
    job.nodes_seen = {"batch-0"}
    job.states = [(allocated + 2, "RUNNING"), (allocated + 11, "PENDING"),
                  (allocated + 370, "COMPLETED")]  # fmt: skip
    job.restart_cnt, job.first_end, job.ended_at = 1, "COMPLETED", allocated + 370
    job.last = listed(105, "soak-b51", "COMPLETED")
    log = {
        105: [
            "[2026-12-07T11:39:23.005] sched: Allocate JobId=105 NodeList=batch-0 #CPUs=1",
            "[2026-12-07T11:39:33.289] _job_complete: JobId=105 WEXITSTATUS 0",
            "[2026-12-07T11:39:33.289] _job_complete: requeue JobId=105 per user/system request",
            "[2026-12-07T11:39:33.290] _job_complete: JobId=105 done",
        ]
    }
    assert completed_in_log(log[105]) is None
    verdict = judge_job(s, job, log)
    assert verdict.verdict == SLURM, verdict
    assert "cut off" in verdict.why, verdict.why


def test_a_job_that_timed_out_because_its_end_could_not_leave_a_cut_off_node_is_slurms(
    tmp_path: Path,
) -> None:
    """Soak seed 31, job 206: 35 s of work on compute-[1,3] with a 2-minute limit; the soak
    cut compute-1's node off 14 s after the job started, for 88 s; the work ended in the cut
    and slurmctld, which heard nothing, ended the job TIMEOUT 32 s after the cut ended. That
    is Slurm's handling of a partition, unless the operator deleted a pod of its nodes."""
    from types import SimpleNamespace

    from bench.soak_report import KILLED, SLURM, judge_job
    from bench.soak_state import NodeFault

    s = soak(tmp_path)
    s.bed = cast(Any, SimpleNamespace(logs=tmp_path))
    started = datetime(2026, 12, 7, 15, 33, 4).timestamp()
    job = TrackedJob(206, "soak-c24", "compute", 2, 35, started - 10)
    job.running_since = started
    job.nodes_seen = {"compute-1", "compute-3"}
    job.states = [(started, "RUNNING"), (started + 134, "TIMEOUT")]
    job.first_end, job.ended_at = "TIMEOUT", started + 134
    job.last = listed(206, "soak-c24", "TIMEOUT")
    log = {206: ["[2026-12-07T15:35:18.004] Time limit exhausted for JobId=206"]}
    assert judge_job(s, job, log).verdict == KILLED  # no fault to explain it
    cut = NodeFault(started + 14, "node-1", ["batch-1", "compute-0", "compute-1"], started + 102)
    s.node_cuts.append(cut)
    verdict = judge_job(s, job, log)
    assert verdict.verdict == SLURM, verdict
    assert "could not report the end" in verdict.why
    # The work ended before the cut: the cut does not explain a TIMEOUT.
    s.node_cuts[0] = NodeFault(started + 40, cut.node, cut.slurm_nodes, started + 102)
    assert judge_job(s, job, log).verdict == KILLED
    s.node_cuts[0] = cut
    # As in the soak: its nodes' pods deleted by the scale-in 54 ms and 6 s after slurmctld
    # ended the job (their Slurm nodes drained by then).
    (tmp_path / "operator.log").write_text(
        "2026-12-07 15:35:18,058 INFO slinky.operator.nodeset.podcontrol: "
        "deleted pod slurm/compute-3 (uid 1)\n"
        "2026-12-07 15:35:24,144 INFO slinky.operator.nodeset.podcontrol: "
        "deleted pod slurm/compute-1 (uid 2)\n"
    )
    assert judge_job(s, job, log).verdict == SLURM
    (tmp_path / "operator.log").write_text(
        "2026-12-07 15:34:00,100 INFO slinky.operator.nodeset.podcontrol: "
        "deleted pod slurm/compute-3 (uid 1)\n"
    )
    v = judge_job(s, job, log)
    assert v.verdict == KILLED, v  # a pod of its nodes deleted by us
