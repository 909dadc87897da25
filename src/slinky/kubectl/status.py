"""`kubectl slinky status [CLUSTER|NODESET]`: every NodeSet with its pods joined to their
Kubernetes nodes, their Slurm nodes and the jobs running there; the conditions that say why
something waits; the bridge's pods with their placeholder jobs."""

from __future__ import annotations

from urllib.parse import urlsplit

from slinky.kubectl import render
from slinky.kubectl.render import Style
from slinky.kubectl.world import BRIDGE_JOBID_LABEL, SlurmSide, World
from slinky.operator.autoscale.metrics import nodeset_partition
from slinky.operator.nodeset import pods as podfacts
from slinky.operator.nodeset.builder import (
    ANNOTATION_CONDEMNED_AT,
    ANNOTATION_DRAIN_DEADLINE,
    LABEL_PROTECT,
)
from slinky.operator.nodeset.view import belongs_to
from slinky.slurm.models import Job, Node
from slinky.types import JSON

UNLIMITED_AFTER_S = 10 * 365 * 86400  # an end time this far away: no time limit
BRIDGE_NODE_ANNOTATION = "slinky.slurm.net/slurm-node"


class NotFound(Exception):
    """No Cluster or NodeSet of that name."""


def job_entry(job: Job, now: float) -> JSON:
    """A job as status and plan show it: who, what, and when it ends at the latest."""
    end = job.end_time
    limited = bool(end) and end is not None and end - now < UNLIMITED_AFTER_S
    return {
        "id": job.job_id,
        "name": job.name,
        "user": job.user_name,
        "state": "+".join(job.state),
        "partition": job.partition,
        "endsAt": end if limited else None,
        "secondsLeft": max(0, int(end - now)) if limited and end is not None else None,
    }


def conditions_waiting(obj: JSON) -> list[JSON]:
    """The object's conditions that are not True: each says what waits and why."""
    return [
        {k: c.get(k, "") for k in ("type", "status", "reason", "message")}
        for c in (obj.get("status") or {}).get("conditions") or []
        if c.get("status") != "True"
    ]


# The HPA conditions that mean it cannot do its work (the others are its normal states).
HPA_PROBLEMS = {("AbleToScale", "False"), ("ScalingActive", "False"), ("ScalingLimited", "True")}


def conditions_true(obj: JSON) -> list[JSON]:
    return [
        {k: c.get(k, "") for k in ("type", "status", "reason", "message")}
        for c in (obj.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    ]


def condition(obj: JSON, type_: str) -> JSON | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def pod_entry(pod: JSON, side: SlurmSide | None, now: float) -> JSON:
    meta = pod["metadata"]
    name = str(meta["name"])
    node: Node | None = side.nodes.get(name) if side else None
    if node is not None and not belongs_to(node, meta["namespace"], name):
        node = None  # a Slurm node of that name, but another pod's
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    known = side is not None and not side.error
    return {
        "name": name,
        "phase": "Terminating" if meta.get("deletionTimestamp") else podfacts.phase(pod),
        "ready": f"{sum(1 for s in statuses if s.get('ready'))}/{len(statuses) or 1}",
        "kubeNode": podfacts.node_name(pod),
        "slurmState": str(node.state) if node else None,
        "slurmReason": (node.reason or None) if node else None,
        # Slurm not read: no node and no jobs say nothing (null slurmState is not "gone").
        "slurmUnknown": None if known else unknown_why(side),
        "condemned": podfacts.condemned(pod),
        # Since when, and when its node's jobs end at the latest (the operator's record).
        "condemnedAt": podfacts.annotation(pod, ANNOTATION_CONDEMNED_AT),
        "drainDeadline": podfacts.annotation(pod, ANNOTATION_DRAIN_DEADLINE),
        "busyProtected": (meta.get("labels") or {}).get(LABEL_PROTECT) == "true",
        "jobs": [job_entry(j, now) for j in side.jobs_on(name)] if side and node else [],
    }


def unknown_why(side: SlurmSide | None) -> str:
    if side is None:
        return "no Cluster"
    return "Slurm unreachable" if side.unreachable else "Slurm not read"


def hpa_for(world: World, nodeset: JSON) -> JSON | None:
    meta = nodeset["metadata"]
    for hpa in world.hpas:
        ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
        if (
            hpa["metadata"]["namespace"] == meta["namespace"]
            and ref.get("kind") == "NodeSet"
            and ref.get("name") == meta["name"]
        ):
            spec, status = hpa.get("spec") or {}, hpa.get("status") or {}
            return {
                "name": hpa["metadata"]["name"],
                "minReplicas": spec.get("minReplicas", 1),
                "maxReplicas": spec.get("maxReplicas"),
                "currentReplicas": status.get("currentReplicas", 0),
                "desiredReplicas": status.get("desiredReplicas", 0),
                "conditionsWaiting": [
                    c
                    for c in conditions_waiting(hpa) + conditions_true(hpa)
                    if (c["type"], c["status"]) in HPA_PROBLEMS
                ],
            }
    return None


def nodeset_entry(world: World, nodeset: JSON) -> JSON:
    meta, spec = nodeset["metadata"], nodeset.get("spec") or {}
    side = world.slurm_of(nodeset)
    members = [pod_entry(p, side, world.now) for p in world.nodeset_pods(nodeset)]
    states = [m["slurmState"] or "" for m in members]
    partition = (spec.get("partition") or {}).get("enabled")
    return {
        "namespace": meta["namespace"],
        "name": meta["name"],
        "cluster": spec.get("clusterName"),
        "partition": nodeset_partition(nodeset) if partition else None,
        "desired": spec.get("replicas", 1),
        "ready": sum(1 for p in world.nodeset_pods(nodeset) if podfacts.is_ready(p)),
        "idle": sum(1 for s in states if s.startswith("IDLE") and "DRAIN" not in s),
        "allocated": sum(1 for s in states if s.startswith(("ALLOCATED", "MIXED"))),
        "draining": sum(1 for m in members if m["condemned"] or "DRAIN" in (m["slurmState"] or "")),
        "down": sum(1 for s in states if "DOWN" in s or "NOT_RESPONDING" in s),
        "queued": len(side.queued_in(nodeset_partition(nodeset))) if side and partition else 0,
        "slurmKnown": side is not None and not side.error,
        "conditionsWaiting": conditions_waiting(nodeset),
        "hpa": hpa_for(world, nodeset),
        "pods": members,
    }


def bridge_entry(world: World, pod: JSON) -> JSON:
    meta = pod["metadata"]
    label = (meta.get("labels") or {}).get(BRIDGE_JOBID_LABEL)
    job_id = int(label) if label and label.isdigit() else None
    found = world.find_placeholder(job_id, pod) if job_id is not None else None
    job = found[1] if found else None
    scheduled = condition(pod, "PodScheduled")
    return {
        "namespace": meta["namespace"],
        "name": meta["name"],
        "phase": "Terminating" if meta.get("deletionTimestamp") else podfacts.phase(pod),
        "kubeNode": podfacts.node_name(pod),
        "jobId": job_id,
        "jobState": "+".join(job.state) if job else (_missing(world) if job_id else None),
        "jobNodes": job.nodes if job else None,
        "jobReason": job.state_reason if job and job.state_reason not in ("", "None") else None,
        "unscheduledReason": (
            f"{scheduled.get('reason')}: {scheduled.get('message')}"
            if scheduled and scheduled.get("status") == "False"
            else None
        ),
    }


def _missing(world: World) -> str:
    """A placeholder job not in any Slurm read: unknown while one could not be read."""
    return "unknown" if any(s.error for s in world.slurm.values()) else "not found in Slurm"


def cluster_entry(world: World, cluster: JSON) -> JSON:
    meta = cluster["metadata"]
    side = world.slurm.get(f"{meta['namespace']}/{meta['name']}")
    ready = condition(cluster, "Ready") or {}
    return {
        "namespace": meta["namespace"],
        "name": meta["name"],
        "ready": ready.get("status", "Unknown"),
        "reason": ready.get("reason", ""),
        "message": ready.get("message", ""),
        "server": side.server if side else None,
        "slurmError": (side.error or None) if side else None,
        "slurmUnreachable": bool(side and side.unreachable),
        "slurmNodes": len(side.nodes) if side else None,
        "slurmJobs": sum(1 for j in side.jobs.values() if not j.is_finished) if side else None,
    }


def build(world: World, target: str | None = None) -> JSON:
    """The status as data (what `-o json` prints); `target` a Cluster or NodeSet name."""
    clusters, nodesets = world.clusters, world.nodesets
    bridge = world.bridge_pods()
    if target:
        by_cluster = [c for c in clusters if c["metadata"]["name"] == target]
        by_nodeset = [n for n in nodesets if n["metadata"]["name"] == target]
        if by_cluster:
            keys = {(c["metadata"]["namespace"], target) for c in by_cluster}
            nodesets = [
                n
                for n in nodesets
                if (n["metadata"]["namespace"], (n.get("spec") or {}).get("clusterName")) in keys
            ]
            clusters = by_cluster
        elif by_nodeset:
            nodesets = by_nodeset
            names = {
                (n["metadata"]["namespace"], (n.get("spec") or {}).get("clusterName"))
                for n in by_nodeset
            }
            clusters = [
                c for c in clusters if (c["metadata"]["namespace"], c["metadata"]["name"]) in names
            ]
            bridge = []
        else:
            where = f"namespace {world.namespace}" if world.namespace else "any namespace"
            raise NotFound(f"no Cluster or NodeSet named {target!r} in {where}")
    return {
        "clusters": [cluster_entry(world, c) for c in clusters],
        "nodesets": [nodeset_entry(world, n) for n in nodesets],
        "bridgePods": [bridge_entry(world, p) for p in bridge],
    }


def jobs_text(jobs: list[JSON]) -> str:
    if not jobs:
        return "-"
    parts = []
    for j in jobs:
        left = j["secondsLeft"]
        when = "no time limit" if left is None else f"ends in {render.duration(left)} at the latest"
        parts.append(f"{j['id']} {j['user']} {j['name']} ({when})")
    return "; ".join(parts)


def text(data: JSON, style: Style = render.PLAIN) -> str:
    out: list[str] = []
    for c in data["clusters"]:
        ready = c["ready"] == "True"
        head = style(f"Cluster {c['namespace']}/{c['name']}", "bold")
        flag = style("Ready", "green") if ready else style(f"Not ready ({c['reason']})", "red")
        line = f"{head}: {flag}"
        if c["server"]:
            line += f"; slurmrestd {c['server']}"
        if c["slurmNodes"] is not None and not c["slurmError"]:
            line += f"; {c['slurmNodes']} Slurm nodes, {c['slurmJobs']} live jobs"
        out.append(line)
        if not ready and c["message"]:
            out.append(f"  {c['message']}")
        if c["slurmError"]:
            out.append(style(f"  cannot read Slurm: {c['slurmError']}", "red"))
    for n in data["nodesets"]:
        out.append("")
        known = n.get("slurmKnown", True)
        queued = f", {n['queued']} queued" if known else ""
        part = f" (partition {n['partition']}{queued})" if n["partition"] else ""
        counts = (
            f"idle {n['idle']}, allocated {n['allocated']}, draining {n['draining']}, "
            f"down {n['down']}"
            if known
            else "idle, allocated, draining, down: unknown (Slurm not read)"
        )
        out.append(
            f"{style('NodeSet ' + n['namespace'] + '/' + n['name'], 'bold')}{part}: "
            f"desired {n['desired']}, ready {n['ready']}, {counts}"
        )
        if hpa := n["hpa"]:
            out.append(
                f"  HPA {hpa['name']}: {hpa['minReplicas']}-{hpa['maxReplicas']} replicas, "
                f"current {hpa['currentReplicas']}, desired {hpa['desiredReplicas']}"
            )
            for c in hpa["conditionsWaiting"]:
                out.append(
                    style(
                        f"  ! HPA {c['type']}={c['status']} {c['reason']}: {c['message']}", "yellow"
                    )
                )
        for c in n["conditionsWaiting"]:
            out.append(
                style(f"  ! {c['type']}={c['status']} {c['reason']}: {c['message']}", "yellow")
            )
        rows = [
            [
                p["name"],
                p["ready"],
                render.coloured_state(style, p["phase"]),
                p["kubeNode"] or "-",
                render.coloured_state(style, slurm_state_text(p)),
                " ".join(
                    filter(
                        None, [p["condemned"] and f"condemned: {p['condemned']}", p["slurmReason"]]
                    )
                )
                or "-",
                "unknown" if p["slurmUnknown"] else jobs_text(p["jobs"]),
            ]
            for p in n["pods"]
        ]
        if rows:
            headers = ["POD", "READY", "PHASE", "NODE", "SLURM STATE", "WHY", "JOBS"]
            out.extend(render.table(headers, rows, indent="  "))
        else:
            out.append("  no pods")
    live = [b for b in data["bridgePods"] if b["phase"] not in ("Succeeded", "Failed")]
    ended = len(data["bridgePods"]) - len(live)
    if data["bridgePods"]:
        out.append("")
        more = f" ({ended} more ended: Succeeded or Failed, listed by -o json)" if ended else ""
        out.append(style("Bridge pods", "bold") + more)
    if live:
        rows = [
            [
                f"{b['namespace']}/{b['name']}",
                render.coloured_state(style, b["phase"]),
                b["kubeNode"] or "-",
                str(b["jobId"] or "-"),
                render.coloured_state(style, b["jobState"] or "-"),
                b["jobReason"] or b["unscheduledReason"] or "-",
            ]
            for b in live
        ]
        out.extend(
            render.table(["POD", "PHASE", "NODE", "JOB", "JOB STATE", "WHY"], rows, indent="  ")
        )
    hints = _hints(data)
    if hints:
        out.append("")
        out.extend(style(h, "dim") for h in hints)
    return "\n".join(out)


def slurm_state_text(pod: JSON) -> str:
    """A pod's Slurm node as the tables show it: its state, "not registered" only when
    Slurm was read and has no node of the pod, else why it is unknown."""
    if pod["slurmState"]:
        return str(pod["slurmState"])
    unknown = pod.get("slurmUnknown")
    return f"unknown: {unknown}" if unknown else "not registered"


def forward_hint(cluster: JSON) -> str:
    """How to reach a Cluster's slurmrestd that did not answer: its address may be one only
    pods reach (a Service's name), so forward it and say where with --slurm-server."""
    server = str(cluster["server"] or "")
    where = f"Slurm of Cluster {cluster['namespace']}/{cluster['name']} not read"
    url = urlsplit(server)
    host, port = url.hostname or "", url.port or 6820
    if not host or host == "localhost" or host.replace(".", "").isdigit() or ":" in host:
        return f"{where}: is slurmrestd up at {server}? Another address: --slurm-server=URL"
    svc, _, rest = host.partition(".")
    ns = rest.split(".")[0] if rest else cluster["namespace"]
    return (
        f"{where}: where {server} is reachable only inside the cluster, forward it "
        f"(kubectl -n {ns} port-forward svc/{svc} {port}) and pass "
        f"--slurm-server=http://127.0.0.1:{port}"
    )


def _hints(data: JSON) -> list[str]:
    """What to run next, as `kubectl cnpg status` says."""
    hints = [forward_hint(c) for c in data["clusters"] if c.get("slurmUnreachable")]
    for n in data["nodesets"]:
        for p in n["pods"]:
            if p["condemned"] or p["phase"] == "Terminating":
                hints.append(
                    f"why is {p['name']} still there: "
                    f"kubectl slinky why {p['name']} -n {n['namespace']}"
                )
                break
    for b in data["bridgePods"]:
        if b["phase"] == "Pending":
            hints.append(
                f"why is {b['name']} Pending: kubectl slinky why {b['name']} -n {b['namespace']}"
            )
            break
    return hints
