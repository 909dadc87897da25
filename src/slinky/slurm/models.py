"""Typed views of the slurmrestd objects we use (identical in data parsers v0.0.44 and
v0.0.45 for these fields). Each keeps its `raw` dict for anything not modelled."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from slinky.types import JSON

BASE_STATES = ("IDLE", "ALLOCATED", "MIXED", "DOWN", "ERROR", "FUTURE", "UNKNOWN", "INVALID")
BUSY_BASES = ("ALLOCATED", "MIXED")


def number(value: Any) -> int | None:
    """A Slurm `*_no_val_struct` ({set, infinite, number}) or plain int, as int or None."""
    if isinstance(value, dict):
        if not value.get("set") or value.get("infinite"):
            return None
        return int(value.get("number") or 0)
    if isinstance(value, int):
        return value
    return None


def csv(value: Any) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value if v]
    if isinstance(value, str):
        return [v for v in value.split(",") if v]
    return []


def expand_hostlist(hostlist: str) -> list[str]:
    """Slurm's compressed host list as names: "cpu-[0-2,5],gpu-1" -> cpu-0 cpu-1 cpu-2 cpu-5
    gpu-1. Zero padding is kept ("n[08-10]" -> n08 n09 n10)."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", hostlist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                out += expand_hostlist(f"{prefix}{i:0{width}d}{suffix}")
    return out


@dataclass(frozen=True)
class NodeState:
    """A node's base state plus flags, e.g. IDLE+DRAIN or MIXED+COMPLETING."""

    base: str
    flags: frozenset[str]

    @classmethod
    def parse(cls, states: list[str] | str | None) -> NodeState:
        items = (
            [s.upper() for s in csv(states)]
            if not isinstance(states, list)
            else [str(s).upper() for s in states]
        )
        base = next((s for s in items if s in BASE_STATES), "UNKNOWN")
        return cls(base, frozenset(s for s in items if s != base))

    def __str__(self) -> str:
        return "+".join([self.base, *sorted(self.flags)])

    def has(self, flag: str) -> bool:
        return flag in self.flags or self.base == flag

    @property
    def is_busy(self) -> bool:
        """Runs (or is finishing) jobs."""
        return self.base in BUSY_BASES or "COMPLETING" in self.flags

    @property
    def is_drain(self) -> bool:
        """Marked DRAIN (whether or not jobs still run)."""
        return "DRAIN" in self.flags

    @property
    def is_drained(self) -> bool:
        """DRAIN and nothing runs: safe to remove."""
        return self.is_drain and not self.is_busy

    @property
    def is_down(self) -> bool:
        return self.base == "DOWN"

    @property
    def is_idle(self) -> bool:
        return self.base == "IDLE"


@dataclass(frozen=True)
class Node:
    name: str
    state: NodeState
    reason: str = ""
    comment: str = ""
    features: list[str] = field(default_factory=list)
    active_features: list[str] = field(default_factory=list)
    partitions: list[str] = field(default_factory=list)
    cpus: int = 0
    alloc_cpus: int = 0
    real_memory: int = 0
    alloc_memory: int = 0
    address: str = ""
    hostname: str = ""
    port: int = 0
    reason_set_by_user: str = ""
    # When the slurmd of this record registered; 0 for a record no running slurmd made
    # (restored from slurmctld's saved state, or made with `scontrol create`).
    slurmd_start_time: int = 0
    # Its place in the topologies (`<topology>:<switch or block>,...`), as set by
    # topology.yaml or `scontrol update Topology=`.
    topology: str = ""
    raw: JSON = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, raw: JSON) -> Node:
        return cls(
            name=str(raw.get("name", "")),
            state=NodeState.parse(raw.get("state")),
            reason=str(raw.get("reason") or ""),
            comment=str(raw.get("comment") or ""),
            features=csv(raw.get("features")),
            active_features=csv(raw.get("active_features")),
            partitions=csv(raw.get("partitions")),
            cpus=int(raw.get("cpus") or 0),
            alloc_cpus=int(raw.get("alloc_cpus") or 0),
            real_memory=int(raw.get("real_memory") or 0),
            alloc_memory=int(raw.get("alloc_memory") or 0),
            address=str(raw.get("address") or ""),
            hostname=str(raw.get("hostname") or ""),
            port=int(raw.get("port") or 0),
            reason_set_by_user=str(raw.get("reason_set_by_user") or ""),
            slurmd_start_time=number(raw.get("slurmd_start_time")) or 0,
            topology=str(raw.get("topology") or ""),
            raw=raw,
        )


TERMINAL_JOB_STATES = {
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
}


@dataclass(frozen=True)
class Job:
    job_id: int
    name: str
    state: list[str]
    nodes: str = ""
    partition: str = ""
    user_name: str = ""
    comment: str = ""
    flags: list[str] = field(default_factory=list)
    time_limit_min: int | None = None
    start_time: int | None = None
    end_time: int | None = None
    node_count: int | None = None
    cpus: int | None = None
    state_reason: str = ""
    exit_code: int | None = None
    raw: JSON = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, raw: JSON) -> Job:
        exit_code = raw.get("exit_code")
        return cls(
            job_id=int(raw.get("job_id") or 0),
            name=str(raw.get("name") or ""),
            state=[str(s) for s in raw.get("job_state") or []],
            nodes=str(raw.get("nodes") or ""),
            partition=str(raw.get("partition") or ""),
            user_name=str(raw.get("user_name") or ""),
            comment=str(raw.get("comment") or ""),
            flags=[str(f) for f in raw.get("flags") or []],
            time_limit_min=number(raw.get("time_limit")),
            start_time=number(raw.get("start_time")),
            end_time=number(raw.get("end_time")),
            node_count=number(raw.get("node_count")),
            cpus=number(raw.get("cpus")),
            state_reason=str(raw.get("state_reason") or ""),
            exit_code=number(exit_code.get("return_code")) if isinstance(exit_code, dict) else None,
            raw=raw,
        )

    @property
    def is_running(self) -> bool:
        return "RUNNING" in self.state

    @property
    def is_pending(self) -> bool:
        return "PENDING" in self.state

    @property
    def is_finished(self) -> bool:
        return bool(TERMINAL_JOB_STATES & set(self.state))

    @property
    def is_suspended(self) -> bool:
        return "SUSPENDED" in self.state


@dataclass(frozen=True)
class Partition:
    name: str
    nodes: str
    state: str
    raw: JSON = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, raw: JSON) -> Partition:
        nodes = raw.get("nodes") or {}
        part = raw.get("partition") or {}
        return cls(
            name=str(raw.get("name") or ""),
            nodes=str(nodes.get("configured") or ""),
            state=",".join(part.get("state") or []),
            raw=raw,
        )


@dataclass(frozen=True)
class Reservation:
    name: str
    node_list: str
    start_time: int | None
    end_time: int | None
    raw: JSON = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def parse(cls, raw: JSON) -> Reservation:
        return cls(
            name=str(raw.get("name") or ""),
            node_list=str(raw.get("node_list") or ""),
            start_time=number(raw.get("start_time")),
            end_time=number(raw.get("end_time")),
            raw=raw,
        )


@dataclass(frozen=True)
class Ping:
    hostname: str
    responding: bool
    latency_us: int
    slurm_version: str
    data_parser: str


@dataclass(frozen=True)
class Resources:
    """`GET /resources/{job_id}`: the cores per node of an allocation."""

    job_id: int
    raw: JSON = field(default_factory=dict, compare=False, repr=False)
