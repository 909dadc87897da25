"""What the plugin reads: the Kubernetes objects of a namespace (or all) and, per Cluster,
one list each of Slurm's nodes, jobs and partitions through the Cluster's own slurmrestd and
credentials (the Secret the Cluster names, read with the user's kubeconfig)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, cast

from slinky.api.schema import ParseError, parse
from slinky.api.v1alpha1.cluster import ClusterSpec
from slinky.background import Backoff
from slinky.bridge.placeholder import read_comment
from slinky.kube import rest
from slinky.operator.cluster.sync import ConfigProblem, Options, resolve_auth
from slinky.operator.nodeset.builder import LABEL_NODESET
from slinky.operator.resources import CLUSTERS, NODESETS
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.models import Job, Node, Partition, expand_hostlist
from slinky.types import JSON

SLURM_TIMEOUT_S = 10.0
RETRIES = 5  # of a list the apiserver answers 429 or 503
BRIDGE_JOBID_LABEL = "scheduler.slinky.slurm.net/slurm-jobid"
BRIDGE_SCHEDULER = "slurm-bridge-scheduler"  # the bridge's default schedulerName


@dataclass
class SlurmSide:
    """One Cluster's Slurm as read now (`error`: why it could not be read)."""

    cluster: str
    server: str
    nodes: dict[str, Node] = field(default_factory=dict)
    jobs: dict[int, Job] = field(default_factory=dict)
    partitions: dict[str, Partition] = field(default_factory=dict)
    error: str = ""
    unreachable: bool = False  # slurmrestd did not answer (the error says where)

    def jobs_on(self, node: str) -> list[Job]:
        """Jobs that hold `node` now (running, suspended or completing)."""
        return sorted(
            (
                j
                for j in self.jobs.values()
                if not j.is_pending
                and (not j.is_finished or "COMPLETING" in j.state)
                and node in expand_hostlist(j.nodes)
            ),
            key=lambda j: j.job_id,
        )

    def queued_in(self, partition: str) -> list[Job]:
        return sorted(
            (j for j in self.jobs.values() if j.is_pending and partition in j.partition.split(",")),
            key=lambda j: j.job_id,
        )


@dataclass
class World:
    namespace: str | None  # None: all namespaces
    clusters: list[JSON]
    nodesets: list[JSON]
    pods: list[JSON]  # NodeSet pods and bridge pods
    kube_nodes: dict[str, JSON]
    hpas: list[JSON]
    slurm: dict[str, SlurmSide]  # by Cluster key namespace/name
    now: float = field(default_factory=time.time)

    def nodeset_pods(self, nodeset: JSON) -> list[JSON]:
        ns, name = nodeset["metadata"]["namespace"], nodeset["metadata"]["name"]
        return sorted(
            (
                p
                for p in self.pods
                if p["metadata"]["namespace"] == ns
                and (p["metadata"].get("labels") or {}).get(LABEL_NODESET) == name
            ),
            key=lambda p: str(p["metadata"]["name"]),
        )

    def bridge_pods(self) -> list[JSON]:
        return sorted(
            (p for p in self.pods if is_bridge_pod(p)),
            key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]),
        )

    def slurm_of(self, nodeset: JSON) -> SlurmSide | None:
        cluster = (nodeset.get("spec") or {}).get("clusterName")
        return self.slurm.get(f"{nodeset['metadata']['namespace']}/{cluster}")

    def find_placeholder(self, job_id: int, pod: JSON) -> tuple[SlurmSide, Job] | None:
        """The pod's placeholder job in one of the Slurms read: job ids are unique within
        one Slurm only, so the job's admin_comment must name the pod (its UID, or its
        key when the bridge recorded no UID)."""
        meta = pod["metadata"]
        key, uid = f"{meta['namespace']}/{meta['name']}", str(meta.get("uid") or "")
        for side in self.slurm.values():
            job = side.jobs.get(job_id)
            if job is None:
                continue
            comment = read_comment(str(job.raw.get("admin_comment") or ""))
            if comment is not None and key in comment.pods and comment.pods[key] in ("", uid):
                return side, job
        return None


def is_bridge_pod(pod: JSON) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return BRIDGE_JOBID_LABEL in labels or "slurm-bridge" in str(
        (pod.get("spec") or {}).get("schedulerName") or ""
    )


class _Secrets:
    """The one lookup `resolve_auth` makes, answered from Secrets read here."""

    def __init__(self, found: dict[str, JSON]) -> None:
        self.found = found

    def get(self, key: str) -> JSON | None:
        return self.found.get(key)


async def read_slurm(kube: rest.Kube, cluster: JSON, *, server: str | None = None) -> SlurmSide:
    """Nodes, jobs and partitions of the Cluster's Slurm (one request each)."""
    ns, name = cluster["metadata"]["namespace"], cluster["metadata"]["name"]
    key = f"{ns}/{name}"
    try:
        spec = parse(ClusterSpec, cluster.get("spec"), "spec")
    except ParseError as e:
        return SlurmSide(key, "", error=f"invalid spec: {e}")
    side = SlurmSide(key, server or spec.server)
    secret_name = (
        spec.jwt_key_ref.name if spec.jwt_key_ref else (spec.token.secret_ref if spec.token else "")
    )
    found: dict[str, JSON] = {}
    try:
        found[f"{ns}/{secret_name}"] = await kube.get(rest.SECRETS, secret_name, ns)
    except rest.ApiError as e:
        side.error = f"cannot read Secret {ns}/{secret_name}: {e}"
        return side
    try:
        auth = resolve_auth(ns, spec, cast(Any, _Secrets(found)), Options())
    except ConfigProblem as e:
        side.error = e.message
        return side
    client = SlurmClient(side.server, auth.make_tokens(), timeout=SLURM_TIMEOUT_S, retries=1)
    try:
        # Every list ends before the client closes: one still running when another failed
        # would open a new session after the close, never closed.
        answers = await asyncio.gather(
            client.list_nodes(),
            client.list_jobs(),
            client.list_partitions(),
            return_exceptions=True,
        )
    finally:
        await client.close()
    for answer in answers:
        if isinstance(answer, errors.SlurmError):
            side.unreachable = isinstance(answer, errors.SlurmUnavailable)
            side.error = str(answer) if side.unreachable else f"slurmrestd {side.server}: {answer}"
            return side
        if isinstance(answer, BaseException):
            raise answer
    (nodes, _), (jobs, _), partitions = cast(Any, answers)
    side.nodes = {n.name: n for n in nodes or []}
    side.jobs = {j.job_id: j for j in jobs or []}
    side.partitions = {p.name: p for p in partitions}
    return side


async def gather(
    kube: rest.Kube, namespace: str | None, *, slurm_server: str | None = None
) -> World:
    """Everything the commands join, read once."""
    clusters, nodesets, slurmd_pods, placed, scheduled, nodes, hpas = await asyncio.gather(
        _items(kube, CLUSTERS, namespace),
        _items(kube, NODESETS, namespace),
        _items(kube, rest.PODS, namespace, labels=LABEL_NODESET),
        _items(kube, rest.PODS, namespace, labels=BRIDGE_JOBID_LABEL),
        _items(kube, rest.PODS, namespace, fields=f"spec.schedulerName={BRIDGE_SCHEDULER}"),
        _items(kube, rest.NODES, None, optional=True),
        _items(kube, rest.HPAS, namespace, optional=True),
    )
    by_uid = {str(p["metadata"]["uid"]): p for p in (*slurmd_pods, *placed, *scheduled)}
    if slurm_server and len(clusters) > 1:
        raise ValueError(
            f"--slurm-server: {len(clusters)} Clusters are read; name one (`status CLUSTER`, "
            "-n NAMESPACE) or leave the flag out"
        )
    sides = await asyncio.gather(*(read_slurm(kube, c, server=slurm_server) for c in clusters))
    return World(
        namespace=namespace,
        clusters=clusters,
        nodesets=nodesets,
        pods=list(by_uid.values()),
        kube_nodes={n["metadata"]["name"]: n for n in nodes},
        hpas=hpas,
        slurm={s.cluster: s for s in sides},
    )


async def _items(
    kube: rest.Kube,
    res: rest.Resource,
    namespace: str | None,
    *,
    labels: str | None = None,
    fields: str | None = None,
    optional: bool = False,
) -> list[JSON]:
    """One list (by selector where one fits); `optional`: not allowed or not served is
    nothing, not an error."""
    params = {k: v for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v}
    backoff = Backoff(0.5, 4.0)
    for attempt in range(RETRIES):
        try:
            data = await kube.list(res, namespace, params=params or None)
            return list(data.get("items") or [])
        except rest.ApiError as e:
            if e.not_found or (optional and e.code in (401, 403)):
                return []
            # Busy or starting (a CRD just made: "storage is (re)initializing"): as kubectl
            # does, ask again a few times.
            if e.code not in (429, 503) or attempt == RETRIES - 1:
                raise
        await asyncio.sleep(backoff.next())
    return []
