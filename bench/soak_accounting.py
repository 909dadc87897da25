"""The accounting invariant: every job the soak saw end has exactly one accounting record,
and that record's state is the end state Slurm showed the soak.

Read once the chaos is over and slurmdbd is back: slurmctld queues its job records for
slurmdbd while slurmdbd (or its MariaDB) is down and sends them when it answers again, so a
missing or stale record counts only once the queue had `CATCH_UP_S` to drain after the last
accounting outage and the last job end. Records come from `sacct` in the Slurm root (every
user, every record of a job id: `--duplicates`, allocations only).

A record is the job's when it has the job's id and name and was submitted no earlier than
the job (slurmctld gives the id of a job a kill -9 made it forget to the next job, whose
name may be the same: a bridge pod's job submitted again). Records of earlier runs of a
requeued job say REQUEUED, or NODE_FAIL when a node failure ended them, and do not count.

slurmctld's queue for slurmdbd lives in memory (written to disk only on a clean shutdown):
a kill -9 of slurmctld between a job's end and the moment slurmdbd took its record loses the
record's end, and one between its submission and the hand-over loses the submission (the
job recovered from saved state then has no record at all). Such a job is named apart as
Slurm's, with the kill as evidence, never counted as a breach; so is a job whose record a
kill -9 may have duplicated."""

from __future__ import annotations

import asyncio
import math
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from bench.soak_state import ActionRecord, Soak, TrackedJob
from slinky.slurm.models import TERMINAL_JOB_STATES

CATCH_UP_S = 120.0  # after slurmdbd is back and the last job ended, for queued records
FLUSH_S = 10.0  # slurmctld hands a record to a slurmdbd that answers within this long
SUBMIT_SLACK_S = 1.0  # sacct's times are whole seconds
EXIT_OUTAGE_S = 60.0  # a slurmdbd or MariaDB that exited on its own: down about this long
POLL_S = 5.0
ACCOUNTING_ACTIONS = ("kill-slurmdbd", "kill-mariadb")
ACCOUNTING_PROCESSES = ("slurmdbd", "mariadb")
REQUEUE_STATES = {"REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "REVOKED"}
SACCT_FIELDS = "JobIDRaw,JobName,State,Submit,End"


@dataclass(frozen=True)
class Record:
    """One accounting record as sacct lists it."""

    job_id: int
    name: str
    state: str  # its first word: "CANCELLED by 0" -> "CANCELLED"
    submit: float
    end: float | None  # None while it says it runs ("Unknown")

    def show(self) -> str:
        return f"{self.state} (submitted {self.submit:.0f}, end {self.end or 'Unknown'})"


def parse_sacct(text: str) -> list[Record]:
    """`sacct -n -P -o JobIDRaw,JobName,State,Submit,End` with SLURM_TIME_FORMAT=%s."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        if len(parts) != 5:
            raise ValueError(f"sacct line with {len(parts)} fields, not 5: {line!r}")
        job_id, name, state, submit, end = parts
        out.append(
            Record(
                int(job_id),
                name,
                state.split()[0] if state.strip() else "",
                float(submit),
                float(end) if end.strip().isdigit() else None,
            )
        )
    return out


@dataclass(frozen=True)
class Ended:
    """A job the soak saw end, as Slurm showed it last."""

    job_id: int
    name: str  # its Slurm job name
    state: str  # its base state: COMPLETED, CANCELLED, FAILED, TIMEOUT, NODE_FAIL, ...
    submitted_at: float  # no record of it was submitted before this (less the slack)
    ended_at: float


def base_state(states: Iterable[str]) -> str:
    """The job state among Slurm's state and flags ("FAILED" of ["FAILED", "REQUEUED"])."""
    listed = list(states)
    return next((s for s in listed if s in TERMINAL_JOB_STATES), listed[0] if listed else "")


def ended_jobs(jobs: Iterable[TrackedJob]) -> list[Ended]:
    """The jobs of the soak (batch and placeholder) that it saw end and that stayed ended;
    a job Slurm forgot or that is live again is not judged here (soak_report judges it)."""
    out = []
    for j in jobs:
        last = j.last
        if j.ended_at is None or j.vanished_at is not None or last is None or not j.finished:
            continue
        submitted = float((last.raw.get("submit_time") or {}).get("number") or j.submitted_at)
        # Slurm's own end time: the soak may see an end only after a slurmctld restart, long
        # after the record of it went into the queue a kill -9 emptied.
        end = float((last.raw.get("end_time") or {}).get("number") or j.ended_at)
        out.append(
            Ended(j.job_id, last.name, base_state(last.state), min(j.submitted_at, submitted),
                  min(j.ended_at, end) if end > 0 else j.ended_at)
        )  # fmt: skip
    return out


def outages(
    actions: Iterable[ActionRecord], exits: Iterable[tuple[float, str, str]]
) -> list[tuple[float, float]]:
    """Spans in which slurmdbd did not take records: from each kill of slurmdbd or MariaDB
    until slurmdbd answered again (the action's recovery; never, if it did not recover), and
    around each exit of one on its own."""
    out = []
    for a in actions:
        if a.name in ACCOUNTING_ACTIONS:
            back = a.done_at + a.recovered_after if a.recovered_after is not None else math.inf
            out.append((a.started_at, back))
    out += [(t - POLL_S, t + EXIT_OUTAGE_S) for t, name, _ in exits if name in ACCOUNTING_PROCESSES]
    return sorted(out)


def queued_until(end: float, down: list[tuple[float, float]]) -> float:
    """Until when the record of a job that ended at `end` may still sit in slurmctld's
    queue: FLUSH_S after the end, or after the end of the outages it waited through."""
    until = end + FLUSH_S
    for start, back in sorted(down):
        if start <= until and back >= end:
            until = max(until, back + FLUSH_S)
    return until


@dataclass
class Judgement:
    checked: int = 0
    matching: int = 0
    breaches: dict[str, str] = field(default_factory=dict)  # "job N" -> what is wrong
    slurms: dict[str, str] = field(default_factory=dict)  # the same, explained by a kill -9


def judge(
    ended: list[Ended],
    records: list[Record],
    *,
    slurmctld_kills: list[float],
    down: list[tuple[float, float]],
    rel: Callable[[float], str] = lambda t: f"{t:.0f}",
) -> Judgement:
    by_id: dict[int, list[Record]] = {}
    for r in records:
        by_id.setdefault(r.job_id, []).append(r)
    out = Judgement(checked=len(ended))
    for e in ended:
        mine = [
            r
            for r in by_id.get(e.job_id, [])
            if r.name == e.name and r.submit >= math.floor(e.submitted_at) - SUBMIT_SLACK_S
        ]
        ends = sorted((r for r in mine if r.state not in REQUEUE_STATES), key=lambda r: r.submit)
        # A record that never ended, followed by a later submission under the same id: the
        # record of a job slurmctld forgot in a kill -9 (Slurm gave its id again), not an
        # end of this one.
        ends = [r for i, r in enumerate(ends) if r.end is not None or i == len(ends) - 1]
        # A run a node failure ended and Slurm requeued keeps its own NODE_FAIL record (sacct
        # --duplicates), submitted before the run that ended the job: an earlier run.
        ends = [r for i, r in enumerate(ends) if r.state != "NODE_FAIL" or i == len(ends) - 1]
        if len(ends) == 1 and ends[0].state == e.state:
            out.matching += 1
            continue
        if not ends:
            wrong = "no accounting record"
        elif len(ends) > 1:
            wrong = f"{len(ends)} accounting records: " + ", ".join(r.show() for r in ends)
        else:
            wrong = f"its accounting record says {ends[0].show()}"
        what = f"job {e.job_id} ({e.name}) ended {e.state} at {rel(e.ended_at)}; {wrong}"
        until = queued_until(e.ended_at, down)
        kills = [t for t in slurmctld_kills if e.ended_at - FLUSH_S <= t <= until]
        # No record at all: its first one (the submission) may have been in the queue a kill
        # -9 emptied; slurmctld then recovers the job from its saved state without it.
        lost_submit = [
            t
            for t in slurmctld_kills
            if not ends and e.submitted_at <= t <= queued_until(e.submitted_at, down)
        ]
        if kills:
            out.slurms[f"job {e.job_id}"] = (
                f"{what}: slurmctld was killed -9 at {rel(kills[0])}, while the record may "
                "still have been in its queue for slurmdbd (in memory only)"
            )
        elif lost_submit:
            out.slurms[f"job {e.job_id}"] = (
                f"{what}: slurmctld was killed -9 at {rel(lost_submit[0])}, while the record "
                "of its submission may still have been in its queue for slurmdbd"
            )
        else:
            out.breaches[f"job {e.job_id}"] = what
    return out


def catch_up_deadline(ended: list[Ended], down: list[tuple[float, float]]) -> float:
    """When a record still missing counts: CATCH_UP_S after slurmdbd was last back and the
    last job ended."""
    last = max([e.ended_at for e in ended] + [b for _, b in down if b != math.inf] + [0.0])
    return last + CATCH_UP_S


def sacct_records(soak: Soak, since: float) -> list[Record]:
    """Every accounting record of the soak's time (blocking: sacct in the Slurm root)."""
    done = soak.bed.slurm(
        [
            "env",
            "SLURM_TIME_FORMAT=%s",
            "sacct",
            "-a",
            "-X",
            "-D",
            "-n",
            "-P",
            "-S",
            f"now-{math.ceil(time.time() - since)}seconds",  # no time zone to get wrong
            "-E",
            "now",
            "-o",
            SACCT_FIELDS,
        ],
        capture=True,
        timeout=60,
    )
    if done.returncode != 0:
        raise RuntimeError(f"sacct failed (exit {done.returncode}): {done.stderr.strip()[:300]}")
    return parse_sacct(done.stdout)


async def catch_up(soak: Soak) -> Judgement:
    """Judge the accounting records once slurmdbd is back, polling until every ended job
    has its record or the catch-up deadline passed; sacct that cannot answer counts as
    records missing (the last error is in the events log)."""
    ended = ended_jobs(soak.all_jobs())
    down = outages(soak.actions, soak.exits)
    deadline = catch_up_deadline(ended, down)
    since = soak.started_at - 600
    while True:
        try:
            records = await asyncio.to_thread(sacct_records, soak, since)
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            soak.log(f"accounting: cannot read records: {e}")
            records = []
        result = judge(ended, records, slurmctld_kills=soak.slurmctld_kills, down=down,
                       rel=soak.rel)  # fmt: skip
        if (not result.breaches and not result.slurms) or time.time() > deadline:
            soak.log(
                f"accounting: {result.matching} of {result.checked} ended jobs have their one "
                f"record; {len(result.breaches)} breaches, {len(result.slurms)} Slurm's"
            )
            return result
        await asyncio.sleep(POLL_S)
