"""`kubectl slinky plan scale|rollout|delete NODESET`: what the operator would do, decided by
its own rules (`scalein.scale_in_victims`, `update.choose`, `sync.revision`: the same code,
not a copy) on what Kubernetes and Slurm say now, with when each pod goes at the latest:
a pod goes once the jobs on its Slurm node have ended, and Slurm knows each job's time limit.

Read-only: nothing is written. The times are upper bounds from time limits (a job that ends
early lets its pod go early); a job without a time limit makes the end unknown."""

from __future__ import annotations

import datetime as dt
import heapq
from typing import Any, cast

from slinky.api.schema import parse
from slinky.api.v1alpha1.nodeset import NodeSetSpec
from slinky.kubectl import render
from slinky.kubectl.render import Style
from slinky.kubectl.status import job_entry
from slinky.kubectl.world import SlurmSide, World
from slinky.operator.autoscale.metrics import nodeset_partition
from slinky.operator.clients import Connection
from slinky.operator.nodeset import pods, scalein, sync, update
from slinky.operator.nodeset.partition import claimed_by, runs_first
from slinky.operator.nodeset.view import View
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.models import Job, Partition, number
from slinky.types import JSON

# What a replacement pod takes from deletion to a registered slurmd (the rollout's next
# wave waits for it: `maxUnavailable`); measured on the test bed's real nodes.
POD_START_S = 20.0


class PlanError(Exception):
    """The plan cannot be made (no such NodeSet, no Slurm view)."""


def view_for(world: World, nodeset: JSON, side: SlurmSide, spec: NodeSetSpec | None = None) -> View:
    """The operator's View of the NodeSet, its cache filled from the lists just read (a
    Slurm informer that never polls: the rules read its nodes as they read the live one)."""
    meta = nodeset["metadata"]
    spec = spec or parse(NodeSetSpec, nodeset.get("spec"), "spec")
    cluster = next(
        (
            c
            for c in world.clusters
            if c["metadata"]["namespace"] == meta["namespace"]
            and c["metadata"]["name"] == spec.cluster_name
        ),
        None,
    )
    informer = SlurmInformer(cast(Any, None))
    informer.nodes.update(side.nodes)
    informer._synced.set()
    conn = Connection(side.cluster, "", side.server, cast(Any, None), informer, "")
    active: dict[str, JSON] = {}
    terminating: dict[str, JSON] = {}
    for p in world.nodeset_pods(nodeset):
        (terminating if p["metadata"].get("deletionTimestamp") else active)[pods.name(p)] = p
    key = f"{meta['namespace']}/{meta['name']}"
    return View(
        obj=nodeset,
        spec=spec,
        key=key,
        exp_key=key,
        revision=sync.revision(nodeset, spec, cluster),
        conf_server=None,
        conn=conn,
        active=active,
        terminating=terminating,
    )


def find(world: World, name: str) -> tuple[JSON, SlurmSide]:
    found = [n for n in world.nodesets if n["metadata"]["name"] == name]
    if not found:
        where = f"namespace {world.namespace}" if world.namespace else "any namespace"
        raise PlanError(f"no NodeSet named {name!r} in {where}")
    nodeset = found[0]
    side = world.slurm_of(nodeset)
    if side is None or side.error:
        why = side.error if side else "its Cluster is not found"
        raise PlanError(f"NodeSet {name}: cannot read Slurm ({why}); no plan without it")
    return nodeset, side


def latest_end(jobs: list[Job], now: float) -> float | None:
    """When the last of these jobs ends at the latest (now if none; None: one has no limit)."""
    ends = [job_entry(j, now)["endsAt"] for j in jobs]
    if any(e is None for e in ends):
        return None
    return max([now, *(float(e) for e in ends)])


# Why a pod's departure is unknown: the note `_finish` writes for the pods of each (None:
# another note says it already).
NO_LIMIT = "a job without a time limit holds {pods}: the end is unknown"


def step(view: View, side: SlurmSide, pod: JSON, now: float, start: float) -> JSON:
    """One pod leaving: the jobs that block it, and when it goes at the latest."""
    name = pods.name(pod)
    node = view.slurm_node(pod)
    jobs = side.jobs_on(name) if node is not None else []
    end = latest_end(jobs, now)
    goes = None if end is None else max(start, end)
    return {
        "pod": name,
        "kubeNode": pods.node_name(pod),
        "slurmState": str(node.state) if node else None,
        "jobs": [job_entry(j, now) for j in jobs],
        "goesAt": goes,
        "goesIn": None if goes is None else max(0, int(goes - now)),
        "unknownBecause": NO_LIMIT if goes is None else None,
    }


def unknown(s: JSON, note: str | None) -> None:
    """The step's departure becomes unknown, for the reason `note` gives."""
    s["goesAt"] = s["goesIn"] = None
    s["unknownBecause"] = note


def _finish(plan: JSON, steps: list[JSON], now: float) -> JSON:
    unknown = [s for s in steps if s["goesAt"] is None]
    done = None if unknown else max([now, *(s["goesAt"] for s in steps)])
    reasons: dict[str | None, list[str]] = {}
    for s in unknown:
        reasons.setdefault(s.get("unknownBecause"), []).append(s["pod"])
    plan["steps"] = sorted(steps, key=lambda s: (s["goesAt"] is None, s["goesAt"] or 0))
    for i, s in enumerate(plan["steps"], 1):
        s["order"] = i
    plan["completesAt"] = done
    plan["completesIn"] = None if done is None else max(0, int(done - now))
    for note, names in reasons.items():
        if note:
            plan["notes"].append(note.format(pods=", ".join(names)))
    plan["unknownBecause"] = [
        n.format(pods=", ".join(names)) if n else "see the notes" for n, names in reasons.items()
    ]
    return plan


def plan_scale(world: World, name: str, replicas: int) -> JSON:
    nodeset, side = find(world, name)
    view = view_for(world, nodeset, side)
    now = world.now
    current = len(view.active)
    plan: JSON = {
        "kind": "scale",
        "nodeset": view.key,
        "from": current,
        "to": replicas,
        "queued": [],
        "notes": [],
    }
    if replicas >= current:
        plan["notes"].append(f"scale-out: {replicas - current} pods are created, nothing drains")
        return _finish(plan, [], now)
    victims = scalein.scale_in_victims(view, current - replicas)
    steps = [step(view, side, p, now, now) for p in victims]
    for rank, (s, p) in enumerate(zip(steps, victims, strict=True), 1):
        s["victimRank"] = rank
        s["why"] = pods.condemned(p) or "scale-in"
    partition = nodeset_partition(nodeset)
    if replicas == 0 and view.spec.partition is not None and view.spec.partition.enabled:
        queued = side.queued_in(partition)
        plan["queued"] = [job_entry(j, now) for j in queued]
        if queued:
            plan["notes"].append(
                f"{len(queued)} jobs queued in partition {partition} wait for nodes (the "
                "partition stays; an autoscaler brings nodes back for them)"
            )
    return _finish(plan, steps, now)


def plan_delete(world: World, name: str) -> JSON:
    """Every pod drains at once; the jobs queued in the NodeSet's partition run first (on
    the nodes as they free, in job id order), the partition takes no new job meanwhile."""
    nodeset, side = find(world, name)
    view = view_for(world, nodeset, side)
    now = world.now
    plan: JSON = {"kind": "delete", "nodeset": view.key, "from": len(view.active), "to": 0}
    plan["notes"] = []
    steps = [step(view, side, p, now, now) for p in view.active.values()]
    queued: list[Job] = []
    partition = claimed_by(nodeset)  # the operator deletes only a partition it made
    if partition is not None:
        queued = sorted(
            (j for j in side.jobs.values() if runs_first(j, partition)), key=lambda j: j.job_id
        )
        plan["notes"].append(
            f"partition {partition} is set DRAIN first: new jobs are refused, the "
            f"{len(queued)} queued run before the pods go; then it is deleted"
        )
    plan["queued"] = [job_entry(j, now) for j in queued]
    if queued and steps:
        default = side.partitions.get(partition or "")
        too_big = _run_queued(steps, queued, now, partition_time_limit(default))
        if too_big:
            ids = ", ".join(str(j.job_id) for j in too_big)
            plan["notes"].append(
                f"jobs {ids} ask for more nodes than the NodeSet has: the deletion waits "
                "until they are cancelled (or annotate the NodeSet to skip the drain)"
            )
            for s in steps:
                unknown(s, None)
    return _finish(plan, steps, now)


def partition_time_limit(partition: Partition | None) -> int | None:
    """The minutes a job without its own limit gets there: DefaultTime, else MaxTime."""
    if partition is None:
        return None
    for group in ("defaults", "maximums"):
        minutes = number((partition.raw.get(group) or {}).get("time"))
        if minutes is not None:
            return minutes
    return None


def _run_queued(
    steps: list[JSON], queued: list[Job], now: float, default_limit: int | None
) -> list[Job]:
    """Place the queued jobs on the nodes as they free (earliest first) and push each node's
    departure past the jobs placed on it; a job without a limit of its own gets the
    partition's (`default_limit`). None stays None (no limit: unknown), and a node a queued
    job without any limit takes says so. Returns the jobs that never fit on these nodes
    (the deletion waits for them for ever)."""
    too_big: list[Job] = []
    free = [
        (s["goesAt"] if s["goesAt"] is not None else float("inf"), i) for i, s in enumerate(steps)
    ]
    heapq.heapify(free)
    for job in queued:
        count = max(1, job.node_count or 1)
        if count > len(steps):
            too_big.append(job)
            continue
        taken = [heapq.heappop(free) for _ in range(count)]
        start = max(t for t, _ in taken)
        limit = job.time_limit_min if job.time_limit_min is not None else default_limit
        end = float("inf") if limit is None or start == float("inf") else start + 60.0 * limit
        if end == float("inf"):
            # Unknown from now on: a queued job without a limit runs there, or the job
            # waits for a node whose departure is unknown already (its reason carries over).
            note = (
                next(steps[i]["unknownBecause"] for t, i in taken if t == float("inf"))
                if start == float("inf")
                else f"queued job {job.job_id} has no time limit and runs on {{pods}} first: "
                "the end is unknown"
            )
            for _, i in taken:
                if steps[i]["goesAt"] is not None:
                    unknown(steps[i], note)
        for _, i in taken:
            heapq.heappush(free, (end, i))
    for end, i in free:
        if end != float("inf"):
            steps[i]["goesAt"] = end
            steps[i]["goesIn"] = max(0, int(end - now))
    return too_big


def plan_rollout(world: World, name: str, new_nodeset: JSON | None = None) -> JSON:
    """The pods not at the target revision (the NodeSet's current template, or the
    template of `new_nodeset`), replaced `maxUnavailable` at a time in the update's order."""
    nodeset, side = find(world, name)
    target = nodeset
    if new_nodeset is not None:
        target = {
            **nodeset,
            "spec": {**(nodeset.get("spec") or {}), **(new_nodeset.get("spec") or {})},
        }
    spec = parse(NodeSetSpec, target.get("spec"), "spec")
    view = view_for(world, target, side, spec)
    now = world.now
    plan: JSON = {
        "kind": "rollout",
        "nodeset": view.key,
        "revision": view.revision,
        "queued": [],
        "notes": [],
    }
    strategy = spec.update_strategy
    plan["from"] = plan["to"] = len(view.active)
    if strategy.type != "RollingUpdate":
        plan["notes"].append(
            f"updateStrategy {strategy.type}: the operator replaces no pod; each goes when "
            "deleted by hand (it drains first)"
        )
        return _finish(plan, [], now)
    if len(view.active) > spec.replicas:
        plan["notes"].append(
            f"{len(view.active) - spec.replicas} pods more than replicas: the scale-in runs "
            "first (kubectl slinky plan scale), the update after it"
        )
        return _finish(plan, [], now)
    ru = strategy.rolling_update
    in_progress, old = update.to_replace(view)
    if not old and not in_progress:
        plan["notes"].append(f"every pod is at revision {view.revision}: nothing to replace")
        return _finish(plan, [], now)
    nowdt = dt.datetime.fromtimestamp(now, dt.UTC)

    def is_available(p: JSON) -> bool:
        return update.available_in_slurm(view, p, nowdt)

    n_available = sum(1 for p in view.active.values() if is_available(p))
    slots = update.max_unavailable(ru, spec.replicas)
    allowed = slots - max(0, spec.replicas - n_available)
    ordered = scalein.victims(scalein.candidates(view, old), len(old))
    chosen, held = update.choose(ordered, allowed, is_available, nowdt)
    plan["maxUnavailable"] = slots
    # Draining already (wave 0) and the first wave as the operator decides it now; each
    # freed slot (a replacement registered) then takes the next pod in the same order. A
    # slot held by another unavailable pod frees when that pod is back: unknown, so the
    # later waves are spread over the slots the first wave could use.
    steps = [step(view, side, p, now, now) | {"wave": 0} for p in in_progress]
    steps += [step(view, side, p, now, now) | {"wave": 1} for p in chosen]
    in_flight = [
        (s["goesAt"] + POD_START_S if s["goesAt"] is not None else float("inf")) for s in steps
    ]
    heapq.heapify(in_flight)
    capacity = max(1, len(in_flight), allowed + len(in_progress))
    chosen_names = {pods.name(p) for p in chosen}
    for c in ordered:
        if pods.name(c.pod) in chosen_names:
            continue
        start = heapq.heappop(in_flight) if len(in_flight) >= capacity else now
        if start == float("inf"):
            s = step(view, side, c.pod, now, now) | {"goesAt": None, "goesIn": None}
        else:
            s = step(view, side, c.pod, now, start)
        s["wave"] = 2
        steps.append(s)
        heapq.heappush(
            in_flight, s["goesAt"] + POD_START_S if s["goesAt"] is not None else float("inf")
        )
    if held:
        plan["notes"].append(
            "held back while their slurmd registers: " + ", ".join(pods.name(p) for p in held)
        )
    plan["notes"].append(
        f"replacements take about {POD_START_S:.0f}s each to register before the next wave"
    )
    return _finish(plan, steps, now)


def text(plan: JSON, style: Style = render.PLAIN) -> str:
    kind = plan["kind"]
    head = {
        "scale": f"Scale NodeSet {plan['nodeset']} from {plan['from']} to {plan['to']} replicas",
        "delete": f"Delete NodeSet {plan['nodeset']} ({plan['from']} pods)",
        "rollout": f"Roll NodeSet {plan['nodeset']} to revision {plan.get('revision')}",
    }[kind]
    out = [style(head, "bold")]
    if plan["steps"]:
        rows = []
        for s in plan["steps"]:
            jobs = "; ".join(
                f"{j['id']} {j['user']} {j['name']} "
                + (
                    "(no time limit)"
                    if j["endsAt"] is None
                    else f"(ends by {render.clock(j['endsAt'])})"
                )
                for j in s["jobs"]
            )
            when = (
                "unknown"
                if s["goesAt"] is None
                else (
                    "now"
                    if s["goesIn"] == 0
                    else f"in {render.duration(s['goesIn'])} ({render.clock(s['goesAt'])})"
                )
            )
            rows.append(
                [
                    str(s["order"]),
                    s["pod"],
                    render.coloured_state(style, s["slurmState"] or "not registered"),
                    jobs or "-",
                    when,
                ]
            )
        out.extend(
            render.table(["#", "POD", "SLURM STATE", "BLOCKED BY", "GOES"], rows, indent="  ")
        )
    if plan["queued"]:
        out.append(
            "  queued in its partition: "
            + ", ".join(f"{j['id']} ({j['user']})" for j in plan["queued"])
        )
    for note in plan["notes"]:
        out.append(f"  note: {note}")
    if plan["completesAt"] is None:
        why = (
            "a job without a time limit"
            if all(
                s.get("unknownBecause") == NO_LIMIT for s in plan["steps"] if s["goesAt"] is None
            )
            else "see the notes"
        )
        out.append(style(f"  completes: unknown ({why})", "yellow"))
    elif plan["completesIn"] == 0:
        out.append(style("  completes: at once (nothing runs on these nodes)", "green"))
    else:
        out.append(
            f"  completes at the latest in {render.duration(plan['completesIn'])} "
            f"({render.clock(plan['completesAt'])})"
        )
    return "\n".join(out)
