"""What the chaos soak shares between its loops: the clients, the timeline of events, the
work it submitted and what Slurm and Kubernetes said about each piece of it.

Every record is written from Slurm's and Kubernetes' own answers (job listings, pod
listings), never from the operator's or the bridge's logs; times are wall-clock seconds, so
they compare with Slurm's `submit_time`/`end_time` and with log timestamps."""

from __future__ import annotations

import asyncio
import time
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.soak_bed import Ports
from slinky.kube import rest
from slinky.slurm.client import SlurmClient
from slinky.slurm.models import Job
from slinky_testbed.bed import Testbed

JSON = dict[str, Any]


# The processes the soak restarts when they exit on their own, as a Deployment or systemd
# would (see soak_chaos.supervise).
SUPERVISED = (
    "apiserver",
    "kcm",
    "scheduler",
    "slurmctld",
    "slurmrestd",
    "mariadb",
    "slurmdbd",
    "operator",
    "bridge",
)


@dataclass
class TrackedJob:
    """One Slurm job of ours: a batch job the soak submitted through slurmrestd (or that
    Slurm made from a submission whose answer was lost: `answered` False), or a placeholder
    job of the bridge (`placeholder`, seen in Slurm's listing, named after its pods)."""

    job_id: int
    name: str
    partition: str
    nodes: int
    seconds: int
    submitted_at: float
    answered: bool = True
    placeholder: bool = False
    # (time, "STATE[+FLAG] reason") whenever what Slurm shows changes.
    states: list[tuple[float, str]] = field(default_factory=list)
    last: Job | None = None
    restart_cnt: int = 0
    nodes_seen: set[str] = field(default_factory=set)
    running_since: float | None = None
    ended_at: float | None = None  # first time a settled terminal state was seen
    first_end: str = ""  # that terminal state
    vanished_at: float | None = None  # gone from Slurm's listing without a settled end

    @property
    def final_state(self) -> str:
        return "+".join(self.last.state) if self.last else ""

    @property
    def held(self) -> bool:
        """Pending and held by Slurm (e.g. "launch failed requeued held"): it will not run
        again unless someone releases it."""
        last = self.last
        return last is not None and last.is_pending and "held" in last.state_reason.lower()

    @property
    def finished(self) -> bool:
        """Slurm no longer lists it, or its last state seen is a settled end (a job revived
        by slurmctld's restart after it had ended is not finished again until it ends)."""
        if self.vanished_at is not None:
            return True
        last = self.last
        return last is not None and last.is_finished and "COMPLETING" not in last.state


@dataclass
class BridgePod:
    """One pod the soak created in the bridge's managed namespace."""

    name: str
    group: str  # the PodGroup's name, "" for a single pod
    seconds: int
    keep: bool  # left in place once finished (else deleted by the soak)
    created_at: float = 0.0
    uid: str = ""
    phase: str = ""
    node: str = ""
    bound_at: float | None = None
    finished_at: float | None = None
    deleted_by_soak_at: float | None = None
    gone_at: float | None = None  # no longer listed
    job_ids: set[int] = field(default_factory=set)
    create_refusals: list[str] = field(default_factory=list)
    never_created: bool = False

    @property
    def settled(self) -> bool:
        """Nothing more will happen to it: finished (and deleted if meant to), or gone."""
        if self.never_created or self.gone_at is not None:
            return True
        return self.finished_at is not None and (self.keep or self.deleted_by_soak_at is not None)


@dataclass
class NodeFault:
    """A real node lost or cut off, and the Slurm nodes (slurmd pods) it ran then."""

    since: float
    node: str
    slurm_nodes: list[str]
    until: float = 0.0

    def hit(self, nodes: set[str], start: float, end: float) -> bool:
        """Whether work on `nodes` during [start, end] ran there while the fault lasted."""
        until = self.until or end
        return bool(nodes & set(self.slurm_nodes)) and start <= until and self.since <= end


@dataclass
class ActionRecord:
    """One chaos action as it ran."""

    name: str
    planned_at: float  # seconds after the start
    started_at: float = 0.0  # wall clock
    done_at: float = 0.0
    detail: str = ""
    error: str = ""
    recovered_after: float | None = None  # seconds from done_at
    first_problems: str = ""  # what was wrong at the first recovery check
    not_recovered: str = ""  # what was still wrong at the deadline


@dataclass
class Event:
    at: float
    text: str


@dataclass
class Soak:
    """The clients and records of one soak run."""

    bed: Testbed
    kube: rest.Kube
    slurm: SlurmClient
    ports: Ports
    out: Path  # where events.log and report.json go
    echo: Callable[[str], None]
    started_at: float = field(default_factory=time.time)
    events: list[Event] = field(default_factory=list)
    # By job id: the job that holds the id now. Slurm gives the id of a job it lost (a
    # kill -9 of slurmctld before it saved the job) to the next job; the lost one moves to
    # `retired`, and `all_jobs` has both.
    jobs: dict[int, TrackedJob] = field(default_factory=dict)
    retired: list[TrackedJob] = field(default_factory=list)
    job_names: dict[str, int] = field(default_factory=dict)
    submit_failures: list[tuple[float, str, str]] = field(default_factory=list)
    pods: dict[str, BridgePod] = field(default_factory=dict)
    groups_deleted: set[str] = field(default_factory=set)
    actions: list[ActionRecord] = field(default_factory=list)
    # Wall-clock times of crashes whose consequences are Slurm's own (see soak_report).
    slurmctld_kills: list[float] = field(default_factory=list)
    slurmd_kills: list[tuple[float, str]] = field(default_factory=list)  # (time, Slurm node)
    # Real nodes lost for good (lose-node) and cut off (cut-node): (from, until, node, the
    # Slurm nodes of the slurmd pods it ran then); `until` is the replacement's start or
    # the end of the cut (0.0 while it lasts).
    node_losses: list[NodeFault] = field(default_factory=list)
    node_cuts: list[NodeFault] = field(default_factory=list)
    # A process of ours that exited without the soak killing it: (time, name, last log line).
    exits: list[tuple[float, str, str]] = field(default_factory=list)
    # Whether each supervised process is meant to run (False while an action restarts one:
    # the supervisor leaves it alone).
    supervised: dict[str, bool] = field(default_factory=lambda: dict.fromkeys(SUPERVISED, True))
    # One test bed mutation at a time: state.json is read, changed and written back.
    bed_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Times at which the HPA-driven NodeSet was seen at 0 replicas and back above it.
    hpa_zero_at: list[float] = field(default_factory=list)
    # Spans in which the soak could not list jobs (slurmctld or slurmrestd down or swamped):
    # what happened to its jobs then is read from slurmctld.log.
    jobs_listed_at: float = field(default_factory=time.time)
    watch_gaps: list[tuple[float, float]] = field(default_factory=list)
    hpa_back_at: list[float] = field(default_factory=list)
    # Samples of slurmctld's saved state a restart would refuse (a NodeSet node its saved
    # partitions name and its saved nodes lack): when, and those nodes.
    unstartable: list[tuple[float, list[str]]] = field(default_factory=list)
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # Called with a component's name just before the chaos stops it (its counters are read
    # one last time).
    before_stop: Callable[[str], Awaitable[None]] | None = None
    # The soak's own unexpected errors: the run is inconclusive when there is any.
    harness_errors: list[str] = field(default_factory=list)

    def all_jobs(self) -> list[TrackedJob]:
        return [*self.retired, *self.jobs.values()]

    def track(self, tracked: TrackedJob, at: float) -> None:
        """Hold `tracked` under its job id; a different job that held the id is retired (it
        is gone from Slurm: its id was given again)."""
        earlier = self.jobs.get(tracked.job_id)
        if earlier is not None and earlier is not tracked:
            if earlier.ended_at is None and earlier.vanished_at is None:
                earlier.vanished_at = at
                earlier.states.append((at, "GONE (its job id was given to another job)"))
            self.retired.append(earlier)
            self.log(
                f"job id {tracked.job_id} given again by Slurm: {earlier.name} -> {tracked.name}"
            )
        self.jobs[tracked.job_id] = tracked

    def harness_error(self, where: str, exc: BaseException) -> None:
        """Log an unexpected error of the soak itself with its traceback, and count it."""
        self.harness_errors.append(f"{where}: {type(exc).__name__}: {exc}"[:500])
        self.log(f"SOAK ERROR in {where}:\n" + "".join(traceback.format_exception(exc)))

    async def rounds(
        self, where: str, one_round: Callable[[], Awaitable[None]], every: float
    ) -> None:
        """Run `one_round` every `every` seconds for ever; an unexpected error is logged and
        counted, and the next round runs (a loop that died silently would blind the soak)."""
        while True:
            try:
                await one_round()
            except Exception as e:  # logged and counted
                self.harness_error(where, e)
            await asyncio.sleep(every)

    async def guarded(self, where: str, work: Awaitable[None]) -> None:
        """Await `work`; an unexpected error is logged and counted instead of lost."""
        try:
            await work
        except Exception as e:  # logged and counted
            self.harness_error(where, e)

    def rel(self, t: float) -> str:
        """`t` as +mm:ss from the start."""
        tenths = round(max(0.0, t - self.started_at) * 10)  # rounded once: never "+06:60.0"
        return f"+{tenths // 600:02d}:{tenths % 600 / 10:04.1f}"

    def log(self, text: str) -> None:
        now = time.time()
        self.events.append(Event(now, text))
        line = f"{self.rel(now)} {text}"
        self.echo(line)
        with (self.out / "events.log").open("a") as f:
            f.write(f"{time.strftime('%H:%M:%S', time.localtime(now))} {line}\n")
