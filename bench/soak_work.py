"""The work the soak keeps submitting while the chaos runs, and how it follows each piece.

- Batch jobs through slurmrestd (`POST job/submit` with a `sleep` script of random length)
  into partition `batch` (the NodeSet the chaos scales, to 0 too: jobs must queue), and in
  waves into `compute` (the HPA's NodeSet: between waves its queue empties and the HPA
  takes it to 0, the next wave brings it back).
- Pods in the bridge's managed namespace, `restartPolicy: Never`, `sleep` of random length:
  single pods and gangs of two (a scheduler-plugins PodGroup); once finished, some are
  deleted and some left in place. On kwok nodes nothing runs a container, so the soak plays
  the kubelet there: a pod that has run its time is reported Succeeded, and one whose
  deletion was requested while it ran is reported Failed (its containers stopped, as a
  kubelet does; kwok only removes the pod, which the bridge's finalizer holds until then).

Each stream draws what it submits from its own seeded generator (the n-th job is the same
for a seed); when it submits depends on the cluster (a stream waits while its backlog is
full, and retries a pod the admission webhook refused while the bridge was down)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from typing import Any

from bench.soak_bed import BRIDGE_NAMESPACE, HPA_NODESET, SCALED_NODESET
from bench.soak_health import UNREACHABLE, parse_time
from bench.soak_state import BridgePod, Soak, TrackedJob
from slinky.bridge import labels as bridge_labels
from slinky.bridge import placeholder, podcontrol
from slinky.bridge.groups import PODGROUP_LABEL, X_PODGROUPS
from slinky.kube import rest
from slinky.slurm.models import Job, expand_hostlist
from slinky_testbed import dev_bridge, nodes

JSON = dict[str, Any]
JOB_PREFIX = "soak-"
MEAN_JOB_GAP_S = 6.0  # batch stream at intensity 1
MEAN_POD_GAP_S = 10.0  # bridge stream at intensity 1
MAX_BACKLOG = 20  # pending jobs of a stream before it waits
WAVE_GAP_S = (90.0, 180.0)
GANG_SHARE = 0.3
KEEP_SHARE = 0.4
EXCLUSIVE_SHARE = 0.2  # the rest share their node (a placeholder job is exclusive by default)
MAX_PODS_WAITING = 12  # unbound pods before the bridge stream waits
CREATE_RETRY_S = 90.0
SECONDS_ANNOTATION = "soak.slinky.slurm.net/seconds"
EXCLUSIVE_ANNOTATION = bridge_labels.SLURMJOB_PREFIX + "exclusive"
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists"}
TERMINAL = ("Succeeded", "Failed")


# ---------------------------------------------------------------- batch jobs


def job_description(name: str, partition: str, nodes_: int, seconds: int) -> JSON:
    """A job of `nodes_` nodes, one CPU and 100 MB on each (without a memory request a job
    takes a whole node's memory), timed out a few minutes after its sleep would end (a job
    Slurm believes running after its processes died ends at that limit)."""
    return {
        "name": name,
        "partition": partition,
        "minimum_nodes": nodes_,
        "maximum_nodes": nodes_,
        "tasks": nodes_,
        "cpus_per_task": 1,
        "memory_per_node": {"set": True, "number": 100},
        "current_working_directory": "/tmp",
        "environment": ["PATH=/usr/bin:/bin"],
        "time_limit": {"set": True, "number": seconds // 60 + 2},
    }


async def submit(soak: Soak, name: str, partition: str, nodes_: int, seconds: int) -> None:
    """Submit one batch job; a failure is recorded (Slurm may still have made the job: the
    job watch adopts it by its unique name)."""
    try:
        job_id = await soak.slurm.submit_job(
            job_description(name, partition, nodes_, seconds),
            script=f"#!/bin/sh\nsleep {seconds}\n",
        )
    except UNREACHABLE as e:
        soak.submit_failures.append((time.time(), name, f"{type(e).__name__}: {e}"[:300]))
        return
    soak.track(TrackedJob(job_id, name, partition, nodes_, seconds, time.time()), time.time())
    soak.job_names[name] = job_id


def backlog(soak: Soak, partition: str) -> int:
    return sum(
        1
        for j in soak.jobs.values()
        if j.partition == partition and not j.finished and j.running_since is None
    )


async def batch_stream(soak: Soak, seed: int, intensity: float, max_seconds: int) -> None:
    """Jobs into `batch`, one now and then; one in six asks for two nodes."""
    rng = random.Random(f"batch/{seed}")
    n = 0
    while not soak.stopping.is_set():
        gap = rng.expovariate(intensity / MEAN_JOB_GAP_S)
        nodes_ = 2 if rng.random() < 1 / 6 else 1
        seconds = rng.randint(3, max_seconds)
        await sleep_unless_stopping(soak, gap)
        while backlog(soak, SCALED_NODESET) >= MAX_BACKLOG and not soak.stopping.is_set():
            await sleep_unless_stopping(soak, 2)
        if soak.stopping.is_set():
            return
        n += 1
        await submit(soak, f"{JOB_PREFIX}b{n}", SCALED_NODESET, nodes_, seconds)


async def compute_waves(soak: Soak, seed: int, max_seconds: int) -> None:
    """Waves of 1-4 jobs into `compute`, 1.5-3 minutes apart (the first within a minute)."""
    rng = random.Random(f"compute/{seed}")
    n = 0
    gap = rng.uniform(20, 60)
    while not soak.stopping.is_set():
        await sleep_unless_stopping(soak, gap)
        if soak.stopping.is_set():
            return
        for _ in range(rng.randint(1, 4)):
            n += 1
            nodes_ = rng.choice((1, 1, 2))
            await submit(
                soak, f"{JOB_PREFIX}c{n}", HPA_NODESET, nodes_, rng.randint(5, max_seconds)
            )
        gap = rng.uniform(*WAVE_GAP_S)


async def sleep_unless_stopping(soak: Soak, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(soak.stopping.wait(), timeout=seconds)


def track_jobs(soak: Soak, jobs: list[Job], asked_at: float) -> None:
    """Update every job of ours from one listing of all jobs Slurm knows (asked at
    `asked_at`): state changes, requeues, nodes; jobs whose submission was answered before
    the listing was asked for and that Slurm does not list, without a settled end, vanished."""
    listed: set[int] = set()
    for job in jobs:
        tracked = soak.jobs.get(job.job_id)
        if tracked is not None and not same_job(tracked, job):
            tracked = None  # Slurm lost our job and gave its id to this one (see adopt)
        if tracked is None:
            tracked = adopt(soak, job, asked_at)
            if tracked is None:
                continue
        listed.add(job.job_id)
        note_state(tracked, job, asked_at)
    for tracked in soak.jobs.values():
        if (
            tracked.job_id not in listed
            and tracked.ended_at is None
            and tracked.vanished_at is None
            and tracked.submitted_at < asked_at
        ):
            tracked.vanished_at = asked_at
            tracked.states.append((asked_at, "GONE (Slurm no longer lists it)"))


def identity(job: Job) -> tuple[bool, str]:
    """(placeholder?, name) as the soak tracks a job: a placeholder job by its pods."""
    comment = placeholder.read_comment(str(job.raw.get("admin_comment") or ""))
    if comment is not None and comment.scheduler == dev_bridge.SCHEDULER_NAME:
        return True, ",".join(comment.pods)
    return False, job.name


def same_job(tracked: TrackedJob, job: Job) -> bool:
    """Whether the listed job is the one tracked under its id, not another that Slurm gave
    the id of a job it lost."""
    return identity(job) == (tracked.placeholder, tracked.name)


def adopt(soak: Soak, job: Job, at: float) -> TrackedJob | None:
    """A job of ours not yet tracked: a placeholder job of the bridge, or a batch job whose
    submission Slurm took though its answer never came back."""
    is_placeholder, name = identity(job)
    if is_placeholder:
        tracked = TrackedJob(
            job.job_id,
            name,
            job.partition,
            name.count(",") + 1,
            0,
            float(job.raw.get("submit_time", {}).get("number") or at),
            placeholder=True,
        )
    elif job.name.startswith(JOB_PREFIX) and job.name not in soak.job_names:
        tracked = TrackedJob(job.job_id, job.name, job.partition, 0, 0, at, answered=False)
        soak.job_names[job.name] = job.job_id
        soak.log(f"job {job.job_id} ({job.name}) found in Slurm though its submission failed")
    else:
        return None
    soak.track(tracked, at)
    return tracked


def note_state(tracked: TrackedJob, job: Job, at: float) -> None:
    shown = "+".join(job.state)
    if job.state_reason and job.state_reason != "None":
        shown += f" ({job.state_reason})"
    if not tracked.states or tracked.states[-1][1] != shown:
        if tracked.vanished_at is not None:
            tracked.states.append((at, "LISTED AGAIN"))
            tracked.vanished_at = None
        tracked.states.append((at, shown))
    tracked.last = job
    tracked.restart_cnt = max(tracked.restart_cnt, int(job.raw.get("restart_cnt") or 0))
    tracked.nodes_seen.update(expand_hostlist(job.nodes))
    if job.is_running and tracked.running_since is None:
        tracked.running_since = at
    if job.is_finished and "COMPLETING" not in job.state and tracked.ended_at is None:
        tracked.ended_at = at
        tracked.first_end = "+".join(job.state)


# ---------------------------------------------------------------- bridge pods


def bridge_pod(name: str, seconds: int, group: str, *, exclusive: bool) -> JSON:
    """A pod that sleeps `seconds`; a gang's pods take the job's shape from their PodGroup."""
    labels = {"app.kubernetes.io/name": "soak"}
    annotations = {SECONDS_ANNOTATION: str(seconds)}
    if group:
        labels[PODGROUP_LABEL] = group
    else:
        annotations[EXCLUSIVE_ANNOTATION] = str(exclusive).lower()
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "tolerations": [KWOK_TOLERATION],
            "containers": [
                {
                    "name": "main",
                    "image": nodes.image_ref("slurm"),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", str(seconds)],
                    "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}},
                }
            ],
        },
    }


def pod_group(name: str, members: int, *, exclusive: bool) -> JSON:
    return {
        "apiVersion": X_PODGROUPS.api_version,
        "kind": X_PODGROUPS.kind,
        "metadata": {
            "name": name,
            "annotations": {EXCLUSIVE_ANNOTATION: str(exclusive).lower()},
        },
        "spec": {"minMember": members},
    }


async def create(soak: Soak, res: rest.Resource, obj: JSON, pod: BridgePod | None) -> str:
    """Create `obj`, retried while the apiserver or the bridge's webhook refuses (the
    managed namespace fails closed while the bridge is down); each refusal is recorded on
    `pod`. Returns the new object's UID ("" when it never got created)."""
    deadline = time.monotonic() + CREATE_RETRY_S
    while True:
        try:
            made = await soak.kube.create(res, obj, BRIDGE_NAMESPACE)
            return str(made["metadata"]["uid"])
        except UNREACHABLE as e:
            said = f"{soak.rel(time.time())} {type(e).__name__}: {e}"[:300]
            if pod is not None:
                pod.create_refusals.append(said)
            if isinstance(e, rest.ApiError) and e.conflict:
                # An earlier try made it, and its answer was lost.
                with contextlib.suppress(*UNREACHABLE):
                    name = obj["metadata"]["name"]
                    return str(
                        (await soak.kube.get(res, name, BRIDGE_NAMESPACE))["metadata"]["uid"]
                    )
            if time.monotonic() > deadline:
                return ""
            await asyncio.sleep(2)


async def bridge_stream(soak: Soak, seed: int, intensity: float, max_seconds: int) -> None:
    """Single pods and gangs of two, most sharing their nodes, each left in place or deleted
    once finished."""
    rng = random.Random(f"bridge/{seed}")
    n = 0
    while not soak.stopping.is_set():
        gap = rng.expovariate(intensity / MEAN_POD_GAP_S)
        gang = rng.random() < GANG_SHARE
        seconds = rng.randint(3, max_seconds)
        keep = rng.random() < KEEP_SHARE
        exclusive = rng.random() < EXCLUSIVE_SHARE
        await sleep_unless_stopping(soak, gap)
        while waiting_pods(soak) >= MAX_PODS_WAITING and not soak.stopping.is_set():
            await sleep_unless_stopping(soak, 2)
        if soak.stopping.is_set():
            return
        n += 1
        if gang:
            group = f"g{n}"
            await create(soak, X_PODGROUPS, pod_group(group, 2, exclusive=exclusive), None)
            members = [BridgePod(f"{group}-{i}", group, seconds, keep) for i in range(2)]
        else:
            members = [BridgePod(f"p{n}", "", seconds, keep)]
        for pod in members:
            soak.pods[pod.name] = pod
            manifest = bridge_pod(pod.name, seconds, pod.group, exclusive=exclusive)
            pod.uid = await create(soak, rest.PODS, manifest, pod)
            # From the answer on: a listing asked for after it shows the pod.
            pod.created_at = time.time()
            pod.never_created = not pod.uid


def waiting_pods(soak: Soak) -> int:
    return sum(1 for p in soak.pods.values() if p.bound_at is None and not p.settled)


async def tend_bridge_pods(soak: Soak, listing: list[JSON], asked_at: float) -> None:
    """From one listing of the managed namespace: note binding, jobs and phase of each pod;
    end kwok pods that ran their time (as a kubelet would); delete finished pods not meant
    to be kept, and a gang's PodGroup once its pods are deleted."""
    kwok = set(soak.bed.load().kwok_nodes)
    by_name = {p["metadata"]["name"]: p for p in listing}
    # A copy: the bridge stream adds pods while this awaits its patches and deletes.
    for bp in list(soak.pods.values()):
        if not bp.uid or bp.gone_at is not None:
            continue
        pod = by_name.get(bp.name)
        if pod is None or pod["metadata"]["uid"] != bp.uid:
            if bp.created_at < asked_at:
                bp.gone_at = asked_at
            continue
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        job_id = podcontrol.job_id_of(pod)  # the label, or the Binding's annotation
        if job_id is not None:
            bp.job_ids.add(job_id)
        if spec.get("nodeName") and bp.bound_at is None:
            bp.bound_at, bp.node = asked_at, spec["nodeName"]
        bp.phase = str(status.get("phase") or "")
        if bp.phase in TERMINAL and bp.finished_at is None:
            bp.finished_at = asked_at
        started = status.get("startTime")
        if bp.phase == "Running" and bp.node in kwok and pod["metadata"].get("deletionTimestamp"):
            # Soak run 7: the bridge deleted such a pod 5 s after Slurm lost its job's
            # allocation, and it stayed Running, bound, until its simulated time was up.
            await act(end_kwok_pod(soak, bp.name, phase="Failed"))
        elif (
            bp.phase == "Running"
            and bp.node in kwok
            and started
            and time.time() - parse_time(started) >= bp.seconds
        ):
            await act(end_kwok_pod(soak, bp.name))
        finished = bp.finished_at is not None and not bp.keep
        if finished and bp.deleted_by_soak_at is None and await act(delete_pod(soak, bp)):
            bp.deleted_by_soak_at = time.time()
    await delete_finished_groups(soak)


async def end_kwok_pod(soak: Soak, name: str, *, phase: str = "Succeeded") -> None:
    patch = {"status": {"phase": phase}}
    await soak.kube.patch(rest.PODS, name, patch, BRIDGE_NAMESPACE, subresource="status")


async def delete_pod(soak: Soak, bp: BridgePod) -> None:
    try:
        await soak.kube.delete(rest.PODS, bp.name, BRIDGE_NAMESPACE, uid=bp.uid)
    except rest.ApiError as e:
        if not e.not_found and e.code != 409:
            raise


async def delete_finished_groups(soak: Soak) -> None:
    groups: dict[str, list[BridgePod]] = {}
    for bp in soak.pods.values():
        if bp.group:
            groups.setdefault(bp.group, []).append(bp)
    for group, members in groups.items():
        if group in soak.groups_deleted or any(
            m.keep or (m.deleted_by_soak_at is None and not m.never_created) for m in members
        ):
            continue
        if await act(delete_group(soak, group)):
            soak.groups_deleted.add(group)


async def delete_group(soak: Soak, group: str) -> None:
    try:
        await soak.kube.delete(X_PODGROUPS, group, BRIDGE_NAMESPACE)
    except rest.ApiError as e:
        if not e.not_found:
            raise


async def act(step: Any) -> bool:
    """Await one step; a failure (a component down) is left for the next round."""
    try:
        await step
        return True
    except UNREACHABLE:
        return False
