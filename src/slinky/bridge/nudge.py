"""Starting a Slurm scheduling pass from outside slurmctld.

A batch job's end is reported by its slurmd, and that report starts a scheduling pass at
once. An EXTERNAL placeholder job has no slurmd: after it is cancelled, the jobs waiting
for its node wait for Slurm's periodic pass (the backfill every 30 s, the main pass every
60 s, by default), and every pod hand-over on a busy node would take that long. Any job
update starts a pass, so a pending placeholder job of ours gets its own admin_comment
written again, unchanged: nothing about any job changes.

Unchanged is checked on a read made just before, never taken from a job id: after slurmctld
restarts from a state save older than its last submissions, the id can name another job,
and writing our admin_comment there would make that job ours (the chaos soak saw a gang
bound to the nodes of another gang's job that way)."""

from __future__ import annotations

import logging

from prometheus_client import Counter

from slinky.slurm import errors
from slinky.slurm.client import SlurmClient

log = logging.getLogger(__name__)

NUDGES = Counter(
    "slurm_bridge_scheduling_nudges_total",
    "Updates of a pending placeholder job made to start a Slurm scheduling pass after a "
    "cancelled placeholder job freed its node",
)


async def nudge(client: SlurmClient, job_id: int, admin_comment: str) -> bool:
    """Start a pass through an update of pending job `job_id`, if its admin_comment reads
    `admin_comment` now; False when it does not (another job has the id, or the job runs),
    or Slurm refused (no harm either way: its periodic pass comes)."""
    try:
        job = await client.get_job(job_id)
        if not job.is_pending or str(job.raw.get("admin_comment") or "") != admin_comment:
            log.info("job %d: not nudged: no longer the pending job it was", job_id)
            return False
        await client.update_job(job_id, {"admin_comment": admin_comment})
    except errors.SlurmError as e:
        log.info("job %d: could not nudge Slurm's scheduler (%s)", job_id, e)
        return False
    NUDGES.inc()
    return True
