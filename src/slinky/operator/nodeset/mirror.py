"""State both ways between pods and Slurm nodes.

Slurm -> pods: each pod gets `SlurmNodeState*` conditions mirroring its Slurm node, the
`pod-protect` label while jobs run (the PodDisruptionBudget selects it), and its identity
goes into the Slurm node's comment. A node record slurmctld restored from state saved
before the pod's slurmd registered (`stale_address`: an earlier pod's NodeAddr, no slurmd
start time) is pointed at the pod's IP, so slurmctld reaches the slurmd that runs there.

Kubernetes -> Slurm: a `pod-cordon` annotation, or a problem of the pod's Kubernetes node
(`node_problem`: cordoned, NotReady, or a condition the operator was told to watch, such as
Node Problem Detector's KernelDeadlock) drains the Slurm node with a reason naming it;
lifting it undrains, but only drains the operator made.

Both run only while the Slurm view is synced, and never touch a Slurm node whose comment
names another pod.
"""

from __future__ import annotations

import datetime as dt
import functools
import logging
from collections.abc import Awaitable, Callable

from slinky.kube import conditions, events, nodehealth
from slinky.kube.nodehealth import NodeHealth
from slinky.operator.clients import Connection
from slinky.operator.nodeset import pods, scalein, slurmcontrol
from slinky.operator.nodeset.builder import (
    ANNOTATION_CORDON,
    ANNOTATION_NODE_CORDON_REASON,
    LABEL_PROTECT,
    PRESTOP_REASON,
    REASON_PREFIX,
    ordinal_of,
    slurm_comment,
)
from slinky.operator.nodeset.view import Context, View, belongs_to, claimant
from slinky.slurm.errors import SlurmError
from slinky.slurm.models import Node
from slinky.types import JSON

log = logging.getLogger(__name__)

# How long after a pod became Ready its Slurm node is waited for with fast polls (so its
# comment and state show up at once); a slurmd that never registers (kwok, a broken image)
# does not keep the informer polling fast.
REGISTRATION_WINDOW_S = 60.0
# A deadline below is looked at again this long after it passes (the poll that shows it
# needs a moment), and this often while the Slurm view is older than the deadline.
DEADLINE_MARGIN_S = 1.0
STALE_RECHECK_S = 2.0
# A pod Ready this long whose Slurm node the (fresh) view still does not show never
# registered, or slurmctld lost its registration (a restart from state saved before it: its
# slurmd is not asked again and the pod stays Ready, useless). See `unregistered`.
REGISTRATION_DEADLINE_S = 120.0
WRITES_IN_FLIGHT = 16
SLURM_CONDITIONS = (
    "Idle",
    "Allocated",
    "Mixed",
    "Down",
    "Drain",
    "Completing",
    "NotResponding",
    "Fail",
)


def slurm_conditions(node: Node) -> dict[str, tuple[bool, str]]:
    """Pod condition type -> (status, message) for a Slurm node state."""
    s = node.state
    flags = {
        "Idle": s.base == "IDLE",
        "Allocated": s.base == "ALLOCATED",
        "Mixed": s.base == "MIXED",
        "Down": s.base == "DOWN",
        "Drain": s.is_drain,
        "Completing": s.has("COMPLETING"),
        "NotResponding": s.has("NOT_RESPONDING"),
        "Fail": s.has("FAIL"),
    }
    out = {}
    for name in SLURM_CONDITIONS:
        on = flags[name]
        message = node.reason if on and name in ("Down", "Drain", "Fail") else ""
        out[f"SlurmNodeState{name}"] = (on, message)
    return out


def changed_conditions(pod: JSON, node: Node) -> list[JSON]:
    existing = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}
    now = conditions.now_rfc3339()
    changed = []
    for ctype, (on, message) in slurm_conditions(node).items():
        status = "True" if on else "False"
        old = existing.get(ctype)
        if old and old.get("status") == status and (old.get("message") or "") == message:
            continue
        ltt = old["lastTransitionTime"] if old and old.get("status") == status else now
        changed.append(
            {
                "type": ctype,
                "status": status,
                "lastTransitionTime": ltt,
                "reason": f"SlurmNode{ctype.removeprefix('SlurmNodeState')}",
                "message": message,
            }
        )
    return changed


def stale_address(pod: JSON, node: Node) -> str | None:
    """The pod's IP when its Slurm node's record is not its slurmd's registration but one
    slurmctld restored from state saved before it (soak run 6: a rolling update's new pod
    registered, slurmctld was killed and came back with its predecessor's record): the
    address is another pod's and no slurmd started since. slurmctld then pings an address
    no one has, the node stops responding, and a job it believes running there never
    finishes completing. None otherwise, in particular for a record a running slurmd made
    (its NodeAddr may differ from the pod IP behind NAT: left alone)."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip or not node.address or node.address == ip or node.slurmd_start_time:
        return None
    return str(ip) if pods.is_ready(pod) else None


async def readdress(ctx: Context, view: View, conn: Connection, pod: JSON) -> None:
    """Point the pod's Slurm node record at the pod's IP (`stale_address`), after a live
    read confirms it: passes made before the cache shows the write do not repeat it."""
    name = pods.name(pod)
    try:
        node = await conn.client.get_node(name)
        ip = stale_address(pod, node) if belongs_to(node, view.namespace, name) else None
        if ip is None:
            return
        await conn.client.update_node(name, extra={"address": ip})
    except SlurmError as e:
        log.info("nodeset %s: cannot set the address of Slurm node %s (%s)", view.key, name, e)
        return
    ctx.recorder.event(
        view.obj,
        events.WARNING,
        "SlurmNodeReaddressed",
        f"Slurm node {name} had the address of an earlier pod ({node.address}; slurmctld "
        f"restored it from saved state): set to the pod's {ip}",
    )
    log.warning("nodeset %s: Slurm node %s readdressed %s -> %s", view.key, name, node.address, ip)


async def mirror_slurm(ctx: Context, view: View) -> None:
    """Writes only what changed, concurrently (bounded): when many jobs end at once, the
    pods of their nodes must not wait for each other's patches before the scale-in step."""
    assert view.conn is not None
    conn = view.conn
    work: list[Callable[[], Awaitable[None]]] = []
    for pod, node in view.pods_with_nodes():
        if stale_address(pod, node) is not None:
            work.append(functools.partial(readdress, ctx, view, conn, pod))
        changed = changed_conditions(pod, node)
        protect = "true" if node.state.is_busy else None
        comment = slurm_comment(pod) if pods.node_name(pod) else node.comment
        if changed or pods.label(pod, LABEL_PROTECT) != protect or node.comment != comment:
            one = functools.partial(mirror_one, changed=changed, comment=comment)
            work.append(functools.partial(one, ctx, conn, pod, node))
    await scalein.bounded(work, WRITES_IN_FLIGHT)


async def mirror_one(
    ctx: Context, conn: Connection, pod: JSON, node: Node, *, changed: list[JSON], comment: str
) -> None:
    if changed:
        await ctx.podcontrol.patch_conditions(pod, changed)
    protect = "true" if node.state.is_busy else None
    if pods.label(pod, LABEL_PROTECT) != protect:
        await ctx.podcontrol.patch_metadata(pod, labels={LABEL_PROTECT: protect})
    await slurmcontrol.set_comment(conn, node, comment)


def was_slurm_node(pod: JSON) -> bool:
    """The pod carries the conditions `mirror_slurm` writes: its Slurm node existed once
    (evidence that outlives the operator process, unlike anything kept in memory)."""
    return any(
        str(c.get("type", "")).startswith("SlurmNodeState")
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def registering(view: View) -> bool:
    """A pod Ready for less than REGISTRATION_WINDOW_S whose Slurm node is not known yet."""
    if view.conn is None:
        return False
    now = dt.datetime.now(dt.UTC)
    nodes = view.conn.informer.nodes
    for pod in view.active.values():
        since = pods.ready_since(pod)
        if (
            since is not None
            and (now - since).total_seconds() < REGISTRATION_WINDOW_S
            and pods.name(pod) not in nodes
        ):
            return True
    return False


def unregistered(view: View) -> list[JSON]:
    """Active pods Ready for REGISTRATION_DEADLINE_S whose Slurm node Slurm does not know,
    by a view polled after that deadline passed (not condemned: those go anyway)."""
    return [pod for pod, left in _unregistered_clocks(view) if _due(view, left)]


def departed(view: View) -> list[Node]:
    """Slurm nodes of this NodeSet that outlived their pod: named `<nodeset>-<ordinal>`, no
    pod of that name (active or terminating), and `outlived` by the cached view. The pod's
    preStop deletes its node; it could not when slurmctld was down then, and a slurmctld
    restarted from state saved before the delete brings the node back. Left there, it stays
    DOWN in `sinfo` for ever. (A walk of the cached nodes, in memory: the node has no pod to
    look it up by.)"""
    if view.conn is None or not view.slurm_ready:
        return []
    prefix = view.name + "-"
    out = []
    for name, node in view.conn.informer.nodes.items():
        if not name.startswith(prefix) or ordinal_of(view.name, name) is None:
            continue
        if name in view.active or name in view.terminating:
            continue
        if outlived(node, view.namespace) or only_completing(node, view.namespace):
            out.append(node)
    return out


def slurmd_gone(node: Node, namespace: str) -> bool:
    """A node our slurmd made, and that slurmd is gone: a dynamic node (`slurmd -Z`; a node
    of slurm.conf named like a pod is never one), NOT_RESPONDING (or set DOWN by its
    preStop), whose comment names the pod of its name in `namespace`, or nothing (a
    slurmctld restarted from older state may have lost the comment too)."""
    return (
        claimant(node.comment) in ((namespace, node.name), None)
        and node.state.has("DYNAMIC_NORM")
        and (node.state.has("NOT_RESPONDING") or downed_by_prestop(node))
    )


def downed_by_prestop(node: Node) -> bool:
    """Set DOWN by its pod's preStop, which ended there (it waited for the node to leave the
    NodeSet's partition in vain): with the pod gone, no slurmd runs for it."""
    return node.state.base == "DOWN" and node.reason.startswith(PRESTOP_REASON)


def outlived(node: Node, namespace: str) -> bool:
    """`slurmd_gone`, and nothing allocated or completing on it: the record can go."""
    return slurmd_gone(node, namespace) and not node.state.is_busy


def only_completing(node: Node, namespace: str) -> bool:
    """`slurmd_gone` with jobs that have ended but are still COMPLETING on it, none running:
    Slurm waits for an epilog that no slurmd will run, until SlurmdTimeout marks the node
    DOWN (5 minutes by default). Marking it DOWN now ends that wait; no job is stopped."""
    return (
        slurmd_gone(node, namespace)
        and node.state.base == "IDLE"  # no job running: ALLOCATED or MIXED otherwise
        and node.state.has("COMPLETING")
    )


def _due(view: View, left: float) -> bool:
    """Past the deadline by a view polled after it passed."""
    return view.conn is not None and left < 0 and view.conn.informer.polled_ago < -left


def recheck_in(view: View) -> float | None:
    """Seconds until the rules for lost and unreachable Slurm nodes (`unregistered`,
    `unreachable`) should look again: when the next such pod reaches its deadline, or soon
    when one is past it but the Slurm view predates that (fast polls are asked for). No
    event comes at a deadline: the pod and its Slurm node stay as they are, so without this
    the NodeSet waited for some unrelated change (soak run 8: over 4 minutes)."""
    if view.conn is None or not view.slurm_ready:
        return None
    lefts = [left for _, left in _unregistered_clocks(view)]
    lefts += [left for _, left in _unresponsive_clocks(view)]
    ahead = [left for left in lefts if left >= 0]
    stale = [left for left in lefts if left < 0 and not _due(view, left)]
    if stale:
        view.waits.append("a fresh Slurm view of nodes past their registration deadline")
        return STALE_RECHECK_S
    return min(ahead) + DEADLINE_MARGIN_S if ahead else None


def _unregistered_clocks(view: View) -> list[tuple[JSON, float]]:
    """(pod, seconds left until REGISTRATION_DEADLINE_S) for the active, Ready, not
    condemned pods whose Slurm node the view does not show (the clock starts when the pod
    became Ready)."""
    if view.conn is None or not view.slurm_ready:
        return []
    now = dt.datetime.now(dt.UTC)
    known = view.conn.informer.nodes
    out = []
    for pod in view.active.values():
        since = pods.ready_since(pod)
        if since is None or pods.condemned(pod) is not None or pods.name(pod) in known:
            continue
        out.append((pod, REGISTRATION_DEADLINE_S - (now - since).total_seconds()))
    return out


def _unresponsive_clocks(view: View) -> list[tuple[JSON, float]]:
    """The same for pods whose Slurm node is NOT_RESPONDING without jobs (the clock starts
    when the mirror saw it so: the condition's transition time)."""
    if view.conn is None or not view.slurm_ready:
        return []
    now = dt.datetime.now(dt.UTC)
    out = []
    for pod, node in view.pods_with_nodes():
        if pods.condemned(pod) is not None or pods.ready_since(pod) is None:
            continue
        if not unresponsive_without_jobs(node):
            continue
        cond = conditions.find(
            (pod.get("status") or {}).get("conditions"), "SlurmNodeStateNotResponding"
        )
        if not cond or cond.get("status") != "True" or not cond.get("lastTransitionTime"):
            continue
        since = pods.parse_time(str(cond["lastTransitionTime"]))
        out.append((pod, REGISTRATION_DEADLINE_S - (now - since).total_seconds()))
    return out


def unresponsive_without_jobs(node: Node) -> bool:
    """NOT_RESPONDING with no job on it and none completing: IDLE, or DOWN as slurmctld sets
    a node that stopped responding (reason "Not responding"; it ended the jobs there). A
    DOWN with any other reason is an admin's or Slurm's word, never undone by a new pod."""
    s = node.state
    if not s.has("NOT_RESPONDING") or s.has("COMPLETING"):
        return False
    return s.base == "IDLE" or (s.base == "DOWN" and node.reason == "Not responding")


def unreachable(view: View) -> list[JSON]:
    """Active Ready pods whose own Slurm node has been NOT_RESPONDING without jobs for over
    REGISTRATION_DEADLINE_S (the mirrored condition's transition time), by a view polled
    after that: slurmctld pings an address the pod no longer has (a kill -9 restored the
    node record of the pod's predecessor, saved before this pod registered) or its slurmd
    hangs. No job is on the node; replacing the pod registers it anew."""
    return [pod for pod, left in _unresponsive_clocks(view) if _due(view, left)]


def cordon_reason(ctx: Context, pod: JSON) -> str | None:
    """The drain reason a cordon or a node problem asks for, or None."""
    if pods.annotation(pod, ANNOTATION_CORDON) == "true":
        return slurmcontrol.REASON_POD_CORDON
    node_name = pods.node_name(pod)
    node = ctx.nodes.store.get(node_name) if node_name else None
    problem = node_problem(node, ctx.node_health) if node else None
    return f"{REASON_PREFIX}{problem}" if problem else None


def node_problem(node: JSON, health: NodeHealth) -> str | None:
    """Why a Kubernetes node should run no new Slurm job, or None: the shared rule of
    `slinky.kube.nodehealth`, a cordon worded by the `node-cordon-reason` annotation."""
    why = (node["metadata"].get("annotations") or {}).get(ANNOTATION_NODE_CORDON_REASON)
    return nodehealth.problem(node, health, cordon_reason=str(why) if why else None)


async def sync_cordon(ctx: Context, view: View) -> None:
    assert view.conn is not None
    for pod, node in view.pods_with_nodes():
        name = node.name
        reason = cordon_reason(ctx, pod)
        if reason and not node.state.is_drain:
            if await slurmcontrol.drain(view.conn, name, reason, namespace=view.namespace):
                ctx.recorder.event(
                    view.obj, events.NORMAL, "Cordoned", f"Slurm node {name} drained: {reason}"
                )
        elif (
            not reason
            and pods.condemned(pod) is None
            and node.state.is_drain
            and slurmcontrol.is_operator_reason(node.reason)
            and await slurmcontrol.undrain(view.conn, name, namespace=view.namespace)
        ):
            ctx.recorder.event(
                view.obj,
                events.NORMAL,
                "Undrained",
                f"Slurm node {name} undrained (was: {node.reason})",
            )
