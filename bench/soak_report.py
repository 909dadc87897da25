"""The soak's verdict: what happened to each piece of work, judged from Slurm's and
Kubernetes' records, and the report (text and JSON).

A batch job that did not end COMPLETED at its first run is *killed* (by us: the operator,
the bridge, or what the soak did through them), unless Slurm itself explains it:
- Slurm lost it: the job was accepted, slurmctld was then killed -9, and after the restart
  Slurm no longer knew it (slurmctld saves its state periodically; what came after the last
  save is gone);
- Slurm ended it because the soak killed -9 the slurmd of a node it ran on, or the whole
  real node its slurmd pod ran on (lose-node);
- Slurm revived it: it had ended, slurmctld was killed -9 before saving that, and the
  restored job was ended again.
Those are named apart, each with its evidence; nothing is left out of the counts."""

from __future__ import annotations

import itertools
import re
import time
from collections import Counter
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.soak_accounting import Judgement
from bench.soak_chaos import CHAOS
from bench.soak_invariants import INVARIANTS, InvariantWatch
from bench.soak_metrics import Requests
from bench.soak_state import BridgePod, Soak, TrackedJob
from bench.soak_watch import SAVED_STATE_S

JSON = dict[str, Any]
KILLED, SLURM, COMPLETED, UNFINISHED = "killed", "ended by Slurm", "completed", "unfinished"
POD_OK, POD_BAD, POD_SLURM = "Succeeded", "not Succeeded", "ended by Slurm"
CONTEXT_S = 30.0  # actions this long before a job ran (a pod was made) count as context
LOG_LINES_PER_JOB = 8
SLOW_RECOVERY_S = 30.0
_JOB_ID = re.compile(r"JobId=(\d+)\b")
_NOISE = re.compile(r"0x[0-9a-f]+|[0-9a-f]{8}-[0-9a-f-]{27}|\d+(\.\d+)?")


@dataclass
class Verdict:
    key: str  # job id or pod name
    verdict: str
    why: str
    evidence: list[str] = field(default_factory=list)


@dataclass
class Report:
    seed: int
    duration_s: float
    intensity: float
    testbed: str
    ran_s: float = 0.0
    settle_s: float = 0.0
    jobs: dict[str, int] = field(default_factory=dict)
    job_verdicts: list[Verdict] = field(default_factory=list)
    submit_failures: list[str] = field(default_factory=list)
    pods: dict[str, int] = field(default_factory=dict)
    pod_verdicts: list[Verdict] = field(default_factory=list)
    create_refusals: list[str] = field(default_factory=list)
    placeholder_jobs: dict[str, int] = field(default_factory=dict)
    chaos: dict[str, JSON] = field(default_factory=dict)
    exits: list[str] = field(default_factory=list)
    watch_gaps: list[str] = field(default_factory=list)
    hpa_zero_and_back: int = 0
    invariants: dict[str, list[str]] = field(default_factory=dict)
    invariant_samples: int = 0
    # The accounting invariant (soak_accounting): jobs checked, with their one matching
    # record, breaches, and those explained by a slurmctld kill -9 (Slurm's); {} without
    # accounting.
    accounting: JSON = field(default_factory=dict)
    # Spans in which slurmctld's saved state would not have started (soak_watch).
    unstartable_state: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    request_storms: list[str] = field(default_factory=list)
    harness_errors: list[str] = field(default_factory=list)
    log_errors: dict[str, JSON] = field(default_factory=dict)
    # Stacks of a process whose event loop was blocked (its own watch wrote them), or whose
    # /healthz still failed at the end (asked with SIGUSR1 and SIGQUIT).
    hangs: dict[str, list[str]] = field(default_factory=dict)
    requests_per_minute: JSON = field(default_factory=dict)

    @property
    def failures(self) -> list[str]:
        out = []
        if n := self.jobs.get(KILLED, 0):
            out.append(f"{n} batch jobs killed")
        if n := self.jobs.get(UNFINISHED, 0):
            out.append(f"{n} batch jobs unfinished")
        if n := self.pods.get(POD_BAD, 0):
            out.append(f"{n} bridge pods not Succeeded")
        if n := sum(len(v) for v in self.invariants.values()):
            out.append(f"{n} invariant breaches")
        if n := len(self.accounting.get("breaches") or []):
            out.append(f"{n} accounting breaches")
        if self.unstartable_state:
            out.append(f"{len(self.unstartable_state)} spans of saved state slurmctld refuses")
        if self.stuck:
            out.append(f"{len(self.stuck)} stuck objects or unrecovered actions")
        if self.request_storms:
            out.append(f"{len(self.request_storms)} request storms")
        if self.hangs:
            out.append(f"{len(self.hangs)} hung processes")
        return out

    def to_json(self) -> JSON:
        return {**asdict(self), "failures": self.failures, "exit_code": exit_code(self)}


def exit_code(report: Report) -> int:
    """2 when the soak itself failed (its verdicts may miss things), 1 on any failure."""
    if report.harness_errors:
        return 2
    return 1 if report.failures else 0


# ---------------------------------------------------------------- judging


def overlaps(soak: Soak, start: float, end: float, nodes: Collection[str] = ()) -> list[str]:
    """The chaos actions and crashes that ran during [start - CONTEXT_S, end]; an action
    that names one of `nodes` is marked."""
    out = []
    for a in soak.actions:
        if a.started_at <= end and (a.done_at or end) >= start - CONTEXT_S:
            said = a.error or a.detail
            hit = sorted(n for n in nodes if n and re.search(rf"\b{re.escape(n)}\b", said))
            mark = f"   <== {', '.join(hit)}" if hit else ""
            out.append(f"{soak.rel(a.started_at)} {a.name}: {said}{mark}")
    out += [
        f"{soak.rel(t)} {name} exited on its own: {line[:200]}"
        for t, name, line in soak.exits
        if start - CONTEXT_S <= t <= end
    ]
    return out


# slurmctld's own requeue of a job (a launch or a node it could not reach), as it logs it.
# After a cut ends, how long slurmstepd may take to get a job's end to slurmctld: its retry
# rounds are 15 s apart, and each try in the cut waits out its connect timeouts.
CUT_REPORT_GRACE_S = 90
SLURM_REQUEUE = re.compile(r"requeue JobId=\d+ per user/system request|launch fail|NODE_FAIL")
# The operator's and the bridge's pod deletions, as they log them.
DELETED_POD = re.compile(r"^(\S+ \S+) .*deleted pod (?:[^/\s]+/)?([^/\s]+)")


def pods_deleted_by_us(soak: Soak, names: set[str], start: float, end: float) -> list[str]:
    """The operator's log lines saying it deleted one of the pods `names` in [start, end]."""
    path = soak.bed.logs / "operator.log"
    if not names or not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = DELETED_POD.match(line)
        if m is None or m.group(2) not in names:
            continue
        try:
            at = datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f")
        except ValueError:
            out.append(line)  # cannot tell when: counts against the job
            continue
        if start - 5 <= at.replace(tzinfo=UTC).timestamp() <= end + 5:
            out.append(line)
    return out


def judge_job(soak: Soak, job: TrackedJob, slurm_log: dict[int, list[str]]) -> Verdict:
    key = f"{job.job_id} ({job.name}, {job.partition}, {job.nodes or '?'} nodes, {job.seconds}s)"
    end = job.ended_at or job.vanished_at or time.time()
    history = [f"{soak.rel(t)} {s}" for t, s in job.states]
    evidence = [
        f"submitted {soak.rel(job.submitted_at)}"
        + ("" if job.answered else " (submission failed, Slurm made it)"),
        "Slurm states: " + ", ".join(history),
        *[
            f"during: {c}"
            for c in overlaps(soak, job.running_since or job.submitted_at, end, job.nodes_seen)
        ],
        *[f"slurmctld.log: {ln}" for ln in slurm_log.get(job.job_id, [])[:LOG_LINES_PER_JOB]],
    ]
    if job.vanished_at is not None:
        logged = completed_in_log(slurm_log.get(job.job_id, []))
        if logged is not None and not job.restart_cnt:
            # Ended and purged (MinJobAge) while the soak's watch could not list jobs.
            return Verdict(
                key, COMPLETED, f"COMPLETED at {soak.rel(logged)} (slurmctld.log)", evidence
            )
        kills = [t for t in soak.slurmctld_kills if job.submitted_at - 1 <= t <= job.vanished_at]
        if kills:
            return Verdict(
                key,
                SLURM,
                f"lost by Slurm: accepted {kills[0] - job.submitted_at:.1f}s before slurmctld "
                "was killed -9, unknown after its restart (state saved periodically)",
                evidence,
            )
        return Verdict(
            key, KILLED, "Slurm forgot it with no slurmctld crash to explain it", evidence
        )
    if job.held:
        reason = job.last.state_reason if job.last else ""
        ran = (job.running_since or job.submitted_at) - 5
        kills = [t for t in soak.slurmctld_kills if ran <= t]
        relaunched = allocated_across_kill(slurm_log.get(job.job_id, []), soak.slurmctld_kills)
        if (kills and "launch failed" in reason) or relaunched is not None:
            at = kills[0] if relaunched is None else relaunched
            return Verdict(
                key,
                SLURM,
                f"held ({reason}) after slurmctld was killed -9 at {soak.rel(at)}: "
                "a launch slurmctld had not saved, then a second launch of the same job",
                evidence,
            )
        return Verdict(key, KILLED, f"held by Slurm ({reason}) after a requeue", evidence)
    if job.ended_at is None:
        return Verdict(key, UNFINISHED, f"still {job.final_state} at the end", evidence)
    if job.first_end == "COMPLETED" and job.final_state == "COMPLETED" and not job.restart_cnt:
        return Verdict(key, COMPLETED, "", evidence)
    ran_from = (job.running_since or job.submitted_at) - 5
    for t, node in soak.slurmd_kills:
        if node in job.nodes_seen and ran_from <= t <= end + 1:
            return Verdict(
                key,
                SLURM,
                f"{job.first_end} (restarts {job.restart_cnt}): the soak killed -9 slurmd of "
                f"{node} at {soak.rel(t)} while the job ran there",
                evidence,
            )
    for fault in soak.node_losses:
        if fault.hit(job.nodes_seen, ran_from, end + 1):
            on = ", ".join(sorted(job.nodes_seen & set(fault.slurm_nodes)))
            return Verdict(
                key,
                SLURM,
                f"{job.first_end} (restarts {job.restart_cnt}): it ran on {on}, a slurmd pod of "
                f"{fault.node}, which the soak lost (kill -9 of the machine) at "
                f"{soak.rel(fault.since)}",
                evidence,
            )
    for fault in soak.node_cuts:
        if not fault.hit(job.nodes_seen, ran_from, end + 1):
            continue
        lines = slurm_log.get(job.job_id, [])
        slurm_did = [ln for ln in lines if SLURM_REQUEUE.search(ln)]
        # Deletions up to Slurm's requeue: a pod replaced after it (a later rolling update)
        # had nothing to do with it.
        requeued = (stamp_of(slurm_did[0]) if slurm_did else None) or end
        nodes = job.nodes_seen & set(fault.slurm_nodes)
        deleted = pods_deleted_by_us(soak, nodes, ran_from, requeued)
        on = ", ".join(sorted(nodes))
        # Its work ended while its node was cut off: slurmstepd there could not tell
        # slurmctld, which ended the job at its time limit, in the cut or within one of
        # slurmstepd's retry rounds after it (15 s apart, plus the timeouts of each try).
        # A pod deleted after slurmctld's time-limit decision (its node drained by then)
        # cannot have caused it: deletions count up to that log line (the same clock).
        work_end = (job.running_since or job.submitted_at) + job.seconds
        until = fault.until or end
        limit = [ln for ln in lines if "Time limit exhausted" in ln]
        decided = (stamp_of(limit[0]) if limit else None) or end
        if (
            job.first_end == "TIMEOUT"
            and fault.since <= work_end <= until
            and end <= until + CUT_REPORT_GRACE_S
            and not pods_deleted_by_us(soak, job.nodes_seen, ran_from, decided - 5)
        ):
            return Verdict(
                key,
                SLURM,
                f"TIMEOUT: its {job.seconds}s of work ended at {soak.rel(work_end)} on {on}, a "
                f"slurmd pod of {fault.node}, which the soak cut off from slurmctld from "
                f"{soak.rel(fault.since)} to {soak.rel(until)}; slurmstepd could not report the "
                "end before the job's time limit; no pod of its nodes was deleted by the "
                "operator or the bridge meanwhile",
                evidence,
            )
        if slurm_did and not deleted:
            return Verdict(
                key,
                SLURM,
                f"{job.first_end} (restarts {job.restart_cnt}): it was given {on}, a slurmd "
                f"pod of {fault.node}, which the soak cut off from slurmctld at "
                f"{soak.rel(fault.since)}; slurmctld could not reach it and requeued the job "
                f"itself ({slurm_did[0].split('] ', 1)[-1]}); no pod of its nodes was deleted "
                "by the operator or the bridge meanwhile",
                evidence,
            )
    # Its first completion: seen by the soak, or (a completion the soak's 3 s polls missed,
    # e.g. undone by a kill -9 within a second) in slurmctld.log.
    seen = job.ended_at if job.first_end == "COMPLETED" else None
    logged = completed_in_log(slurm_log.get(job.job_id, []))
    completed = min((t for t in (seen, logged) if t is not None), default=None)
    last_seen = job.states[-1][0] if job.states else end  # its last end, after a revival
    revived_by = [t for t in soak.slurmctld_kills if completed and completed <= t <= last_seen]
    if revived_by:
        then = (
            f"requeued it ({job.restart_cnt}x: its batch script was gone from the node) and "
            f"it ended {job.final_state}"
            if job.restart_cnt
            else f"ended it again {job.final_state} (its processes were long gone)"
        )
        return Verdict(
            key,
            SLURM,
            f"ended COMPLETED at {soak.rel(completed or 0)}, slurmctld was killed -9 at "
            f"{soak.rel(revived_by[0])} before saving that, restored the job as running, then "
            + then,
            evidence,
        )
    lines = slurm_log.get(job.job_id, [])
    lost_launch = [t for t in soak.slurmctld_kills if ran_from <= t <= end]
    if (
        lost_launch
        and any("Registered PENDING" in ln for ln in lines)
        and any("Job credential revoked" in ln for ln in lines)
    ):
        return Verdict(
            key,
            SLURM,
            f"{job.first_end}: slurmctld, killed -9 at {soak.rel(lost_launch[0])} before it saved "
            "the job's allocation, came back with the job PENDING while its batch step ran on "
            "the node; it revoked the job's credential there and failed the next launch",
            evidence,
        )
    reason = job.last.state_reason if job.last else ""
    return Verdict(
        key, KILLED, f"{job.first_end} ({reason}), requeued {job.restart_cnt} times", evidence
    )


def judge_pod(
    soak: Soak, pod: BridgePod, events: dict[str, list[str]], slurm_log: dict[int, list[str]]
) -> Verdict:
    key = pod.name + (f" (gang {pod.group})" if pod.group else "")
    evidence = [
        f"created {soak.rel(pod.created_at)}, sleep {pod.seconds}s, "
        f"{'kept' if pod.keep else 'deleted'} once finished",
        f"seen bound {soak.rel(pod.bound_at)} to {pod.node}" if pod.bound_at else "not seen bound",
        f"placeholder jobs {sorted(pod.job_ids)}",
        *[f"event: {e}" for e in events.get(pod.name, [])],
        *[
            f"slurmctld.log: {ln}"
            for j in sorted(pod.job_ids)
            for ln in slurm_log.get(j, [])[:LOG_LINES_PER_JOB]
        ],
    ]
    if pod.never_created:
        return Verdict(
            key, POD_BAD, "never created: " + "; ".join(pod.create_refusals[-2:]), evidence
        )
    if pod.phase == "Succeeded":
        return Verdict(key, POD_OK, "", evidence)
    lost = [
        j
        for j in pod.job_ids
        if j in soak.jobs
        and soak.jobs[j].vanished_at is not None
        and any(0 <= (soak.jobs[j].vanished_at or 0) - t <= 60 for t in soak.slurmctld_kills)
    ]
    if pod.gone_at is not None and lost:
        return Verdict(
            key, POD_SLURM, f"its job {lost[0]} was lost by slurmctld's kill -9", evidence
        )
    # slurmctld came back from a kill -9 with state saved before the job's allocation (the
    # job PENDING again, its pod running on a node Slurm gives to others), or before the job
    # itself (Slurm no longer knows it, or gave its id to a new job). The bridge deletes the
    # pod (event SlurmJobEnded "... no longer holds node" / "no longer known to Slurm" / "no
    # longer this pod's"): Slurm's loss, not ours.
    unallocated = any(
        marker in e
        for e in events.get(pod.name, [])
        for marker in ("no longer holds node", "no longer known to Slurm", "no longer this pod's")
    )
    kills = [
        t
        for t in soak.slurmctld_kills
        if pod.bound_at is not None and pod.bound_at - 60 <= t <= (pod.gone_at or time.time())
    ]
    if pod.gone_at is not None and unallocated and kills:
        return Verdict(
            key,
            POD_SLURM,
            f"slurmctld, killed -9 at {soak.rel(kills[0])}, came back without its job's "
            "allocation (or without the job); the bridge deleted the pod, which ran where Slurm "
            "no longer held a node for it",
            evidence,
        )
    end = pod.finished_at or pod.gone_at or time.time()
    evidence += [f"during: {c}" for c in overlaps(soak, pod.created_at, end, {pod.node})]
    if pod.gone_at is not None:
        return Verdict(
            key, POD_BAD, f"gone at {soak.rel(pod.gone_at)} before it finished", evidence
        )
    return Verdict(key, POD_BAD, f"{pod.phase or 'unknown'} at the end", evidence)


def stamp_of(line: str) -> float | None:
    if not line.startswith("[") or "]" not in line:
        return None
    return datetime.fromisoformat(line[1 : line.index("]")]).timestamp()


def allocated_across_kill(lines: list[str], kills: list[float]) -> float | None:
    """The slurmctld kill -9 between two allocations of the job, followed by its requeue:
    the first launch was not saved, the restored slurmctld allocated the job again and
    found it running on the node ("Duplicate jobid on nodes ..., set to state DRAIN"), and
    requeued it (held). None when the log does not show that."""
    allocations = [t for ln in lines if "sched: Allocate JobId=" in ln and (t := stamp_of(ln))]
    requeues = [t for ln in lines if "Requeuing JobId=" in ln and (t := stamp_of(ln))]
    for first, second in itertools.pairwise(allocations):
        between = [k for k in kills if first <= k <= second]
        if between and any(r >= second for r in requeues):
            return between[0]
    return None


def completed_in_log(lines: list[str]) -> float | None:
    """When slurmctld logged the job's batch script as ended with status 0, if it did; not
    the status 0 it logs for a launch that failed, followed by the job's requeue."""
    for i, line in enumerate(lines):
        if "_job_complete:" in line and "WEXITSTATUS 0" in line and (t := stamp_of(line)):
            after = lines[i + 1] if i + 1 < len(lines) else ""
            if "_job_complete: requeue" in after and stamp_of(after) == t:
                continue
            return t
    return None


def slurmctld_lines(path: Path, wanted: set[int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        for m in _JOB_ID.finditer(line):
            if int(m.group(1)) in wanted:
                out.setdefault(int(m.group(1)), []).append(line.strip()[:300])
    return out


def log_errors(path: Path) -> JSON:
    """ERROR lines and tracebacks in one of our logs, and the distinct messages (numbers
    and ids masked) with their counts."""
    errors: Counter[str] = Counter()
    tracebacks = 0
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith("Traceback"):
                tracebacks += 1
            elif " ERROR " in line:
                message = line.split(" ERROR ", 1)[1]
                errors[_NOISE.sub("N", message)[:200]] += 1
    return {
        "error_lines": sum(errors.values()),
        "tracebacks": tracebacks,
        "distinct": [f"{n}x {m}" for m, n in errors.most_common(20)],
    }


LOOP_BLOCKED = "the event loop has been blocked for"
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d")


def loop_stalls(path: Path, limit: int = 80) -> list[str]:
    """The first report of a blocked event loop in one of our logs (`slinky.loopwatch`):
    its line and the thread stacks after it, up to the next log line."""
    if not path.exists():
        return []
    out: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        if not out:
            if LOOP_BLOCKED in line:
                out.append(line)
        elif LOG_LINE.match(line) or len(out) >= limit:
            break
        else:
            out.append(line)
    return out


def build(
    soak: Soak,
    *,
    seed: int,
    duration_s: float,
    intensity: float,
    ran_s: float,
    settle_s: float,
    invariants: InvariantWatch,
    requests: Requests,
    stuck: list[str],
    events: dict[str, list[str]],
    hangs: dict[str, list[str]] | None = None,
    accounting: Judgement | None = None,
) -> Report:
    r = Report(seed, duration_s, intensity, str(soak.bed.dir), ran_s=ran_s, settle_s=settle_s)
    batch = [j for j in soak.all_jobs() if not j.placeholder]
    judged = [
        j
        for j in batch
        if not (
            j.ended_at
            and j.first_end == "COMPLETED"
            and j.final_state == "COMPLETED"
            and not j.restart_cnt
        )
    ]
    unsucceeded = [p for p in soak.pods.values() if p.phase != "Succeeded"]
    log = slurmctld_lines(
        soak.bed.logs / "slurmctld.log",
        {j.job_id for j in judged} | {j for p in unsucceeded for j in p.job_ids},
    )
    verdicts = [judge_job(soak, j, log) for j in batch]
    r.jobs = {"submitted": len(batch), **Counter(v.verdict for v in verdicts)}
    r.job_verdicts = [v for v in verdicts if v.verdict != COMPLETED or v.why]
    r.submit_failures = [f"{soak.rel(t)} {name}: {e}" for t, name, e in soak.submit_failures]
    pods = list(soak.pods.values())
    pod_verdicts = [judge_pod(soak, p, events, log) for p in pods]
    r.pods = {
        "created": sum(1 for p in pods if not p.never_created),
        "single": sum(1 for p in pods if not p.group),
        "in gangs": sum(1 for p in pods if p.group),
        "left in place": sum(1 for p in pods if p.keep),
        **Counter(v.verdict for v in pod_verdicts),
    }
    r.pod_verdicts = [v for v in pod_verdicts if v.verdict != POD_OK]
    r.create_refusals = [f"{p.name}: {x}" for p in pods for x in p.create_refusals]
    placeholders = [j for j in soak.all_jobs() if j.placeholder]
    r.placeholder_jobs = {"seen": len(placeholders), **Counter(j.final_state for j in placeholders)}
    for chaos in CHAOS:
        runs = [a for a in soak.actions if a.name == chaos.name]
        recovered = [a.recovered_after for a in runs if a.recovered_after is not None]
        r.chaos[chaos.name] = {
            "ran": len(runs),
            "recovered": len(recovered),
            "recovery_s_max": round(max(recovered), 1) if recovered else None,
            "errors": [a.error for a in runs if a.error],
            "slow": [
                f"{soak.rel(a.started_at)} recovered after {a.recovered_after:.0f}s; first "
                f"seen: {a.first_problems}"
                for a in runs
                if a.recovered_after is not None and a.recovered_after > SLOW_RECOVERY_S
            ],
            "what": chaos.what,
            "recovered_means": chaos.recovered_means,
        }
        r.stuck += [
            f"{soak.rel(a.started_at)} {a.name} not recovered within "
            f"{chaos.recover_within_s:.0f}s: {a.not_recovered}"
            for a in runs
            if a.not_recovered
        ]
    r.exits = [f"{soak.rel(t)} {name}: {line[:300]}" for t, name, line in soak.exits]
    r.watch_gaps = [f"{soak.rel(a)}..{soak.rel(b)} ({b - a:.0f}s)" for a, b in soak.watch_gaps]
    r.hpa_zero_and_back = len(soak.hpa_back_at)
    for inv in INVARIANTS:
        r.invariants[inv.name] = [
            f"{soak.rel(b.first_seen)}..{soak.rel(b.last_seen)} {b.evidence}"
            for b in invariants.breaches.values()
            if b.invariant == inv.name
        ]
    r.invariant_samples = invariants.samples
    if accounting is not None:
        r.accounting = {
            "checked": accounting.checked,
            "matching": accounting.matching,
            "breaches": sorted(accounting.breaches.values()),
            "slurm": sorted(accounting.slurms.values()),
        }
    r.unstartable_state = [
        f"{soak.rel(a)}..{soak.rel(b)}: {', '.join(names)}"
        for a, b, names in spans(soak.unstartable, gap=2 * SAVED_STATE_S + 1)
    ]
    r.stuck += stuck
    r.request_storms = [f"from {soak.rel(t)}: {what}" for t, what in requests.storms()]
    r.harness_errors = list(soak.harness_errors)
    r.log_errors = {n: log_errors(soak.bed.logs / f"{n}.log") for n in ("operator", "bridge")}
    for name in ("operator", "bridge"):
        if stall := loop_stalls(soak.bed.logs / f"{name}.log"):
            r.hangs[f"{name}: event loop blocked"] = stall
    for name, said in (hangs or {}).items():
        r.hangs[f"{name}: /healthz failing at the end"] = said
    r.requests_per_minute = {
        "slurmrestd": {
            "operator": round(requests.per_minute("operator", "slurm_rest_requests_total"), 1),
            "bridge": round(requests.per_minute("bridge", "slurm_rest_requests_total"), 1),
            "operator top": requests.top(
                "operator", "slurm_rest_requests_total", ("method", "endpoint")
            ),
            "bridge top": requests.top(
                "bridge", "slurm_rest_requests_total", ("method", "endpoint")
            ),
            "soak (its own watch and submissions)": round(
                soak.slurm.requests_sent / max(1e-9, (time.time() - soak.started_at) / 60), 1
            ),
        },
        "apiserver": {
            "operator": round(requests.per_minute("operator", "rest_client_requests_total"), 1),
            "bridge": round(requests.per_minute("bridge", "rest_client_requests_total"), 1),
            "all clients (apiserver_request_total)": round(
                requests.per_minute("apiserver", "apiserver_request_total"), 1
            ),
            "operator top": requests.top(
                "operator", "rest_client_requests_total", ("method", "code")
            ),
            "bridge top": requests.top("bridge", "rest_client_requests_total", ("method", "code")),
        },
        "measured_minutes": round((requests.until - requests.since) / 60, 1),
        "restarts_seen": {n: c.restarts_seen for n, c in requests.components.items()},
    }
    return r


# ---------------------------------------------------------------- text


def render(r: Report) -> str:
    def mmss(s: float) -> str:
        return f"{int(s // 60)}m{int(s % 60):02d}s"

    lines = [
        f"Chaos soak: seed {r.seed}, {mmss(r.duration_s)} of chaos at intensity {r.intensity}, "
        f"then {mmss(r.settle_s)} to settle ({r.testbed})",
        "",
        "Work",
        f"  batch jobs submitted {r.jobs.get('submitted', 0)}: COMPLETED "
        f"{r.jobs.get(COMPLETED, 0)}, killed by us {r.jobs.get(KILLED, 0)}, ended by Slurm "
        f"{r.jobs.get(SLURM, 0)}, unfinished {r.jobs.get(UNFINISHED, 0)}; "
        f"submissions that failed {len(r.submit_failures)}",
        f"  bridge pods created {r.pods.get('created', 0)} ({r.pods.get('single', 0)} single, "
        f"{r.pods.get('in gangs', 0)} in gangs of 2, {r.pods.get('left in place', 0)} left in "
        f"place): Succeeded {r.pods.get(POD_OK, 0)}, not Succeeded {r.pods.get(POD_BAD, 0)}, "
        f"ended by Slurm {r.pods.get(POD_SLURM, 0)}; creations refused {len(r.create_refusals)} "
        "times (retried)",
        f"  placeholder jobs seen {r.placeholder_jobs.get('seen', 0)}: "
        + ", ".join(f"{k} {v}" for k, v in r.placeholder_jobs.items() if k != "seen"),
        f"  HPA NodeSet compute went to 0 pods and back {r.hpa_zero_and_back} times",
        "",
        "Chaos (ran / recovered, slowest recovery)",
    ]
    for name, c in r.chaos.items():
        slowest = f", {c['recovery_s_max']}s" if c["recovery_s_max"] is not None else ""
        errors = f"; errors: {'; '.join(c['errors'])}" if c["errors"] else ""
        lines.append(f"  {name:20} {c['ran']:3} / {c['recovered']}{slowest}{errors}")
        lines += [f"      slow: {s}" for s in c["slow"]]
    if r.exits:
        lines += ["  processes that exited on their own (restarted by the soak):"]
        lines += [f"    {e}" for e in r.exits]
    if r.watch_gaps:
        lines += [
            "  the soak could not list Slurm's jobs during: " + ", ".join(r.watch_gaps),
        ]
    lines += ["", f"Invariants ({r.invariant_samples} snapshots)"]
    for name, breaches in r.invariants.items():
        lines.append(f"  {name}: {len(breaches)}")
        lines += [f"    {b}" for b in breaches[:10]]
    if r.accounting:
        a = r.accounting
        lines += [
            "",
            f"Accounting: {a['matching']} of {a['checked']} ended jobs have exactly one record "
            f"with their end state; breaches {len(a['breaches'])}, explained by a slurmctld "
            f"kill -9 (Slurm's) {len(a['slurm'])}",
        ]
        lines += [f"  {b}" for b in a["breaches"][:20]]
        lines += [f"  Slurm's: {b}" for b in a["slurm"][:20]]
    lines += [
        "",
        "slurmctld's saved state a restart refuses (partitions naming nodes it lacks): "
        + (str(len(r.unstartable_state)) if r.unstartable_state else "never"),
    ]
    lines += [f"  {s}" for s in r.unstartable_state]
    lines += ["", f"Objects stuck / not recovered: {len(r.stuck) or 'none'}"]
    lines += [f"  {s}" for s in r.stuck]
    lines += ["", f"Request storms: {len(r.request_storms) or 'none'}"]
    lines += [f"  {s}" for s in r.request_storms]
    if r.hangs:
        lines += ["", f"Hung processes: {len(r.hangs)}"]
        for what, said in r.hangs.items():
            lines += [f"  {what}", *(f"    {x}" for x in said)]
    lines += ["", "Errors in our logs"]
    for name, e in r.log_errors.items():
        lines.append(f"  {name}: {e['error_lines']} ERROR lines, {e['tracebacks']} tracebacks")
        lines += [f"    {d}" for d in e["distinct"][:10]]
    rpm = r.requests_per_minute
    lines += [
        "",
        f"Requests per minute (over {rpm['measured_minutes']} min, counters of restarted "
        f"processes summed: {rpm['restarts_seen']})",
    ]
    for server, per in rpm.items():
        if isinstance(per, dict) and server in ("slurmrestd", "apiserver"):
            lines.append(f"  {server}:")
            lines += [
                f"    {k}: {', '.join(v) if isinstance(v, list) else v}" for k, v in per.items()
            ]
    if r.job_verdicts:
        lines += ["", "Batch jobs not seen COMPLETED at their first run"]
        for v in r.job_verdicts:
            lines.append(f"  job {v.key}: {v.verdict}: {v.why}")
            lines += [f"      {e}" for e in v.evidence]
    if r.pod_verdicts:
        lines += ["", "Bridge pods not Succeeded"]
        for v in r.pod_verdicts:
            lines.append(f"  pod {v.key}: {v.verdict}: {v.why}")
            lines += [f"      {e}" for e in v.evidence]
    if r.submit_failures:
        lines += ["", "Batch submissions that failed (slurmrestd or slurmctld down; not retried)"]
        lines += [f"  {x}" for x in r.submit_failures]
    if r.create_refusals:
        lines += ["", "Pod creations refused (each retried)"]
        lines += [f"  {x}" for x in r.create_refusals[:20]]
    if r.harness_errors:
        lines += ["", "ERRORS OF THE SOAK ITSELF (the verdicts above may be incomplete)"]
        lines += [f"  {e}" for e in r.harness_errors]
    failures = r.failures
    result = f"FAIL ({'; '.join(failures)})" if failures else "PASS"
    if r.harness_errors:
        result = f"INCONCLUSIVE ({len(r.harness_errors)} errors of the soak itself); {result}"
    lines += ["", f"RESULT: {result}"]
    return "\n".join(lines)


def spans(
    samples: list[tuple[float, list[str]]], *, gap: float
) -> list[tuple[float, float, list[str]]]:
    """Samples (time, names) joined into spans: consecutive ones less than `gap` apart, with
    the names seen in any of them."""
    out: list[tuple[float, float, list[str]]] = []
    for at, names in samples:
        if out and at - out[-1][1] < gap:
            first, _, seen = out[-1]
            out[-1] = (first, at, sorted({*seen, *names}))
        else:
            out.append((at, at, list(names)))
    return out
