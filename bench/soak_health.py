"""What "recovered" and "not stuck" mean for the chaos soak, each as a check that reads
Kubernetes and Slurm and returns what is still wrong (an empty list: all is well).

A chaos action has recovered when the checks its table entry names pass; at the end of the
soak the same checks, plus the ones about leftovers (pods Terminating for long, finalizers
left on finished pods, Slurm nodes without a pod), decide whether anything is stuck."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from datetime import datetime
from typing import Any

import httpx2

from bench.soak_bed import BRIDGE_NAMESPACE, NAMESPACE, NODESETS
from bench.soak_state import Soak
from slinky.bridge import labels as bridge_labels
from slinky.kube import rest
from slinky.operator.resources import CLUSTERS
from slinky.operator.resources import NODESETS as NODESET_RESOURCE
from slinky.slurm import errors as slurm_errors
from slinky.slurm.models import Node

JSON = dict[str, Any]
OPERATOR_LEASE = ("default", "slurm-operator.slinky.slurm.net")
BRIDGE_LEASES = tuple(
    ("slinky-system", f"slurm-bridge-{c}") for c in ("nodes", "scheduler", "workload")
)
LEASE_FRESH_S = 20.0
TERMINATING_TOO_LONG_S = 120.0
OPERATOR_DRAIN = "slurm-operator: "
BRIDGE_DRAIN = bridge_labels.REASON_PREFIX
# Errors that mean "cannot tell right now" (a component is down): the check says so.
UNREACHABLE = (rest.ApiError, httpx2.HTTPError, slurm_errors.SlurmError, OSError)


def parse_time(text: str) -> float:
    """A Kubernetes timestamp (RFC 3339, with or without microseconds) as epoch seconds."""
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


async def leases_problems(
    soak: Soak, leases: tuple[tuple[str, str], ...], *, since: float = 0.0
) -> list[str]:
    """Each Lease held and renewed within the last LEASE_FRESH_S seconds (and, with
    `since`, acquired after that time: by the process started since)."""
    out = []
    for ns, name in leases:
        lease = await soak.kube.get(rest.LEASES, name, ns)
        spec = lease.get("spec") or {}
        renewed = spec.get("renewTime")
        acquired = spec.get("acquireTime")
        if not spec.get("holderIdentity") or not renewed:
            out.append(f"Lease {ns}/{name} not held")
        elif time.time() - parse_time(renewed) > LEASE_FRESH_S:
            out.append(f"Lease {ns}/{name} not renewed since {renewed}")
        elif since and (not acquired or parse_time(acquired) < since):
            out.append(
                f"Lease {ns}/{name} still held by {spec['holderIdentity']} (before the restart)"
            )
    return out


async def operator_problems(soak: Soak, *, since: float = 0.0) -> list[str]:
    """The operator answers /readyz and /healthz, holds its Lease (taken after `since`),
    and its Cluster is Ready."""
    out = []
    base = f"http://127.0.0.1:{soak.ports.operator_health}"
    for path in ("/readyz", "/healthz"):
        if not await asyncio.to_thread(http_ok, base + path):
            out.append(f"operator {path} fails")
    out += await leases_problems(soak, (OPERATOR_LEASE,), since=since)
    cluster = await soak.kube.get(CLUSTERS, "slurm", NAMESPACE)
    ready = next(
        (c for c in (cluster.get("status") or {}).get("conditions") or [] if c["type"] == "Ready"),
        None,
    )
    if not ready or ready.get("status") != "True":
        out.append(f"Cluster slurm not Ready: {(ready or {}).get('reason')}")
    return out


async def bridge_problems(soak: Soak, *, since: float = 0.0) -> list[str]:
    """The bridge answers /readyz and /healthz and holds its three Leases (taken after
    `since`)."""
    out = []
    base = f"http://127.0.0.1:{soak.ports.bridge_health}"
    for path in ("/readyz", "/healthz"):
        if not await asyncio.to_thread(http_ok, base + path):
            out.append(f"bridge {path} fails")
    return out + await leases_problems(soak, BRIDGE_LEASES, since=since)


async def slurm_problems(soak: Soak) -> list[str]:
    """slurmctld answers through slurmrestd."""
    ping = await soak.slurm.ping()
    return [] if ping.responding else [f"slurmctld does not respond to ping: {ping}"]


async def nodeset_problems(soak: Soak, name: str) -> list[str]:
    """The NodeSet did what its spec says: status observed the current generation, as many
    pods as replicas, all Ready and of the update revision."""
    obj = await soak.kube.get(NODESET_RESOURCE, name, NAMESPACE)
    want = int(obj["spec"].get("replicas") or 0)
    st = obj.get("status") or {}
    out = []
    if st.get("observedGeneration") != obj["metadata"].get("generation"):
        out.append(f"NodeSet {name}: generation {obj['metadata'].get('generation')} not observed")
    for key in ("replicas", "readyReplicas", "updatedReplicas"):
        if int(st.get(key) or 0) != want:
            out.append(f"NodeSet {name}: {key} {st.get(key) or 0} of {want}")
    if want and st.get("currentRevision") != st.get("updateRevision"):
        out.append(f"NodeSet {name}: revision {st.get('currentRevision')} not yet updated")
    return out


async def slurmd_pods(soak: Soak) -> list[JSON]:
    return list((await soak.kube.list(rest.PODS, NAMESPACE))["items"])


def ready(pod: JSON) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


async def slurm_nodes(soak: Soak) -> dict[str, Node]:
    nodes, _ = await soak.slurm.list_nodes()
    return {n.name: n for n in nodes or []}


async def cordoned_nodes(soak: Soak) -> set[str]:
    nodes = (await soak.kube.list(rest.NODES))["items"]
    return {n["metadata"]["name"] for n in nodes if (n.get("spec") or {}).get("unschedulable")}


async def slurmd_problems(soak: Soak) -> list[str]:
    """Slurm and the slurmd pods agree: each Ready pod is a Slurm node that responds and
    that nobody of ours drained (unless its Kubernetes node is cordoned), each NodeSet's
    partition exists, and no Slurm node of a NodeSet outlives its pod."""
    pods = [p for p in await slurmd_pods(soak) if not p["metadata"].get("deletionTimestamp")]
    nodes = await slurm_nodes(soak)
    cordoned = await cordoned_nodes(soak)
    out = []
    for pod in pods:
        name = pod["metadata"]["name"]
        if not ready(pod):
            continue
        node = nodes.get(name)
        if node is None:
            out.append(f"pod {NAMESPACE}/{name} is Ready but Slurm has no node {name}")
        elif node.state.is_down or node.state.has("NOT_RESPONDING"):
            out.append(f"pod {NAMESPACE}/{name} is Ready but Slurm node {name} is {node.state}")
        elif (
            node.state.is_drain
            and node.reason.startswith(OPERATOR_DRAIN)
            and (pod.get("spec") or {}).get("nodeName") not in cordoned
        ):
            out.append(f"Slurm node {name} drained ({node.reason!r}) though its pod is Ready")
    live = {p["metadata"]["name"] for p in pods}
    for name, node in nodes.items():
        if name.rsplit("-", 1)[0] in NODESETS and name not in live:
            out.append(f"Slurm node {name} ({node.state}) has no pod")
    partitions = {p.name for p in await soak.slurm.list_partitions()}
    out += [f"partition {n} missing in Slurm" for n in NODESETS if n not in partitions]
    return out


async def bridge_nodes_problems(soak: Soak) -> list[str]:
    """No Slurm node the bridge drained for a cordon stays drained once uncordoned."""
    nodes = await slurm_nodes(soak)
    cordoned = await cordoned_nodes(soak)
    return [
        f"Slurm node {n.name} still drained by the bridge ({n.reason!r}) though uncordoned"
        for n in nodes.values()
        if n.state.is_drain and n.reason.startswith(BRIDGE_DRAIN) and n.name not in cordoned
    ]


async def leftovers(soak: Soak) -> list[str]:
    """Objects that should have gone: pods Terminating for long, finished bridge pods still
    holding the bridge's finalizer, cordoned nodes."""
    out = []
    now = time.time()
    for ns in (NAMESPACE, BRIDGE_NAMESPACE):
        for pod in (await soak.kube.list(rest.PODS, ns))["items"]:
            meta = pod["metadata"]
            key = f"{ns}/{meta['name']}"
            deleted = meta.get("deletionTimestamp")
            if deleted and now - parse_time(deleted) > TERMINATING_TOO_LONG_S:
                out.append(
                    f"pod {key} Terminating since {deleted} (finalizers {meta.get('finalizers')})"
                )
            phase = (pod.get("status") or {}).get("phase")
            if phase in ("Succeeded", "Failed") and bridge_labels.FINALIZER in (
                meta.get("finalizers") or []
            ):
                out.append(f"pod {key} is {phase} and still holds {bridge_labels.FINALIZER}")
    out += [f"node {n} is still cordoned" for n in sorted(await cordoned_nodes(soak))]
    return out


async def all_problems(soak: Soak) -> list[str]:
    """Everything that should hold once the soak settled."""
    out: list[str] = []
    checks = [
        slurm_problems(soak),
        operator_problems(soak),
        bridge_problems(soak),
        *(nodeset_problems(soak, n) for n in NODESETS),
        slurmd_problems(soak),
        bridge_nodes_problems(soak),
        leftovers(soak),
    ]
    for check in checks:
        try:
            out += await check
        except UNREACHABLE as e:
            out.append(f"cannot check: {type(e).__name__}: {e}")
    return out
