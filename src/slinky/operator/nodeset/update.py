"""The rolling update rule.

Old-revision pods (ordinal >= `partition`) are replaced through the scale-in path (condemn,
drain, delete once drained); the scale-out step re-creates them at the new revision. At no
time are more than `maxUnavailable` pods unavailable, old and new counted together. A pod is
available when it has been Ready for `minReadySeconds`, is not condemned, and its Slurm node
is present and neither DOWN nor NOT_RESPONDING; an unavailable pod whose Slurm node runs
jobs still counts against `maxUnavailable` when it is chosen (`choose`). No update starts
while the Slurm view is not synced or while a scale-in is under way.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from typing import Any, cast

from slinky.api.v1alpha1.nodeset import RollingUpdate
from slinky.operator.nodeset import pods, scalein, slurmcontrol
from slinky.operator.nodeset.view import Context, View

JSON = dict[str, Any]


def max_unavailable(ru: RollingUpdate | None, replicas: int) -> int:
    raw = 1 if ru is None or ru.max_unavailable is None else ru.max_unavailable
    value = cast(int | str, raw)
    if isinstance(value, str):
        pct = int(value.rstrip("%"))
        return max(1, math.floor(replicas * pct / 100))
    return max(1, int(value))


def available(view: View, pod: JSON, now: dt.datetime) -> bool:
    """Kubernetes' availability: Ready for minReadySeconds (and not being removed)."""
    since = pods.ready_since(pod)
    if since is None or pods.condemned(pod) is not None:
        return False
    return (now - since).total_seconds() >= view.spec.min_ready_seconds


def available_in_slurm(view: View, pod: JSON, now: dt.datetime) -> bool:
    """What a rolling update counts: available, and the Slurm node can run jobs."""
    if not available(view, pod, now):
        return False
    if view.conn is None:
        return True  # no Slurm view to consult: Kubernetes readiness is all we know
    node = view.slurm_node(pod)
    return node is not None and not node.state.is_down and not node.state.has("NOT_RESPONDING")


def choose(
    ordered: list[scalein.Candidate], allowed: int, is_available: Callable[[JSON], bool]
) -> list[JSON]:
    """The old pods to replace now, from the most disposable: each available pod takes one
    of the `allowed` unavailabilities, and so does a pod whose Slurm node runs jobs however
    Kubernetes sees it (a readiness probe that timed out on a busy machine, a node briefly
    NOT_RESPONDING: draining it still takes a node from Slurm's users), and a Ready pod
    whose Slurm node the cache does not show (a view behind, not a broken pod). Only an
    unavailable pod with no job running goes without: replacing it costs nothing."""
    chosen = []
    for c in ordered:
        runs_jobs = c.node is not None and c.node.state.is_busy
        unseen = c.node is None and pods.is_ready(c.pod)
        if is_available(c.pod) or runs_jobs or unseen:
            if allowed <= 0:
                continue  # an unavailable idle pod later in the order may still go
            allowed -= 1
        chosen.append(c.pod)
    return chosen


async def rolling_update(ctx: Context, view: View) -> list[float]:
    strategy = view.spec.update_strategy
    if strategy.type != "RollingUpdate" or len(view.active) > view.spec.replicas:
        return []
    ru = strategy.rolling_update
    partition = ru.partition if ru else 0
    now = dt.datetime.now(dt.UTC)
    in_progress = [p for p in view.active.values() if pods.condemned(p) == scalein.CONDEMNED_UPDATE]
    old = [
        p
        for p in view.active.values()
        if pods.revision_of(p) != view.revision
        and view.ordinal(p) >= partition
        and pods.condemned(p) is None
    ]
    if not in_progress and not old:
        return []
    if not view.slurm_fresh("rolling update"):
        return [scalein.FRESH_VIEW_S]  # availability as of now, not as of the idle poll
    if not view.slurm_ready:
        return [scalein.DRAIN_RECHECK_S]
    waiting = await scalein.remove_all(
        ctx, view, in_progress, scalein.CONDEMNED_UPDATE, slurmcontrol.REASON_UPDATE
    )
    if not old:
        return [scalein.DRAIN_RECHECK_S] if waiting else []
    n_available = sum(1 for p in view.active.values() if available_in_slurm(view, p, now))
    allowed = max_unavailable(ru, view.spec.replicas) - max(0, view.spec.replicas - n_available)
    ordered = scalein.victims(scalein.candidates(view, old), len(old))
    chosen = choose(ordered, allowed, lambda pod: available_in_slurm(view, pod, now))
    waiting |= await scalein.remove_all(
        ctx, view, chosen, scalein.CONDEMNED_UPDATE, slurmcontrol.REASON_UPDATE
    )
    return [scalein.DRAIN_RECHECK_S] if waiting else []
