"""The chaos soak's bookkeeping of Slurm jobs (bench/soak_work.track_jobs): a job Slurm lost
in a slurmctld kill -9 is not mistaken for the job that was given its id afterwards."""

from __future__ import annotations

import json
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
