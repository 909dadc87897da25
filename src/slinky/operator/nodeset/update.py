"""The rolling update rule.

Old-revision pods (ordinal >= `partition`) are replaced through the scale-in path (condemn,
drain, delete once drained); the scale-out step re-creates them at the new revision. At no
time are more than `maxUnavailable` pods unavailable, old and new counted together. A pod is
available when it has been Ready for `minReadySeconds`, is not condemned, and its Slurm node
is present and neither DOWN nor NOT_RESPONDING. An old pod that is unavailable already is
replaced without taking one of the `maxUnavailable`, unless its Slurm node runs jobs or it
became Ready less than `REGISTRATION_WINDOW_S` ago and the view does not show its node as its
own slurmd registered it (`choose`). No update starts while the
Slurm view is not synced or while a scale-in is under way.
"""

from __future__ import annotations

import datetime as dt
import logging
import math
from collections.abc import Callable
from typing import cast

from slinky.api.v1alpha1.nodeset import RollingUpdate
from slinky.operator.nodeset import pods, scalein, slurmcontrol
from slinky.operator.nodeset.mirror import REGISTRATION_WINDOW_S
from slinky.operator.nodeset.view import Context, View
from slinky.slurm.models import Node, number
from slinky.types import JSON

log = logging.getLogger(__name__)


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
    ordered: list[scalein.Candidate],
    allowed: int,
    is_available: Callable[[JSON], bool],
    now: dt.datetime,
) -> tuple[list[JSON], list[JSON]]:
    """The old pods to replace now, from the most disposable, and those held back. Each
    available pod takes one of the `allowed` unavailabilities, and so does a pod whose Slurm
    node runs jobs however Kubernetes sees it (a readiness probe that timed out on a busy
    machine, a node briefly NOT_RESPONDING: draining it still takes a node from Slurm's
    users). Any other unavailable pod is counted as unavailable already, so replacing it
    costs nothing; but not while it is `settling`, unless the view shows its node as its own
    slurmd registered it (`own_registration`): that one is held back."""
    chosen: list[JSON] = []
    held: list[JSON] = []
    for c in ordered:
        runs_jobs = c.node is not None and c.node.state.is_busy
        if is_available(c.pod) or runs_jobs:
            if allowed <= 0:
                continue  # an unavailable idle pod later in the order may still go
            allowed -= 1
        elif settling(c.pod, now) > 0 and not own_registration(c.node, c.pod):
            held.append(c.pod)
            continue
        chosen.append(c.pod)
    return chosen, held


def own_registration(node: Node | None, pod: JSON) -> bool:
    """Whether the view shows the Slurm node as this pod's own slurmd registered it: a
    slurmd started no earlier than the pod was created. Its state (DOWN, say) is then a fact
    about this pod, not a view from before the registration or the record an earlier pod
    of the same name left behind, and needs no settling. Clocks that disagree make this
    false, which only means waiting for the window."""
    if node is None:
        return False
    started = number(node.raw.get("slurmd_start_time"))
    created = (pod.get("metadata") or {}).get("creationTimestamp")
    if not started or not created:
        return False
    return started >= int(pods.parse_time(str(created)).timestamp())


def settling(pod: JSON, now: dt.datetime) -> float:
    """Seconds left until the pod has been Ready for REGISTRATION_WINDOW_S (0: it has, or it
    is not Ready). Until then, whatever makes it look unavailable may be gone a moment
    later: its slurmd registers only after the container is Ready, and the Slurm view may
    predate that registration (an update right after the pods started saw Ready pods whose
    nodes the last poll did not show yet, took them all for unavailable and condemned them
    at once). Such a pod is not replaced for free: it waits for a view showing its node, or
    for the window to pass (a slurmd that never registers is then replaced for free)."""
    since = pods.ready_since(pod)
    if since is None:
        return 0.0
    return max(0.0, REGISTRATION_WINDOW_S - (now - since).total_seconds())


def to_replace(view: View) -> tuple[list[JSON], list[JSON]]:
    """The pods an update is replacing now (condemned for it), and the old pods still to go:
    not at the revision, at or above `rollingUpdate.partition`, not condemned."""
    ru = view.spec.update_strategy.rolling_update
    first = ru.partition if ru and ru.partition else 0
    in_progress = [p for p in view.active.values() if pods.condemned(p) == scalein.CONDEMNED_UPDATE]
    old = [
        p
        for p in view.active.values()
        if pods.revision_of(p) != view.revision
        and view.ordinal(p) >= first
        and pods.condemned(p) is None
    ]
    return in_progress, old


async def rolling_update(ctx: Context, view: View) -> list[float]:
    strategy = view.spec.update_strategy
    if strategy.type != "RollingUpdate" or len(view.active) > view.spec.replicas:
        return []
    ru = strategy.rolling_update
    now = dt.datetime.now(dt.UTC)
    in_progress, old = to_replace(view)
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
    chosen, held = choose(ordered, allowed, lambda p: available_in_slurm(view, p, now), now)
    if chosen or held:
        log.debug(
            "nodeset %s: rolling update: %d of %d available, %d more may go; replacing [%s]; "
            "held back while settling [%s]",
            view.key,
            n_available,
            view.spec.replicas,
            allowed,
            ", ".join(pods.name(p) for p in chosen[:20]),
            ", ".join(pods.name(p) for p in held[:20]),
        )
    waiting |= await scalein.remove_all(
        ctx, view, chosen, scalein.CONDEMNED_UPDATE, slurmcontrol.REASON_UPDATE
    )
    requeue = [scalein.DRAIN_RECHECK_S] if waiting else []
    if held:
        # Decided again when the first window ends, even if no event comes before (a slurmd
        # that never registers sends none).
        requeue.append(min(settling(p, now) for p in held))
    return requeue
