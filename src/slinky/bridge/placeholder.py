"""The placeholder job of a pod, as data: what the scheduler submits to Slurm for one pod,
and how a job's `admin_comment` names the pods it stands for.

Everything here is pure (a pod and the config in, a slurmrestd `job_desc_msg` out), so the
rules are tested by value:

- one pod, one job: one node, one task; `EXTERNAL_JOB` and no script, so Slurm allocates
  and kubelet, not slurmd, runs the work;
- CPUs per task and memory per node are the pod's *effective* resources, as the kubelet
  admits it: the larger of what its containers need together (sidecars included) and what
  any init container needs while it runs, plus the pod overhead; for each container the
  larger of its request and limit (a limit is what it may use on the node); rounded up to
  whole CPUs and MiB. A pod asking for no memory gets 1 MiB, as Slurm reads 0 as "all of it";
- GPUs (`nvidia.com/gpu`, `amd.com/gpu`) become `gres/gpu:<n>` per node;
- the `slurmjob.slinky.slurm.net/*` annotations override or add the rest; exclusive nodes
  unless `exclusive: "false"`; `cpu-per-task` and `mem-per-node` can only raise the size:
  below what the containers use, the containers' value is taken;
- who the job runs as, and the account, QOS, partition, reservation and priority it may
  name, are the tenancy policy's (see `policy`): an annotation asking for more is refused
  (`PolicyDenied`);
- the job is named `<namespace>/<pod>` unless the pod names it (never `(null)` in squeue).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal

from slinky.bridge import policy
from slinky.bridge.config import BridgeConfig
from slinky.bridge.labels import SLURMJOB_PREFIX
from slinky.kube.quantity import parse_quantity
from slinky.slurm.models import Job
from slinky.types import JSON

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")
MIB = Decimal(2**20)


class PlaceholderProblem(ValueError):
    """The pod cannot be described as a Slurm job; `reason` is a CamelCase condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


# ---------------------------------------------------------------- resources


def _amount(container: JSON, resource: str, *, pod: str) -> Decimal:
    """The larger of a container's request and limit for `resource` (0 when neither)."""
    resources = container.get("resources") or {}
    best = Decimal(0)
    for kind in ("requests", "limits"):
        text = (resources.get(kind) or {}).get(resource)
        if text is None:
            continue
        try:
            best = max(best, parse_quantity(text))
        except ValueError:
            raise PlaceholderProblem(
                "InvalidResources",
                f"pod {pod}: container {container.get('name')!r} {kind}.{resource} "
                f"is not a quantity: {text!r}",
            ) from None
    return best


def effective(pod: JSON, resource: str) -> Decimal:
    """What the pod needs of `resource` at any moment of its life, overhead included."""
    spec = pod.get("spec") or {}
    key = pod_key(pod)
    sidecars = Decimal(0)  # init containers with restartPolicy Always run beside the app
    init_peak = Decimal(0)
    for c in spec.get("initContainers") or []:
        amount = _amount(c, resource, pod=key)
        if c.get("restartPolicy") == "Always":
            sidecars += amount
            init_peak = max(init_peak, sidecars)
        else:
            init_peak = max(init_peak, sidecars + amount)
    app = sum((_amount(c, resource, pod=key) for c in spec.get("containers") or []), Decimal(0))
    overhead_text = (spec.get("overhead") or {}).get(resource)
    overhead = parse_quantity(overhead_text) if overhead_text is not None else Decimal(0)
    return max(app + sidecars, init_peak) + overhead


def cpus(pod: JSON) -> int:
    """Whole CPUs, rounded up; at least one."""
    return max(1, math.ceil(effective(pod, "cpu")))


def memory_mib(pod: JSON) -> int:
    """MiB, rounded up; at least 1 (0 would ask Slurm for the whole node's memory)."""
    return max(1, math.ceil(effective(pod, "memory") / MIB))


def gpus(pod: JSON) -> int:
    return sum(math.ceil(effective(pod, r)) for r in GPU_RESOURCES)


# ---------------------------------------------------------------- annotations


def pod_key(pod: JSON) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


def pod_uid(pod: JSON) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def _annotation(pod: JSON, short: str) -> str | None:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(SLURMJOB_PREFIX + short)
    return None if value is None else str(value)


def _whole(pod: JSON, short: str, *, least: int) -> int | None:
    text = _annotation(pod, short)
    if text is None:
        return None
    # ASCII only: str.isdigit() also accepts digits int() cannot read, such as "²".
    if not (text.isascii() and text.isdigit()) or int(text) < least:
        raise PlaceholderProblem(
            "InvalidAnnotation",
            f"pod {pod_key(pod)}: annotation {SLURMJOB_PREFIX}{short} must be a whole number "
            f"of at least {least}, got {text!r}",
        )
    return int(text)


def exclusive(pod: JSON) -> bool:
    text = _annotation(pod, "exclusive")
    if text is None or text == "true":
        return True
    if text == "false":
        return False
    raise PlaceholderProblem(
        "InvalidAnnotation",
        f'pod {pod_key(pod)}: annotation {SLURMJOB_PREFIX}exclusive must be "true" or "false", '
        f"got {text!r}",
    )


def time_limit_minutes(pod: JSON) -> int | None:
    """The annotation, else the pod's activeDeadlineSeconds rounded up to minutes."""
    minutes = _whole(pod, "timelimit", least=1)
    if minutes is not None:
        return minutes
    deadline = (pod.get("spec") or {}).get("activeDeadlineSeconds")
    if deadline:
        return max(1, math.ceil(int(deadline) / 60))
    return None


def at_least_the_pods(pod: JSON, short: str, used: int) -> int:
    """The size annotation `short` (CPUs, MiB) where it asks for more than the pod's
    containers use (`used`), else `used`: Slurm never reserves less than the pod takes on
    the node, whatever the annotation says (a smaller one would let another job share what
    the pod uses)."""
    asked = _whole(pod, short, least=1)
    return used if asked is None else max(asked, used)


def job_name(pod: JSON) -> str:
    return _annotation(pod, "job-name") or pod_key(pod)


# ---------------------------------------------------------------- the job


def admin_comment(pods: list[JSON], config: BridgeConfig) -> str:
    """What a placeholder job's admin_comment holds: the pods it stands for (upstream's
    `{"pods": ["ns/name"]}`), their UIDs, so a pod recreated under the same name is never
    taken for the old one, and who made it: the scheduler name and the bridge's cluster id,
    so two bridges sharing a Slurm cluster never take each other's jobs for their own."""
    return json.dumps(
        {
            "pods": [pod_key(p) for p in pods],
            "uids": [pod_uid(p) for p in pods],
            "scheduler": config.scheduler_name,
            "cluster": config.cluster_id,
        },
        separators=(",", ":"),
    )


@dataclass(frozen=True)
class Comment:
    """A placeholder job's admin_comment, read back."""

    scheduler: str
    pods: dict[str, str]  # pod key -> UID ("" when the writer recorded none)
    cluster: str = ""  # "" when written by a bridge that recorded none (before clusterId)

    def made_by(self, config: BridgeConfig) -> bool:
        """Whether this bridge (its scheduler name and cluster id) made the job."""
        return self.scheduler == config.scheduler_name and self.cluster in ("", config.cluster_id)


def read_comment(text: str) -> Comment | None:
    """The bridge's admin_comment, or None when the comment is not one."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("pods"), list):
        return None
    keys = [str(k) for k in data["pods"]]
    uids = data["uids"] if isinstance(data.get("uids"), list) else []
    return Comment(
        scheduler=str(data.get("scheduler") or ""),
        pods={k: str(uids[i]) if i < len(uids) else "" for i, k in enumerate(keys)},
        cluster=str(data.get("cluster") or ""),
    )


def job_is_for(job: Job, config: BridgeConfig, *, key: str, uid: str = "") -> bool:
    """Whether `job`, found by a job id the bridge holds for pod `key` (UID `uid`) in a
    label, the ledger or the job watch's cache, is this bridge's placeholder job for that
    very pod, by its admin_comment. A job id alone is not identity: slurmctld restarted from
    a state save older than its last submissions gives their ids to new jobs, so the id can
    name another pod's job, another bridge's or a user's. `uid` is "" only when the pod's
    UID is not known; a comment that recorded no UID (upstream's) goes by the name."""
    comment = read_comment(str(job.raw.get("admin_comment") or ""))
    if comment is None or not comment.made_by(config) or key not in comment.pods:
        return False
    recorded = comment.pods[key]
    return not uid or not recorded or recorded == uid


def marked_for(job: Job, config: BridgeConfig, pods: Mapping[str, str]) -> bool:
    """Whether `job` carries this bridge's mark for one of `pods` (key -> UID), in
    admin_comment or, an allocation made as the pod's user and not marked yet, in comment:
    still the job made for them (its id may name another job since a slurmctld restart,
    another pod's placeholder among them)."""
    comment = read_comment(str(job.raw.get("admin_comment") or ""))
    if comment is None and not job.raw.get("admin_comment"):
        comment = read_comment(str(job.raw.get("comment") or ""))
    if comment is None or not comment.made_by(config):
        return False
    return any(
        key in comment.pods and (not uid or not comment.pods[key] or comment.pods[key] == uid)
        for key, uid in pods.items()
    )


def names_another_pod(job: Job, *, key: str, uid: str) -> bool:
    """Whether `job` is, by its admin_comment, a placeholder job of the bridge's format made
    for pods other than pod `key` (UID `uid`), or has no such comment at all: taken by a
    bound pod's job id, the pod's own job is gone (its id given again after a slurmctld
    restart). Unlike `job_is_for`, a comment naming this very pod under another scheduler
    name or cluster id (the bridge's own identity changed) still counts as the pod's: a
    changed config never takes a running pod for one that lost its job."""
    comment = read_comment(str(job.raw.get("admin_comment") or ""))
    if comment is None or key not in comment.pods:
        return True
    recorded = comment.pods[key]
    return bool(uid and recorded and recorded != uid)


def identity(pod: JSON, config: BridgeConfig) -> policy.Identity:
    """Who the pod's job runs as and what it names, by the policy rule of the pod's
    namespace; PlaceholderProblem `PolicyDenied` naming the rule."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "")
    rule = config.policy.rule_for(namespace)
    who = f"pods of namespace {namespace}"
    try:
        return policy.decide(rule, policy.pod_annotations(pod), partition=config.partition, who=who)
    except policy.PolicyDenied as e:
        raise PlaceholderProblem("PolicyDenied", f"pod {pod_key(pod)}: {e}") from None


def allocation_user(pod: JSON, config: BridgeConfig) -> str | None:
    """The Slurm user to ask an immediate allocation of the pod's job as, or None when the
    job must be submitted: an allocation belongs to the user who asks, in that user's
    primary group, so it matches what a submission would make only for the rule's first
    user and group (not ones a pod picked by annotation), and it cannot carry a priority
    (an administrator's field)."""
    if _annotation(pod, "priority") is not None:
        return None
    meta = pod.get("metadata") or {}
    rule = config.policy.rule_for(str(meta.get("namespace") or ""))
    who = identity(pod, config)
    if (who.user, who.group) != (rule.users[0], rule.groups[0]):
        return None
    return who.user


def job_description(pod: JSON, config: BridgeConfig) -> JSON:
    """The `job_desc_msg` of the placeholder job for one pod; PlaceholderProblem when an
    annotation or resource cannot be read, or the policy refuses what the pod asks."""
    # Malformed numbers are named as such before the policy judges the values.
    priority = _whole(pod, "priority", least=0)
    for short in ("user-id", "group-id"):
        _whole(pod, short, least=0)
    who = identity(pod, config)
    job: JSON = {
        "name": job_name(pod),
        "flags": ["EXTERNAL_JOB"],
        # Never requeued by Slurm: the pod it stands for has started (see workload.sync).
        "requeue": False,
        "admin_comment": admin_comment([pod], config),
        "current_working_directory": "/tmp",
        "partition": who.partition,
        "user_id": who.user,
        "minimum_nodes": 1,
        "maximum_nodes": 1,
        "tasks": 1,
        "tasks_per_node": 1,
        "cpus_per_task": at_least_the_pods(pod, "cpu-per-task", cpus(pod)),
        "memory_per_node": {
            "set": True,
            "number": at_least_the_pods(pod, "mem-per-node", memory_mib(pod)),
        },
    }
    if config.mcs_label:
        job["mcs_label"] = config.mcs_label
    if exclusive(pod):
        job["shared"] = ["none"]
    gres = _annotation(pod, "gres")
    if gres:
        job["tres_per_node"] = gres if gres.startswith("gres/") else f"gres/{gres}"
    elif n := gpus(pod):
        job["tres_per_node"] = f"gres/gpu:{n}"
    minutes = time_limit_minutes(pod)
    if minutes is not None:
        job["time_limit"] = {"set": True, "number": minutes}
    if priority is not None:
        job["priority"] = {"set": True, "number": priority}
    job["group_id"] = who.group
    for field, value in (
        ("account", who.account),
        ("qos", who.qos),
        ("reservation", who.reservation),
    ):
        if value:
            job[field] = value
    for short in ("licenses", "constraints", "wckey"):
        value = _annotation(pod, short)
        if value:
            job[short] = value
    return job
