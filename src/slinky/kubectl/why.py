"""`kubectl slinky why NAME`: why a slurmd pod is not being deleted (the drain and the jobs it
waits for), why a bridge pod is Pending (Slurm's reason for its placeholder job, the bridge's
condition, the constraints it asked for), why a NodeSet does not scale (its HPA, the metric,
the partition). NAME is a pod; `nodeset/NAME` asks about a NodeSet."""

from __future__ import annotations

from slinky.kube import rest
from slinky.kubectl import render, status
from slinky.kubectl.render import Style
from slinky.kubectl.world import BRIDGE_JOBID_LABEL, World, is_bridge_pod
from slinky.operator.autoscale.metrics import (
    Ceiling,
    counts,
    hpa_ceiling,
    never_fits,
    nodeset_of,
    nodeset_partition,
)
from slinky.operator.nodeset.builder import LABEL_NODESET
from slinky.types import JSON

SLURMJOB_PREFIX = "slurmjob.slinky.slurm.net/"


class WhyError(Exception):
    """Nothing of that name."""


async def events_about(kube: rest.Kube, namespace: str, name: str) -> list[JSON]:
    """The object's recent events (events.k8s.io), newest last."""
    try:
        data = await kube.list(
            rest.EVENTS, namespace, params={"fieldSelector": f"regarding.name={name}"}
        )
    except rest.ApiError:
        return []
    items = list(data.get("items") or [])
    items.sort(key=lambda e: str(e.get("eventTime") or e.get("deprecatedLastTimestamp") or ""))
    return [
        {"type": e.get("type"), "reason": e.get("reason"), "note": e.get("note")}
        for e in items[-8:]
    ]


def explain_pod(world: World, pod: JSON, events: list[JSON]) -> JSON:
    meta = pod["metadata"]
    labels = meta.get("labels") or {}
    lines: list[str] = []
    out: JSON = {"kind": "Pod", "namespace": meta["namespace"], "name": meta["name"]}
    if nodeset_name := labels.get(LABEL_NODESET):
        nodeset = next(
            (
                n
                for n in world.nodesets
                if n["metadata"]["name"] == nodeset_name
                and n["metadata"]["namespace"] == meta["namespace"]
            ),
            None,
        )
        side = world.slurm_of(nodeset) if nodeset else None
        entry = status.pod_entry(pod, side, world.now)
        out["pod"] = entry
        going = entry["condemned"] or meta.get("deletionTimestamp")
        if not going:
            lines.append(
                f"slurmd pod of NodeSet {nodeset_name}; nothing removes it now "
                f"(Slurm node {entry['slurmState'] or 'not registered'})"
            )
        else:
            why = entry["condemned"] or "its deletion was requested"
            lines.append(f"leaving: {why}")
            if entry["condemnedAt"]:
                deadline = entry["drainDeadline"]
                lines.append(
                    f"condemned since {entry['condemnedAt']}"
                    + (
                        f"; its node's jobs end by {deadline} at the latest (time limits)"
                        if deadline
                        else ""
                    )
                )
            state = entry["slurmState"] or "not registered"
            if entry["jobs"]:
                lines.append(
                    f"waits for its Slurm node {meta['name']} ({state}) to finish "
                    f"{len(entry['jobs'])} jobs: {status.jobs_text(entry['jobs'])}"
                )
            elif "DRAIN" in state:
                lines.append(f"its Slurm node is {state}, idle: it goes on the next pass")
            else:
                lines.append(f"its Slurm node is {state}: the operator drains it first")
            if entry["busyProtected"]:
                lines.append(
                    "busy-pod protection is on: a plain `kubectl delete pod` is refused and "
                    "evictions wait (PodDisruptionBudget) while jobs run"
                )
        if side is not None and side.error:
            lines.append(f"Slurm cannot be read now: {side.error}")
    elif is_bridge_pod(pod):
        entry = status.bridge_entry(world, pod)
        out["pod"] = entry
        asked = {
            k.removeprefix(SLURMJOB_PREFIX): v
            for k, v in (meta.get("annotations") or {}).items()
            if k.startswith(SLURMJOB_PREFIX)
        }
        out["asked"] = asked
        if entry["phase"] == "Pending":
            if entry["unscheduledReason"]:
                lines.append(f"the bridge says: {entry['unscheduledReason']}")
            if entry["jobId"] is None:
                lines.append("no placeholder job yet: the bridge's scheduler has not submitted one")
            else:
                lines.append(
                    f"placeholder job {entry['jobId']} is {entry['jobState']}"
                    + (f", Slurm's reason: {entry['jobReason']}" if entry["jobReason"] else "")
                )
            if asked:
                lines.append(
                    "asked of Slurm: " + ", ".join(f"{k}={v}" for k, v in sorted(asked.items()))
                )
        else:
            lines.append(
                f"{entry['phase']} on {entry['kubeNode'] or '-'}; placeholder job "
                f"{entry['jobId']} is {entry['jobState']} on {entry['jobNodes'] or '-'}"
            )
        if labels.get(BRIDGE_JOBID_LABEL) is None and entry["phase"] != "Pending":
            lines.append("it has no placeholder job label")
    else:
        lines.append("neither a NodeSet's pod nor a bridge pod: Slinky does nothing with it")
    warnings = [e for e in events if e.get("type") == "Warning"]
    if warnings:
        lines.append(
            "recent warnings: " + "; ".join(f"{e['reason']}: {e['note']}" for e in warnings[-3:])
        )
    out["events"] = events
    out["why"] = lines
    return out


def jobs_never_fitting(world: World, nodeset: JSON) -> list[tuple[int, str]]:
    """The queued jobs of the NodeSet's partition it can never run (job id, why), by the
    operator's own rule (autoscale.metrics.never_fits): they are not counted as its demand.
    For `kubectl slinky status` too."""
    side = world.slurm_of(nodeset)
    if side is None or side.error:
        return []
    meta = nodeset["metadata"]
    key = (meta["namespace"], meta["name"])
    targets = [
        hpa
        for hpa in world.hpas
        if hpa["metadata"]["namespace"] == meta["namespace"]
        and ((hpa.get("spec") or {}).get("scaleTargetRef") or {}).get("kind") == "NodeSet"
        and hpa["spec"]["scaleTargetRef"].get("name") == meta["name"]
    ]
    nodes, source = hpa_ceiling(targets)
    own = [n for n in side.nodes.values() if nodeset_of(n) == key]
    ceiling = Ceiling(
        nodes=nodes,
        cpus=max((n.cpus for n in own), default=0) or None,
        memory_mb=max((n.real_memory for n in own), default=0) or None,
        source=source,
    )
    out = []
    for job in side.queued_in(nodeset_partition(nodeset)):
        why = never_fits(job, ceiling) if counts(job) else None
        if why is not None:
            out.append((job.job_id, why))
    return out


def explain_nodeset(world: World, nodeset: JSON, events: list[JSON]) -> JSON:
    entry = status.nodeset_entry(world, nodeset)
    lines: list[str] = []
    hpa = entry["hpa"]
    lines.append(
        f"desired {entry['desired']} replicas, {len(entry['pods'])} pods, ready {entry['ready']}"
    )
    if hpa is None:
        lines.append("no HorizontalPodAutoscaler targets it: replicas change only by hand")
    else:
        lines.append(
            f"HPA {hpa['name']}: {hpa['minReplicas']}-{hpa['maxReplicas']}, current "
            f"{hpa['currentReplicas']}, desired {hpa['desiredReplicas']}"
        )
        for c in hpa["conditionsWaiting"]:
            lines.append(f"HPA {c['type']}={c['status']} ({c['reason']}): {c['message']}")
    for c in entry["conditionsWaiting"]:
        lines.append(f"{c['type']}={c['status']} ({c['reason']}): {c['message']}")
    never = jobs_never_fitting(world, nodeset) if entry["partition"] else []
    if entry["partition"]:
        lines.append(
            f"partition {entry['partition']}: {entry['queued']} jobs queued (what the "
            "slurm_nodeset_jobs_pending* metrics count"
            + (f", less {len(never)} it can never run" if never else "")
            + ")"
        )
    for job_id, why in never:
        lines.append(
            f"job {job_id} {why}: not counted as demand, it pends until changed or cancelled"
        )
    if not entry["partition"]:
        lines.append("spec.partition is not enabled: no queue of its own to scale from")
    warnings = [e for e in events if e.get("type") == "Warning"]
    if warnings:
        lines.append(
            "recent warnings: " + "; ".join(f"{e['reason']}: {e['note']}" for e in warnings[-3:])
        )
    return {
        "kind": "NodeSet",
        "namespace": entry["namespace"],
        "name": entry["name"],
        "nodeset": entry,
        "events": events,
        "why": lines,
    }


def text(data: JSON, style: Style = render.PLAIN) -> str:
    head = style(f"{data['kind']} {data['namespace']}/{data['name']}", "bold")
    return "\n".join([head, *(f"  {line}" for line in data["why"])])
