"""The soak's eyes: every few seconds, the bridge's pods (from the apiserver), then every job
(from Slurm, one `GET jobs/`: finished jobs are purged after MinJobAge=300s, so each is read
well before), and the HPA-driven NodeSet's replicas. Each round updates the records of the
work, tends the bridge pods (soak_work) and feeds the invariants one snapshot. Twice a second,
slurmctld's saved state on disk: whether a slurmctld killed then could start again."""

from __future__ import annotations

import time

from bench import soak_bed
from bench.soak_bed import BRIDGE_NAMESPACE, HPA_NODESET, NAMESPACE
from bench.soak_health import UNREACHABLE
from bench.soak_invariants import InvariantWatch, Snapshot
from bench.soak_state import Soak
from bench.soak_work import tend_bridge_pods, track_jobs
from slinky.kube import rest
from slinky.operator.resources import NODESETS
from slinky_testbed import slurmstate

OBSERVE_S = 3.0
SAVED_STATE_S = 0.5
WATCH_GAP_S = 30.0


async def observe_once(soak: Soak, invariants: InvariantWatch, *, final: bool = False) -> bool:
    """One round; returns whether both sides answered (a snapshot was judged)."""
    pods_at = time.time()
    try:
        pods = list((await soak.kube.list(rest.PODS, BRIDGE_NAMESPACE))["items"])
    except UNREACHABLE:
        pods = None
    jobs_at = time.time()
    try:
        jobs, _ = await soak.slurm.list_jobs()
    except UNREACHABLE:
        jobs = None
    if jobs is not None:
        if jobs_at - soak.jobs_listed_at > WATCH_GAP_S:
            soak.watch_gaps.append((soak.jobs_listed_at, jobs_at))
        soak.jobs_listed_at = jobs_at
        track_jobs(soak, jobs, jobs_at)
    if pods is not None:
        await tend_bridge_pods(soak, pods, pods_at)
    await note_hpa_nodeset(soak)
    if pods is None or jobs is None:
        return False
    invariants.sample(Snapshot(jobs_at, pods, jobs), final=final)
    return True


async def note_hpa_nodeset(soak: Soak) -> None:
    """Record when the HPA's NodeSet reached 0 pods and when it came back."""
    try:
        obj = await soak.kube.get(NODESETS, HPA_NODESET, NAMESPACE)
    except UNREACHABLE:
        return
    now = int((obj.get("status") or {}).get("replicas") or 0)
    at_zero = len(soak.hpa_zero_at) > len(soak.hpa_back_at)
    if now == 0 and not at_zero:
        soak.hpa_zero_at.append(time.time())
        soak.log(f"NodeSet {HPA_NODESET} at 0 pods (HPA)")
    elif now > 0 and at_zero:
        soak.hpa_back_at.append(time.time())
        soak.log(f"NodeSet {HPA_NODESET} back to {now} pods (HPA)")


async def observe_loop(soak: Soak, invariants: InvariantWatch) -> None:
    async def one_round() -> None:
        await observe_once(soak, invariants)

    await soak.rounds("observe", one_round, OBSERVE_S)


async def saved_state_loop(soak: Soak) -> None:
    """slurmctld's saved state, as a kill -9 now would leave it: a NodeSet node its saved
    partitions name and its saved nodes lack makes the restart fatal (soak seed 26: "fatal:
    Invalid node names in partition"). Seen even when no kill falls in that moment."""

    async def one_round() -> None:
        if bad := slurmstate.unknown_in_partitions(soak.bed.root, soak_bed.NODESETS):
            soak.unstartable.append((time.time(), sorted(bad)))

    await soak.rounds("saved state", one_round, SAVED_STATE_S)
