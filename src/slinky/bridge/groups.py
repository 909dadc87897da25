"""Which pods Slurm must start together: a pod's *group*, found through its labels and its
controller owners, and the one placeholder job that stands for a whole group.

Kubernetes says "these N pods are one workload" in several ways; Slurm says it with one job
of N nodes (`minimum_nodes = maximum_nodes = N`, one task per node), which Slurm allocates
all at once or not at all. A pod's group is, in this order:

- a scheduler-plugins PodGroup (`scheduling.x-k8s.io/v1alpha1`): the pod's label
  `scheduling.x-k8s.io/pod-group` names it, `spec.minMember` is N;
- a Kubernetes 1.36 PodGroup (`scheduling.k8s.io/v1alpha2`, feature gate GenericWorkload):
  the pod's `spec.schedulingGroup.podGroupName` names it; a `gang` scheduling policy's
  `minCount` is N (a `basic` policy schedules pods one by one);
- up the chain of controller `ownerReferences`:
  - a LeaderWorkerSet: one group per replica (the pods sharing the label
    `leaderworkerset.sigs.k8s.io/group-key`, as LeaderWorkerSet v0.8 names it),
    N = `spec.leaderWorkerTemplate.size`. Its `startupPolicy` must be `LeaderCreated` (the
    default) and it must not ask for exclusive topology: either way the workers are made only
    once the leader runs or is bound, which a gang's leader never is alone;
  - a JobSet annotated `slurmjob.slinky.slurm.net/gang: "true"`: one group per replicated
    job (per restart attempt), N = replicas x parallelism;
  - a batch/v1 Job annotated `slurmjob.slinky.slurm.net/gang: "true"`: one group, N =
    parallelism;
  - a Job or JobSet without the annotation, a bare pod, any other owner: no group, one
    job per pod (as upstream).

An owner the bridge may not read (no RBAC, or already gone) ends the walk where it is, as if
the chain stopped there: it is skipped, never a failure. Owners are read one by one (`GET`,
never a list) and cached for `ttl` seconds (checked against the owner reference's UID), so
the pods of a group after the first cost no request.

The group's `slurmjob.slinky.slurm.net/*` annotations are read from its root object (the
PodGroup, LeaderWorkerSet, JobSet or Job), as upstream does, over the pods' own.

A gang Job must run all its pods at once: `completions` equal to `parallelism` (a Job that
starts pods as others finish would wait for ever for a whole group again).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from dataclasses import dataclass
from typing import Any

from slinky.bridge import placeholder
from slinky.bridge.config import BridgeConfig
from slinky.bridge.labels import SLURMJOB_PREFIX
from slinky.kube import rest
from slinky.types import JSON

log = logging.getLogger(__name__)


# Annotation on a batch/v1 Job or a JobSet: its pods are one gang (a replicated job's pods,
# for a JobSet) and get one Slurm job.
GANG = SLURMJOB_PREFIX + "gang"
PODGROUP_LABEL = "scheduling.x-k8s.io/pod-group"
LWS_HASH = "leaderworkerset.sigs.k8s.io/group-key"
LWS_GROUP_INDEX = "leaderworkerset.sigs.k8s.io/group-index"
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_EXCLUSIVE = "leaderworkerset.sigs.k8s.io/exclusive-topology"
JOBSET_RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
JOBSET_RESTARTS = "jobset.sigs.k8s.io/restart-attempt"
JOBSET_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"

X_PODGROUPS = rest.Resource("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup")
PODGROUPS = rest.Resource("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup")
# The owners a pod's chain may go through, by (API group, kind).
OWNERS: dict[tuple[str, str], rest.Resource] = {
    ("batch", "Job"): rest.Resource("batch", "v1", "jobs", "Job"),
    ("jobset.x-k8s.io", "JobSet"): rest.Resource(
        "jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet"
    ),
    ("leaderworkerset.x-k8s.io", "LeaderWorkerSet"): rest.Resource(
        "leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet"
    ),
    ("apps", "StatefulSet"): rest.Resource("apps", "v1", "statefulsets", "StatefulSet"),
    ("", "Pod"): rest.PODS,  # an LWS worker's StatefulSet is owned by its leader pod
}
MAX_DEPTH = 6
NOT_FOUND_TTL_S = 2.0


class GroupProblem(ValueError):
    """The pod's group cannot be used as it is; `reason` is a CamelCase condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Group:
    """Pods that Slurm starts together as one job of `size` nodes."""

    key: str  # unique among live groups, e.g. "PodGroup/ns/name"
    kind: str
    size: int
    root: JSON  # the object whose slurmjob annotations describe the job
    name: str  # the Slurm job name unless the root's annotation gives one

    def describe(self) -> str:
        meta = self.root.get("metadata") or {}
        return f"{self.kind} {meta.get('namespace')}/{meta.get('name')}"


# ---------------------------------------------------------------- pure parts


def _meta(obj: JSON) -> JSON:
    return obj.get("metadata") or {}


def _labels(obj: JSON) -> dict[str, str]:
    return dict(_meta(obj).get("labels") or {})


def controller_ref(obj: JSON) -> JSON | None:
    for ref in _meta(obj).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def api_group(api_version: str) -> str:
    return api_version.rpartition("/")[0]


def wants_gang(obj: JSON) -> bool:
    """The gang annotation says "true" (anything but "true"/"false" is an error)."""
    value = (_meta(obj).get("annotations") or {}).get(GANG)
    if value is None or value == "false":
        return False
    if value == "true":
        return True
    raise GroupProblem(
        "InvalidAnnotation",
        f'{obj.get("kind")} {_meta(obj).get("name")}: annotation {GANG} must be "true" or '
        f'"false", got {value!r}',
    )


def _count(obj: JSON, path: str, value: Any, *, default: int | None = None) -> int:
    if value is None and default is not None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise GroupProblem(
            "InvalidGroup",
            f"{obj.get('kind')} {_meta(obj).get('name')}: {path} must be a whole number of at "
            f"least 1 for a gang, got {value!r}",
        )
    return value


def job_gang_size(job_spec: JSON, owner: JSON, path: str) -> int:
    """N of a gang Job (or a JobSet's job template): parallelism, all started at once."""
    parallelism = _count(owner, f"{path}.parallelism", job_spec.get("parallelism"), default=1)
    completions = job_spec.get("completions")
    if completions is not None and completions != parallelism:
        raise GroupProblem(
            "InvalidGroup",
            f"{owner.get('kind')} {_meta(owner).get('name')}: a gang runs all its pods at once: "
            f"{path}.completions ({completions}) must equal {path}.parallelism ({parallelism})",
        )
    return parallelism


def _index(pod: JSON, label: str) -> int:
    text = _labels(pod).get(label) or (_meta(pod).get("annotations") or {}).get(label)
    return int(text) if text is not None and str(text).isdigit() else -1


def rank(pod: JSON) -> tuple[int, int, int, str]:
    """A pod's place in its group (JobSet job index, completion index, LWS worker index,
    then name): pod i gets the i-th node of the job's node list, as Slurm numbers ranks."""
    return (
        _index(pod, JOBSET_JOB_INDEX),
        _index(pod, JOB_COMPLETION_INDEX),
        _index(pod, LWS_WORKER_INDEX),
        str(_meta(pod).get("name")),
    )


def with_root_annotations(pod: JSON, root: JSON) -> JSON:
    """The pod, its slurmjob annotations overridden by the group root's."""
    annotations = dict(_meta(pod).get("annotations") or {})
    for k, v in (_meta(root).get("annotations") or {}).items():
        if k.startswith(SLURMJOB_PREFIX) and k != GANG:
            annotations[k] = v
    return {**pod, "metadata": {**_meta(pod), "annotations": annotations}}


# What the tenancy policy decides of a job: every pod of a group must agree on it.
IDENTITY_FIELDS = ("user_id", "group_id", "account", "qos", "partition", "reservation", "priority")


def allocation_user(pods: list[JSON], group: Group, config: BridgeConfig) -> str | None:
    """Whom to ask an immediate allocation of the group's job as (see
    `placeholder.allocation_user`): the job is described as its first pod in rank order."""
    first = min(pods, key=rank)
    return placeholder.allocation_user(with_root_annotations(first, group.root), config)


def job_description(pods: list[JSON], group: Group, config: BridgeConfig) -> JSON:
    """The `job_desc_msg` of one placeholder job for the whole group: each pod described as
    on its own (root annotations first), then one node per pod, each node big enough for
    the largest pod, and the admin_comment naming every pod in rank order."""
    ordered = sorted(pods, key=rank)
    described = [
        placeholder.job_description(with_root_annotations(p, group.root), config) for p in ordered
    ]
    identities = {tuple(str(d.get(f, "")) for f in IDENTITY_FIELDS) for d in described}
    if len(identities) > 1:
        raise placeholder.PlaceholderProblem(
            "PolicyDenied",
            f"{group.describe()}: its pods would run as different Slurm users, groups or "
            f"accounts ({', '.join(IDENTITY_FIELDS)} differ, e.g. by user-id annotations): "
            "one job cannot; give every pod of the group the same identity annotations",
        )
    job = dict(described[0])
    n = len(ordered)
    root_annotations = _meta(group.root).get("annotations") or {}
    job["name"] = str(root_annotations.get(SLURMJOB_PREFIX + "job-name") or group.name)
    job["admin_comment"] = placeholder.admin_comment(ordered, config)
    job.update(minimum_nodes=n, maximum_nodes=n, tasks=n, tasks_per_node=1)
    job["cpus_per_task"] = max(int(d["cpus_per_task"]) for d in described)
    job["memory_per_node"] = {
        "set": True,
        "number": max(int(d["memory_per_node"]["number"]) for d in described),
    }
    gpus = [d["tres_per_node"] for d in described if "tres_per_node" in d]
    if gpus:
        job["tres_per_node"] = max(gpus, key=lambda t: (len(t), t))
    deadline = (group.root.get("spec") or {}).get("activeDeadlineSeconds")
    if "time_limit" not in job and group.kind == "Job" and deadline:
        job["time_limit"] = {"set": True, "number": max(1, -(-int(deadline) // 60))}
    return job


# ---------------------------------------------------------------- resolution

_SAFE = re.compile(r"[^A-Za-z0-9._/-]")


class GroupResolver:
    """Finds a pod's group, reading its owners through the apiserver with a cache."""

    def __init__(self, kube: rest.Kube, *, ttl: float = 30.0) -> None:
        self.kube = kube
        self.ttl = ttl
        self._cache: dict[tuple[str, str, str], tuple[float, JSON | None]] = {}
        # Reads on their way: the pods of a group come together, and each would read the
        # same owner (a group of 8: 8 GETs of one PodGroup) before the first answer is in.
        # Each answers (answered, object); not answered: the read failed, read again.
        self._reading: dict[tuple[str, str, str], asyncio.Future[tuple[bool, JSON | None]]] = {}
        self.reads = 0

    async def read(self, res: rest.Resource, ns: str, name: str, uid: str = "") -> JSON | None:
        """The object, or None when it does not exist or the bridge may not read it."""
        key = (res.path(), ns, name)
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and now - cached[0] < self.ttl:
            obj = cached[1]
            if obj is None or not uid or _meta(obj).get("uid") == uid:
                return obj
        reading = self._reading.get(key)
        answered, obj = await asyncio.shield(reading) if reading is not None else (False, None)
        if not answered:  # no read on its way, or it failed: this one reads
            future: asyncio.Future[tuple[bool, JSON | None]] = (
                asyncio.get_running_loop().create_future()
            )
            self._reading[key] = future
            try:
                obj = await self._fetch(res, ns, name, key, now)
                future.set_result((True, obj))
            finally:
                if self._reading.get(key) is future:
                    del self._reading[key]
                if not future.done():
                    future.set_result((False, None))
        if obj is not None and uid and _meta(obj).get("uid") != uid:
            return None  # a new object of the same name: not this pod's owner
        return obj

    async def _fetch(
        self, res: rest.Resource, ns: str, name: str, key: tuple[str, str, str], now: float
    ) -> JSON | None:
        """One GET, its answer cached (a missing object only briefly)."""
        self.reads += 1
        at = now
        try:
            obj = await self.kube.get(res, name, ns)
        except rest.ApiError as e:
            if e.code == 403:
                log.info("%s %s/%s: not readable by the bridge; skipped", res.kind, ns, name)
            elif e.not_found:
                # Soon asked again: a PodGroup is often created just after its pods.
                at = now - self.ttl + NOT_FOUND_TTL_S
            else:
                raise
            obj = None
        self._cache[key] = (at, obj)
        if len(self._cache) > 4096:  # bounded: drop what expired
            for k in [k for k, (at, _) in self._cache.items() if now - at >= self.ttl]:
                del self._cache[k]
        return obj

    async def chain(self, pod: JSON) -> list[JSON]:
        """The pod's controller owners, nearest first, as far as they can be read."""
        out: list[JSON] = []
        ns = str(_meta(pod).get("namespace"))
        obj = pod
        for _ in range(MAX_DEPTH):
            ref = controller_ref(obj)
            if ref is None:
                break
            res = OWNERS.get((api_group(str(ref.get("apiVersion") or "")), str(ref.get("kind"))))
            if res is None:
                break  # any other owner: the pod is on its own
            owner = await self.read(res, ns, str(ref.get("name")), str(ref.get("uid") or ""))
            if owner is None:
                break
            owner = {**owner, "kind": res.kind}
            out.append(owner)
            obj = owner
        return out

    async def resolve(self, pod: JSON) -> Group | None:
        """The pod's group, or None when it is scheduled on its own; GroupProblem when its
        group is named but cannot be used (not found, bad size)."""
        meta = _meta(pod)
        ns = str(meta.get("namespace"))
        name = _labels(pod).get(PODGROUP_LABEL)
        if name:
            return await self._x_podgroup(ns, name)
        k8s_group = ((pod.get("spec") or {}).get("schedulingGroup") or {}).get("podGroupName")
        if k8s_group:
            return await self._k8s_podgroup(ns, str(k8s_group))
        owners = await self.chain(pod)
        by_kind: dict[str, JSON] = {}
        for owner in owners:
            by_kind.setdefault(str(owner.get("kind")), owner)
        if "LeaderWorkerSet" in by_kind:
            return self._lws(pod, by_kind["LeaderWorkerSet"])
        job, jobset = by_kind.get("Job"), by_kind.get("JobSet")
        if jobset is not None and job is not None and wants_gang(jobset):
            return self._jobset_rjob(jobset, job)
        if job is not None and wants_gang(job):
            spec = job.get("spec") or {}
            size = job_gang_size(spec, job, "spec")
            uid = _meta(job).get("uid")
            return Group(
                f"Job/{ns}/{_meta(job).get('name')}/{uid}",
                "Job",
                size,
                job,
                f"{ns}/{_meta(job).get('name')}",
            )
        return None

    async def _x_podgroup(self, ns: str, name: str) -> Group:
        group = await self.read(X_PODGROUPS, ns, name)
        if group is None:
            raise GroupProblem(
                "PodGroupNotFound",
                f"PodGroup {ns}/{name} (label {PODGROUP_LABEL}) does not exist or cannot be read",
            )
        group = {**group, "kind": "PodGroup"}
        size = _count(group, "spec.minMember", (group.get("spec") or {}).get("minMember"))
        return Group(f"PodGroup/{ns}/{name}", "PodGroup", size, group, f"{ns}/{name}")

    async def _k8s_podgroup(self, ns: str, name: str) -> Group | None:
        group = await self.read(PODGROUPS, ns, name)
        if group is None:
            raise GroupProblem(
                "PodGroupNotFound",
                f"PodGroup {ns}/{name} (scheduling.k8s.io, spec.schedulingGroup.podGroupName) "
                "does not exist or cannot be read",
            )
        group = {**group, "kind": "PodGroup"}
        gang = ((group.get("spec") or {}).get("schedulingPolicy") or {}).get("gang")
        if gang is None:
            return None  # the basic policy: pods one by one
        size = _count(group, "spec.schedulingPolicy.gang.minCount", gang.get("minCount"))
        uid = _meta(group).get("uid")
        return Group(f"k8s-PodGroup/{ns}/{name}/{uid}", "PodGroup", size, group, f"{ns}/{name}")

    def _lws(self, pod: JSON, lws: JSON) -> Group:
        ns, name = _meta(lws).get("namespace"), _meta(lws).get("name")
        labels = _labels(pod)
        unique = labels.get(LWS_HASH)
        if not unique:
            raise GroupProblem(
                "InvalidGroup", f"pod of LeaderWorkerSet {ns}/{name} has no label {LWS_HASH}"
            )
        if (lws.get("spec") or {}).get("startupPolicy") == "LeaderReady":
            raise GroupProblem(
                "InvalidGroup",
                f"LeaderWorkerSet {ns}/{name}: spec.startupPolicy LeaderReady makes the workers "
                "only once the leader runs, and a group starts whole or not at all; use "
                "LeaderCreated",
            )
        if LWS_EXCLUSIVE in (_meta(lws).get("annotations") or {}):
            raise GroupProblem(
                "InvalidGroup",
                f"LeaderWorkerSet {ns}/{name}: annotation {LWS_EXCLUSIVE} makes the workers "
                "only once the leader is bound, and a group is bound whole or not at all; "
                "Slurm gives every pod of the group a node of its own anyway",
            )
        template = (lws.get("spec") or {}).get("leaderWorkerTemplate") or {}
        size = _count(lws, "spec.leaderWorkerTemplate.size", template.get("size"), default=1)
        index = labels.get(LWS_GROUP_INDEX, "")
        return Group(
            f"LeaderWorkerSet/{ns}/{name}/{_SAFE.sub('', unique)}",
            "LeaderWorkerSet",
            size,
            lws,
            f"{ns}/{name}-{index}" if index else f"{ns}/{name}",
        )

    def _jobset_rjob(self, jobset: JSON, job: JSON) -> Group:
        ns, name = _meta(jobset).get("namespace"), _meta(jobset).get("name")
        rjob = _labels(job).get(JOBSET_RJOB)
        spec = next(
            (
                r
                for r in (jobset.get("spec") or {}).get("replicatedJobs") or []
                if r.get("name") == rjob
            ),
            None,
        )
        if spec is None:
            raise GroupProblem(
                "InvalidGroup",
                f"JobSet {ns}/{name} has no replicated job {rjob!r} (label {JOBSET_RJOB})",
            )
        path = f"spec.replicatedJobs[{rjob}]"
        replicas = _count(jobset, f"{path}.replicas", spec.get("replicas"), default=1)
        job_spec = ((spec.get("template") or {}).get("spec")) or {}
        size = replicas * job_gang_size(job_spec, jobset, f"{path}.template.spec")
        attempt = _labels(job).get(JOBSET_RESTARTS, "0")
        uid = _meta(jobset).get("uid")
        return Group(
            f"JobSet/{ns}/{name}/{uid}/{rjob}/{attempt}",
            "JobSet",
            size,
            jobset,
            f"{ns}/{name}-{rjob}",
        )
