"""The chaos soak's accounting invariant (bench/soak_accounting.py): every job the soak saw
end has exactly one accounting record with its end state; a record slurmctld may have lost
in a kill -9 while it was queued is Slurm's. Also the accounting parts of the test bed's
configuration and the chaos table."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, cast

from bench import soak_accounting as acct
from bench import soak_chaos
from bench.soak_accounting import Ended, Record
from bench.soak_state import ActionRecord, Soak, TrackedJob

from slinky.slurm.models import Job
from slinky_testbed import slurmconf


def ended(job_id: int = 5, name: str = "soak-b1", state: str = "COMPLETED") -> Ended:
    return Ended(job_id, name, state, submitted_at=100.4, ended_at=200.0)


def record(
    job_id: int = 5, name: str = "soak-b1", state: str = "COMPLETED", submit: float = 100
) -> Record:
    return Record(job_id, name, state, submit, 200.0)


def judge(
    e: list[Ended],
    r: list[Record],
    kills: list[float] | None = None,
    down: list[tuple[float, float]] | None = None,
) -> acct.Judgement:
    return acct.judge(e, r, slurmctld_kills=kills or [], down=down or [])


def test_sacct_lines_are_read_with_the_first_word_of_the_state_and_unknown_ends() -> None:
    text = (
        "12|soak-b3|COMPLETED|1765079934|1765079940\n"
        "13|slurm-bridge/pod-a|CANCELLED by 0|1765079935|1765079950\n"
        "14|soak-b4|RUNNING|1765079936|Unknown\n\n"
    )
    assert acct.parse_sacct(text) == [
        Record(12, "soak-b3", "COMPLETED", 1765079934.0, 1765079940.0),
        Record(13, "slurm-bridge/pod-a", "CANCELLED", 1765079935.0, 1765079950.0),
        Record(14, "soak-b4", "RUNNING", 1765079936.0, None),
    ]


def test_one_record_with_the_end_state_matches() -> None:
    got = judge([ended(), ended(6, "slurm-bridge/p", "CANCELLED")],
                [record(), record(6, "slurm-bridge/p", "CANCELLED")])  # fmt: skip
    assert (got.checked, got.matching, got.breaches, got.slurms) == (2, 2, {}, {})


def test_a_missing_record_a_second_record_and_a_stale_state_are_breaches() -> None:
    got = judge(
        [ended(5), ended(6), ended(7)],
        [record(6), record(6, submit=150), record(7, state="RUNNING")],
    )
    assert got.matching == 0
    assert "no accounting record" in got.breaches["job 5"]
    assert "2 accounting records" in got.breaches["job 6"]
    assert "its accounting record says RUNNING" in got.breaches["job 7"]
    assert "ended COMPLETED" in got.breaches["job 7"]


def test_records_of_earlier_runs_of_a_requeued_job_do_not_count() -> None:
    got = judge(
        [ended(state="FAILED")], [record(state="REQUEUED"), record(state="FAILED", submit=150)]
    )
    assert got.matching == 1 and not got.breaches


def test_a_run_a_node_failure_ended_before_the_job_was_requeued_does_not_count() -> None:
    """The 30-minute soak (seed 7): a job on a lost node got a NODE_FAIL record, was
    requeued, and its next run's COMPLETED record followed; one end, not two. A NODE_FAIL
    that is the job's only or last record still counts."""
    got = judge(
        [ended(5), ended(6, state="NODE_FAIL")],
        [record(5, state="NODE_FAIL"), record(5, submit=150), record(6, state="NODE_FAIL")],
    )
    assert got.matching == 2 and not got.breaches, got.breaches
    got = judge([ended(5)], [record(5), record(5, state="NODE_FAIL", submit=150)])
    assert "2 accounting records" in got.breaches["job 5"]


def test_the_open_record_of_a_job_slurmctld_forgot_before_giving_its_id_again_is_not_an_end() -> (
    None
):
    """The CI soak: gang g16's job 48 was submitted, slurmctld was killed -9 before saving
    it and gave 48 to the gang's next submission 4 s later; slurmdbd keeps the first
    record PENDING with no end. Only the last record ends the job; an open last one is
    still a breach."""
    forgot = Record(5, "soak-b1", "PENDING", 101.0, None)
    got = judge([ended(5, state="CANCELLED")], [forgot, record(5, "soak-b1", "CANCELLED", 105)])
    assert got.matching == 1 and not got.breaches, got.breaches
    got = judge([ended(5, state="CANCELLED")], [forgot])
    assert "its accounting record says PENDING" in got.breaches["job 5"]


def test_an_older_job_given_the_same_id_and_name_is_not_this_jobs_record() -> None:
    # A bridge pod's job lost in a slurmctld kill -9 left a PENDING record; its pod's next job
    # got the same id and name, submitted after the kill.
    lost = record(state="PENDING", submit=90)
    other_name = record(name="soak-b9", state="CANCELLED")
    got = judge([ended()], [lost, other_name, record()])
    assert got.matching == 1 and not got.breaches


def test_a_record_lost_to_a_slurmctld_kill_while_queued_is_slurms_not_a_breach() -> None:
    # Job ended at 200 while slurmdbd was down (195..260): its record waited in slurmctld's
    # memory until 260 + FLUSH_S; slurmctld was killed -9 at 240.
    got = judge([ended()], [record(state="RUNNING")], kills=[240.0], down=[(195.0, 260.0)])
    assert not got.breaches
    assert "killed -9" in got.slurms["job 5"]
    # The same kill long after the record was handed over explains nothing.
    got = judge([ended()], [record(state="RUNNING")], kills=[240.0])
    assert "job 5" in got.breaches and not got.slurms


def test_a_record_waits_through_the_outages_its_job_ended_in_or_just_before() -> None:
    assert acct.queued_until(200.0, []) == 200.0 + acct.FLUSH_S
    assert acct.queued_until(200.0, [(195.0, 260.0)]) == 260.0 + acct.FLUSH_S
    assert acct.queued_until(200.0, [(205.0, 260.0), (265.0, 300.0)]) == 300.0 + acct.FLUSH_S
    assert acct.queued_until(200.0, [(100.0, 150.0), (400.0, 500.0)]) == 200.0 + acct.FLUSH_S


def test_outages_run_from_a_kill_until_slurmdbd_answered_and_around_exits() -> None:
    back = ActionRecord("kill-mariadb", 0.0, started_at=100.0, done_at=104.0, recovered_after=6.0)
    never = ActionRecord("kill-slurmdbd", 0.0, started_at=300.0, done_at=301.0)
    other = ActionRecord("kill-slurmctld", 0.0, started_at=50.0, done_at=52.0, recovered_after=1.0)
    exits = [(400.0, "slurmdbd", "fatal"), (410.0, "operator", "lease lost")]
    assert acct.outages([back, never, other], exits) == [
        (100.0, 110.0),
        (300.0, math.inf),
        (400.0 - acct.POLL_S, 400.0 + acct.EXIT_OUTAGE_S),
    ]
    assert acct.catch_up_deadline([ended()], [(100.0, 110.0), (300.0, math.inf)]) == (
        200.0 + acct.CATCH_UP_S
    )


def tracked(
    job_id: int, state: list[str], *, ended_at: float | None, vanished: bool = False
) -> TrackedJob:
    j = TrackedJob(job_id, f"soak-b{job_id}", "batch", 1, 5, 100.0)
    j.last = Job.parse(
        {"job_id": job_id, "name": f"soak-b{job_id}", "job_state": state,
         "submit_time": {"number": 99}}
    )  # fmt: skip
    j.ended_at = ended_at
    j.vanished_at = 300.0 if vanished else None
    return j


def test_only_jobs_the_soak_saw_end_and_stay_ended_are_judged() -> None:
    jobs = [
        tracked(1, ["FAILED", "REQUEUED"], ended_at=150.0),
        tracked(2, ["RUNNING"], ended_at=None),
        tracked(3, ["COMPLETED"], ended_at=150.0, vanished=True),
        tracked(4, ["RUNNING"], ended_at=150.0),  # revived by a slurmctld restart
    ]
    assert acct.ended_jobs(jobs) == [Ended(1, "soak-b1", "FAILED", 99.0, 150.0)]


def test_slurm_conf_accounts_in_slurmdbd_only_when_asked() -> None:
    plain = slurmconf.slurm_conf(ctld_port=1, slurmd_port=2)
    assert "AccountingStorage" not in plain
    lines = slurmconf.slurm_conf(ctld_port=1, slurmd_port=2, dbd_port=3).splitlines()
    assert "AccountingStorageType=accounting_storage/slurmdbd" in lines
    assert "AccountingStoragePort=3" in lines
    assert not any(ln.startswith("AccountingStorageEnforce") for ln in lines)
    dbd = slurmconf.slurmdbd_conf(dbd_port=3, db_port=4, db_password="abc").splitlines()
    assert {"DbdPort=3", "StoragePort=4", "StorageHost=127.0.0.1", "StoragePass=abc"} <= set(dbd)
    assert "--innodb-snapshot-isolation=OFF" in slurmconf.mariadbd_args(db_port=4)
    assert "IDENTIFIED BY 'abc'" in slurmconf.mariadb_init_sql("abc")


class FakeBed:
    def __init__(self, pids: dict[str, list[int]]) -> None:
        self.pids = pids

    def load(self) -> Any:
        return self


def test_the_accounting_kills_are_in_the_default_plan_and_supervised_only_where_they_run(
    tmp_path: Path,
) -> None:
    for name in ("kill-slurmdbd", "kill-mariadb"):
        assert name in soak_chaos.DEFAULT_ACTIONS
    planned = [p.name for p in soak_chaos.plan(21, 600.0, 1.0)]
    assert {"kill-slurmdbd", "kill-mariadb"} <= set(planned)
    bed = FakeBed({"slurmctld": [1, 1], "operator": [2, 2]})
    none = cast(Any, None)
    soak = Soak(cast(Any, bed), none, none, none, out=tmp_path, echo=lambda _l: None)
    assert soak_chaos.supervised(soak) == ["slurmctld", "operator"]
    soak.bed = cast(Any, FakeBed({"slurmctld": [1, 1], "slurmdbd": [3, 3], "mariadb": [4, 4]}))
    assert soak_chaos.supervised(soak) == ["slurmctld", "mariadb", "slurmdbd"]


def test_a_submission_lost_to_a_slurmctld_kill_while_queued_is_slurms_not_a_breach() -> None:
    # Submitted at 100.4, slurmctld killed -9 at 105: the submission's record was still in its
    # memory; the job, recovered from saved state, ran and ended with no record at all.
    got = judge([ended()], [], kills=[105.0])
    assert not got.breaches
    assert "submission" in got.slurms["job 5"]
    # A record that exists but is wrong is not explained by a kill near the submission.
    got = judge([ended()], [record(state="RUNNING")], kills=[105.0])
    assert "job 5" in got.breaches
    # Nor is a missing record when the kill came long after the submission was handed over.
    got = judge([ended()], [], kills=[150.0])
    assert "job 5" in got.breaches


def test_the_end_judged_is_slurms_when_the_soak_saw_it_later() -> None:
    j = tracked(1, ["COMPLETED"], ended_at=300.0)
    j.last = Job.parse(
        {"job_id": 1, "name": "soak-b1", "job_state": ["COMPLETED"],
         "submit_time": {"number": 99}, "end_time": {"number": 180}}
    )  # fmt: skip
    assert acct.ended_jobs([j]) == [Ended(1, "soak-b1", "COMPLETED", 99.0, 180.0)]
    # A record of the end lost in a kill -9 at 185, seen by the soak only at 300.
    (e,) = acct.ended_jobs([j])
    got = judge([e], [record(job_id=1, state="RUNNING")], kills=[185.0])
    assert not got.breaches and "job 1" in got.slurms
