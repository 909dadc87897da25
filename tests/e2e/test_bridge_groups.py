"""Pod groups through the bridge, against the real apiserver, the real Job controller and
real Slurm: a group's pods stay unbound until Slurm allocated one job of N nodes, then all
bind on N distinct nodes; a group too large for the free nodes waits and a smaller one
behind it does not jump it; `scancel` evicts the whole group; deleting the owner cancels
the job.

Nodes: both real nodes of the test bed (their pods really run) and its two kwok nodes
(Slurm's allocation is real, kwok plays the kubelet), all registered in Slurm by the
bridge's node controller for this module. Pods that do not tolerate kwok's taint are kept
off the kwok nodes by the bridge (excluded nodes), so they land on the real ones.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from slinky.bridge import podcontrol
from slinky.bridge.groups import GANG, JOB_COMPLETION_INDEX, LWS_GROUP_INDEX, PODGROUP_LABEL
from slinky.bridge.labels import (
    EXTERNAL_NODE,
    FINALIZER,
    SLURM_JOBID,
    SLURM_NODE,
    SLURMJOB_PREFIX,
)
from slinky.bridge.nodes.registration import registered_for
from slinky.kube import conditions, rest
from slinky.slurm.models import Job, expand_hostlist
from slinky_testbed import nodes
from slinky_testbed.waiting import wait_for
from tests.e2e.bridge_fixtures import SCHEDULER, BridgeEnv, wait_slurm_node
from tests.e2e.group_controllers import GroupControllers
from tests.e2e.test_bridge_scheduler import get_pod, job_ended, pod_gone

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
TAINT = f"{SCHEDULER}:NoExecute"
PODGROUPS = rest.Resource("scheduling.x-k8s.io", "v1alpha1", "podgroups", "PodGroup")
JOBS = rest.Resource("batch", "v1", "jobs", "Job")
KWOK_TOLERATION = {"key": "kwok.x-k8s.io/node", "operator": "Exists"}


# ---------------------------------------------------------------- fixtures


@dataclass
class GangNodes:
    real: list[str]
    kwok: list[str]

    @property
    def all(self) -> list[str]:
        return [*self.real, *self.kwok]


async def install_podgroup_crd(kube: rest.Kube) -> None:
    crd = yaml.safe_load((REPO / "config/groups/scheduling.x-k8s.io_podgroups.yaml").read_text())
    await kube.apply(rest.CRDS, crd, field_manager="slinky-e2e")

    async def established() -> bool:
        got = await kube.get(rest.CRDS, crd["metadata"]["name"])
        return conditions.is_true((got.get("status") or {}).get("conditions"), "Established")

    await wait_for(established, timeout=30, what="PodGroup CRD established")


@pytest.fixture(scope="module")
async def gang_nodes(bridge_env: BridgeEnv) -> AsyncIterator[GangNodes]:
    """Both real and both kwok nodes of the test bed managed by the bridge for this module
    (given back unlabelled and gone from Slurm afterwards), and the PodGroup CRD."""
    env = bridge_env
    if env.bridge.lost_leadership():
        await env.bridge.restart()
    await install_podgroup_crd(env.kube)
    state = env.testbed.load()
    managed = GangNodes(list(state.real_nodes), list(state.kwok_nodes))
    for name in managed.kwok:
        node = await env.kube.get(rest.NODES, name)
        if not (node.get("status") or {}).get("addresses"):
            # Slurm needs an address for an EXTERNAL node; it never contacts it.
            await env.kube.patch(
                rest.NODES,
                name,
                {"status": {"addresses": [{"type": "InternalIP", "address": "127.0.0.1"}]}},
                subresource="status",
            )
    for name in managed.all:
        await env.kube.patch(rest.NODES, name, {"metadata": {"labels": {EXTERNAL_NODE: "true"}}})
    try:
        for name in managed.all:
            await wait_slurm_node(
                env,
                name,
                lambda n, name=name: (
                    n is not None and registered_for(n) == name and not n.state.is_drain
                ),
                f"node {name} registered in Slurm by the bridge",
                timeout=90,
            )

            async def tainted(name: str = name) -> bool:
                return await env.taint_values(name) == [TAINT]

            await wait_for(tainted, timeout=30, what=f"node {name} tainted")
        yield managed
    finally:
        for name in managed.all:
            await env.kube.patch(rest.NODES, name, {"metadata": {"labels": {EXTERNAL_NODE: None}}})
        for name in managed.all:
            await wait_slurm_node(env, name, lambda n: n is None, f"{name} gone from Slurm", 90)


# ---------------------------------------------------------------- helpers


def container(args: list[str]) -> JSON:
    return {
        "name": "main",
        "image": nodes.image_ref("slurm"),
        "imagePullPolicy": "IfNotPresent",
        "args": args,
        "resources": {"requests": {"cpu": "500m", "memory": "64Mi"}},
    }


def group_pod(name: str, group: str, args: list[str], *, kwok: bool = False) -> JSON:
    spec: JSON = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 2,
        "containers": [container(args)],
    }
    if kwok:
        spec["tolerations"] = [KWOK_TOLERATION]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {PODGROUP_LABEL: group}},
        "spec": spec,
    }


def podgroup(name: str, min_member: int, annotations: dict[str, str] | None = None) -> JSON:
    return {
        "apiVersion": "scheduling.x-k8s.io/v1alpha1",
        "kind": "PodGroup",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {"minMember": min_member},
    }


async def labelled(env: BridgeEnv, ns: str, selector: str) -> list[JSON]:
    items = (await env.kube.list(rest.PODS, ns, params={"labelSelector": selector}))["items"]
    return sorted(items, key=lambda p: p["metadata"]["name"])


def reason(pod: JSON) -> str:
    c = conditions.find((pod.get("status") or {}).get("conditions"), "PodScheduled")
    return str(c.get("reason")) if c else ""


async def wait_all_bound(
    env: BridgeEnv, ns: str, selector: str, n: int, timeout: float, *, per_job: int = 0
) -> list[JSON]:
    """Every one of the `n` pods bound, checked each time: a pod is bound only once its
    group's job of `per_job` nodes (default `n`) is allocated whole (all or nothing)."""

    async def bound() -> list[JSON] | None:
        pods = await labelled(env, ns, selector)
        on = [p for p in pods if p["spec"].get("nodeName")]
        if len(pods) == n and len(on) == n:
            return pods
        for p in on:  # a bound pod: the job of its group is allocated whole
            job = await env.slurm.get_job(job_of(p))
            assert job.is_running or job.is_finished, (p["metadata"]["name"], job.state)
            assert len(expand_hostlist(job.nodes)) == (per_job or n), job.nodes
        return None

    return await wait_for(
        bound, timeout=timeout, interval=0.3, what=f"{n} pods of {selector} bound"
    )


def job_of(pod: JSON) -> int:
    """A bound pod's job: its label, or (the label follows the binding by a few ms) the
    annotation its Binding carried."""
    job_id = podcontrol.job_id_of(pod)
    assert job_id is not None, pod["metadata"]
    return job_id


async def the_one_job(env: BridgeEnv, pods: list[JSON]) -> Job:
    """The pods' single Slurm job, checked to have one node per pod, each pod bound to the
    node Slurm gave it (recorded on the pod), no two on one node."""
    ids = {job_of(p) for p in pods}
    assert len(ids) == 1, ids
    job = await env.slurm.get_job(ids.pop())
    allocated = expand_hostlist(job.nodes)
    assert len(allocated) == len(pods), (job.nodes, len(pods))
    where = [p["spec"]["nodeName"] for p in pods]
    assert sorted(where) == sorted(allocated), (where, allocated)
    for p in pods:
        assert p["metadata"]["annotations"][SLURM_NODE] == p["spec"]["nodeName"]
    assert "EXTERNAL_JOB" in job.flags
    return job


async def cleanup(env: BridgeEnv, ns: str, selector: str) -> None:
    """Delete the pods and wait until they are gone. A pod on a kwok node is first reported
    Succeeded, as a kubelet would when its work ends: kwok removes a deleted pod only once
    its finalizers are gone, and the bridge removes its finalizer only from a terminal pod."""
    pods = await labelled(env, ns, selector)
    for p in pods:
        if str(p["spec"].get("nodeName") or "").startswith("kwok-"):
            with contextlib.suppress(rest.ApiError):
                await env.kube.patch(
                    rest.PODS,
                    p["metadata"]["name"],
                    {"status": {"phase": "Succeeded"}},
                    ns,
                    subresource="status",
                )
    await env.kube.request("DELETE", rest.PODS.path(ns), params={"labelSelector": selector})
    for p in pods:
        await pod_gone(env, p["metadata"]["name"], ns, timeout=90)


# ---------------------------------------------------------------- PodGroup


async def test_a_podgroup_waits_for_every_pod_then_runs_as_one_slurm_job_on_distinct_nodes(
    bridge: BridgeEnv, gang_nodes: GangNodes
) -> None:
    env, ns = bridge, bridge.managed_namespace
    group = f"pg-{uuid.uuid4().hex[:6]}"
    await env.kube.create(PODGROUPS, podgroup(group, 2), ns)
    await env.kube.create(rest.PODS, group_pod(f"{group}-0", group, ["sh", "-c", "sleep 3"]), ns)

    async def waits() -> JSON | None:
        pod = await get_pod(env, f"{group}-0", ns)
        return pod if pod is not None and reason(pod) == "WaitingForGroup" else None

    alone = await wait_for(waits, timeout=60, what="the first pod waits for its group")
    # One pod of two: nothing submitted, nothing bound.
    assert SLURM_JOBID not in (alone["metadata"].get("labels") or {})
    assert not alone["spec"].get("nodeName")
    assert (
        "1 of 2 pods" in conditions.find(alone["status"]["conditions"], "PodScheduled")["message"]
    )  # type: ignore[index]

    await env.kube.create(rest.PODS, group_pod(f"{group}-1", group, ["sh", "-c", "sleep 3"]), ns)
    selector = f"{PODGROUP_LABEL}={group}"
    pods = await wait_all_bound(env, ns, selector, 2, timeout=90)
    job = await the_one_job(env, pods)
    assert sorted(expand_hostlist(job.nodes)) == sorted(gang_nodes.real)  # not kwok: untolerated
    assert job.name == f"{ns}/{group}"

    async def succeeded() -> bool:
        return [p["status"].get("phase") for p in await labelled(env, ns, selector)] == [
            "Succeeded",
            "Succeeded",
        ]

    await wait_for(succeeded, timeout=120, what="both pods Succeeded")
    ended = await job_ended(env, job.job_id, timeout=60)
    assert ended.state == ["CANCELLED"] and int(ended.raw.get("restart_cnt") or 0) == 0
    await cleanup(env, ns, selector)
    await env.kube.delete(PODGROUPS, group, ns)


async def test_scancel_of_a_running_group_job_evicts_every_pod_of_the_group(
    bridge: BridgeEnv, gang_nodes: GangNodes
) -> None:
    env, ns = bridge, bridge.managed_namespace
    group = f"pgc-{uuid.uuid4().hex[:6]}"
    await env.kube.create(PODGROUPS, podgroup(group, 2), ns)
    for i in range(2):
        await env.kube.create(rest.PODS, group_pod(f"{group}-{i}", group, ["sleep", "600"]), ns)
    selector = f"{PODGROUP_LABEL}={group}"
    pods = await wait_all_bound(env, ns, selector, 2, timeout=90)
    job = await the_one_job(env, pods)

    async def running() -> bool:
        return all(p["status"].get("phase") == "Running" for p in await labelled(env, ns, selector))

    await wait_for(running, timeout=90, what="both pods Running")
    await env.slurm.cancel_job(job.job_id)
    for p in pods:
        await pod_gone(env, p["metadata"]["name"], ns, timeout=90)
    await env.kube.delete(PODGROUPS, group, ns)


async def test_a_gang_pod_that_ended_first_leaves_its_siblings_job_followed_and_the_bridge_free(
    bridge: BridgeEnv, gang_nodes: GangNodes
) -> None:
    """CI's wedge: a gang pod that ended first (finalizer gone, label kept) untracked the
    job its running sibling held; each change of the sibling then read the job again and
    told both pods "changed", for ever (a storm of reads, or, with the read on loan from the
    scheduler, no await at all: the bridge stopped renewing its Leases and answering
    probes). Each change of the sibling is one reconcile or two, and the job lives on."""
    env, ns = bridge, bridge.managed_namespace
    group = f"pge-{uuid.uuid4().hex[:6]}"
    first, last = f"{group}-0", f"{group}-1"
    await env.kube.create(PODGROUPS, podgroup(group, 2), ns)
    await env.kube.create(rest.PODS, group_pod(first, group, ["sh", "-c", "sleep 1"]), ns)
    await env.kube.create(rest.PODS, group_pod(last, group, ["sleep", "600"]), ns)
    selector = f"{PODGROUP_LABEL}={group}"
    job = await the_one_job(env, await wait_all_bound(env, ns, selector, 2, timeout=90))

    async def first_settled() -> bool:
        p = await get_pod(env, first, ns)
        return (
            p is not None
            and p["status"].get("phase") == "Succeeded"
            and FINALIZER not in (p["metadata"].get("finalizers") or [])
        )

    await wait_for(first_settled, timeout=90, what=f"{first} Succeeded, its finalizer gone")

    def reconciles() -> float:
        return env.bridge.metric_sum(
            "controller_runtime_reconcile_total", 'controller="bridge-workload"'
        )

    before = reconciles()
    for i in range(1, 4):  # any change brings the sibling back to the workload controller
        await env.kube.patch(rest.PODS, last, {"metadata": {"labels": {"touched": str(i)}}}, ns)
        await wait_for(
            lambda i=i: reconciles() >= before + i, timeout=30, what=f"change {i} reconciled"
        )
    assert reconciles() - before < 12, "the two pods woke each other up"
    assert (await env.slurm.get_job(job.job_id)).is_running
    await env.kube.delete(rest.PODS, last, ns)
    ended = await job_ended(env, job.job_id, timeout=60)
    assert ended.state == ["CANCELLED"] and int(ended.raw.get("restart_cnt") or 0) == 0
    await cleanup(env, ns, selector)
    await env.kube.delete(PODGROUPS, group, ns)


# ---------------------------------------------------------------- Job


def gang_job(name: str, n: int, args: list[str]) -> JSON:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": {GANG: "true"}},
        "spec": {
            "completionMode": "Indexed",
            "parallelism": n,
            "completions": n,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"e2e-gang": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 2,
                    "subdomain": name,
                    "containers": [container(args)],
                },
            },
        },
    }


async def test_an_indexed_gang_job_runs_as_one_slurm_job_with_pod_i_on_the_ith_node(
    bridge: BridgeEnv, gang_nodes: GangNodes
) -> None:
    env, ns = bridge, bridge.managed_namespace
    name = f"gj-{uuid.uuid4().hex[:6]}"
    await env.kube.create(JOBS, gang_job(name, 2, ["sh", "-c", "sleep 3"]), ns)
    selector = f"e2e-gang={name}"
    pods = await wait_all_bound(env, ns, selector, 2, timeout=120)
    job = await the_one_job(env, pods)
    assert job.name == f"{ns}/{name}"
    by_index = sorted(pods, key=lambda p: int(p["metadata"]["labels"][JOB_COMPLETION_INDEX]))
    # Completion index i runs on the i-th node of Slurm's node list (Slurm's task rank i).
    assert [p["spec"]["nodeName"] for p in by_index] == expand_hostlist(job.nodes)

    async def complete() -> bool:
        got = await env.kube.get(JOBS, name, ns)
        return conditions.is_true((got.get("status") or {}).get("conditions"), "Complete")

    await wait_for(complete, timeout=120, what=f"Job {name} Complete")
    ended = await job_ended(env, job.job_id, timeout=60)
    assert ended.state == ["CANCELLED"] and int(ended.raw.get("restart_cnt") or 0) == 0
    await env.kube.delete(JOBS, name, ns, propagation="Background")
    await cleanup(env, ns, selector)


async def test_deleting_the_owner_of_a_running_group_cancels_its_slurm_job(
    bridge: BridgeEnv, gang_nodes: GangNodes
) -> None:
    env, ns = bridge, bridge.managed_namespace
    name = f"gjd-{uuid.uuid4().hex[:6]}"
    await env.kube.create(JOBS, gang_job(name, 2, ["sleep", "600"]), ns)
    selector = f"e2e-gang={name}"
    pods = await wait_all_bound(env, ns, selector, 2, timeout=120)
    job = await the_one_job(env, pods)
    # As `kubectl delete job` does: the pods go with it (background propagation).
    await env.kube.delete(JOBS, name, ns, propagation="Background")
    ended = await job_ended(env, job.job_id, timeout=120)
    assert ended.state == ["CANCELLED"]
    for p in pods:
        await pod_gone(env, p["metadata"]["name"], ns, timeout=90)


# ---------------------------------------------------------------- order


async def test_a_group_too_large_for_the_free_nodes_waits_and_a_smaller_one_does_not_jump_it(
    bridge: BridgeEnv, gang_nodes: GangNodes
) -> None:
    """Four managed nodes, one busy with another job: a group of four (higher priority)
    waits for it; a group of two submitted after it (lower priority) could fit on the free
    nodes, but Slurm's backfill never starts a job that would delay the big one (it has no
    time limit), so it waits too. When the busy node frees, the big group starts whole; the
    small one only after it."""
    env, ns = bridge, bridge.managed_namespace
    run = uuid.uuid4().hex[:6]
    busy = await env.submit_placeholder(gang_nodes.kwok[0])

    async def busy_runs() -> bool:
        return (await env.slurm.get_job(busy)).is_running

    await wait_for(busy_runs, timeout=60, what="the other job runs")
    big, small = f"big-{run}", f"small-{run}"
    try:
        await env.kube.create(
            PODGROUPS, podgroup(big, 4, {SLURMJOB_PREFIX + "priority": "2000"}), ns
        )
        for i in range(4):
            pod = group_pod(f"{big}-{i}", big, ["sleep", "600"], kwok=True)
            await env.kube.create(rest.PODS, pod, ns)

        async def pending_job(selector: str, n: int) -> Job | None:
            pods = await labelled(env, ns, selector)
            ids = {(p["metadata"].get("labels") or {}).get(SLURM_JOBID) for p in pods}
            if len(pods) != n or None in ids or len(ids) != 1:
                return None
            job = await env.slurm.get_job(int(str(ids.pop())))
            return job if job.is_pending and job.state_reason not in ("", "None") else None

        big_job = await wait_for(
            lambda: pending_job(f"{PODGROUP_LABEL}={big}", 4),
            timeout=90,
            what="the big group's job pending in Slurm",
        )
        await env.kube.create(
            PODGROUPS, podgroup(small, 2, {SLURMJOB_PREFIX + "priority": "1000"}), ns
        )
        for i in range(2):
            pod = group_pod(f"{small}-{i}", small, ["sleep", "600"], kwok=True)
            await env.kube.create(rest.PODS, pod, ns)
        small_job = await wait_for(
            lambda: pending_job(f"{PODGROUP_LABEL}={small}", 2),
            timeout=90,
            what="the small group's job pending in Slurm",
        )
        # Slurm has looked at the small job (it has a reason) and keeps it behind the big one.
        assert small_job.state_reason in ("Priority", "Resources"), small_job.state_reason
        for p in await labelled(env, ns, f"{PODGROUP_LABEL}={small}"):
            assert not p["spec"].get("nodeName")

        await env.slurm.cancel_job(busy)
        pods = await wait_all_bound(env, ns, f"{PODGROUP_LABEL}={big}", 4, timeout=180)
        job = await the_one_job(env, pods)
        assert job.job_id == big_job.job_id
        assert sorted(expand_hostlist(job.nodes)) == sorted(gang_nodes.all)
        # The small group still waits: the big one holds every node.
        assert (await env.slurm.get_job(small_job.job_id)).is_pending
        for p in await labelled(env, ns, f"{PODGROUP_LABEL}={small}"):
            assert not p["spec"].get("nodeName") and reason(p) == "SlurmJobPending"

        await cleanup(env, ns, f"{PODGROUP_LABEL}={big}")
        assert (await job_ended(env, job.job_id, timeout=90)).state == ["CANCELLED"]
        pods = await wait_all_bound(env, ns, f"{PODGROUP_LABEL}={small}", 2, timeout=180)
        assert (await the_one_job(env, pods)).job_id == small_job.job_id
    finally:
        with contextlib.suppress(Exception):
            await env.slurm.cancel_job(busy)
        for g in (big, small):
            await cleanup(env, ns, f"{PODGROUP_LABEL}={g}")
            with contextlib.suppress(rest.ApiError):
                await env.kube.delete(PODGROUPS, g, ns)


async def test_a_member_deleted_after_slurm_allocated_its_group_leaves_no_pod_bound(
    bridge: BridgeEnv, gang_nodes: GangNodes
) -> None:
    """All or nothing in the middle of placement: Slurm allocates a group's job while no
    scheduler is there to bind it (the bridge stopped; a busy node kept the job pending until
    then), and one member is deleted before the bridge comes back. The bridge must not bind
    the others to a job that cannot run whole: the job is cancelled, no pod of the group is
    bound, the deleted member goes, and the rest wait for a whole group again."""
    env, ns = bridge, bridge.managed_namespace
    group = f"mid-{uuid.uuid4().hex[:6]}"
    selector = f"{PODGROUP_LABEL}={group}"
    n = len(gang_nodes.all)
    busy = await env.submit_placeholder(gang_nodes.kwok[0])
    try:
        await env.kube.create(PODGROUPS, podgroup(group, n), ns)
        for i in range(n):
            pod = group_pod(f"{group}-{i}", group, ["sleep", "600"], kwok=True)
            await env.kube.create(rest.PODS, pod, ns)

        async def one_pending_job() -> int | None:
            pods = await labelled(env, ns, selector)
            ids = {(p["metadata"].get("labels") or {}).get(SLURM_JOBID) for p in pods}
            if len(pods) != n or None in ids or len(ids) != 1:
                return None
            job_id = int(str(ids.pop()))
            return job_id if (await env.slurm.get_job(job_id)).is_pending else None

        job_id = await wait_for(one_pending_job, timeout=90, what="the group's job pending")
        assert env.bridge.stop() == 0
        await env.slurm.cancel_job(busy)

        async def allocated() -> bool:
            return (await env.slurm.get_job(job_id)).is_running

        await wait_for(allocated, timeout=120, what="Slurm allocates the group's job")
        await env.kube.delete(rest.PODS, f"{group}-0", ns)  # held by the bridge's finalizer
        await env.bridge.restart()
        assert (await job_ended(env, job_id, timeout=60)).state == ["CANCELLED"]
        await pod_gone(env, f"{group}-0", ns, timeout=60)

        # No member was ever bound. (What happens to the others next depends on which of
        # two paths cancelled first: the scheduler's, which unlabels them to wait for a whole
        # group again, or the workload controller's for the deleted pod, after which they
        # go with the ended job; both are safe and not judged here.)
        for p in await labelled(env, ns, selector):
            assert not p["spec"].get("nodeName"), p["metadata"]["name"]
    finally:
        with contextlib.suppress(Exception):
            await env.slurm.cancel_job(busy)
        if env.bridge.proc.poll() is not None:
            await env.bridge.restart()
        await cleanup(env, ns, selector)
        with contextlib.suppress(rest.ApiError):
            await env.kube.delete(PODGROUPS, group, ns)


# ---------------------------------------------------------------- real JobSet and LWS controllers

JOBSETS = rest.Resource("jobset.x-k8s.io", "v1alpha2", "jobsets", "JobSet")
LWS = rest.Resource("leaderworkerset.x-k8s.io", "v1", "leaderworkersets", "LeaderWorkerSet")
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
LWS_NAME = "leaderworkerset.sigs.k8s.io/name"


def jobset(name: str, replicas: int, args: list[str], *, gang: bool) -> JSON:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "annotations": {GANG: "true"} if gang else {}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "w",
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "parallelism": 1,
                            "completions": 1,
                            "backoffLimit": 0,
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "terminationGracePeriodSeconds": 2,
                                    "containers": [container(args)],
                                }
                            },
                        }
                    },
                }
            ]
        },
    }


async def jobset_completed(env: BridgeEnv, name: str, ns: str) -> None:
    async def completed() -> bool:
        got = await env.kube.get(JOBSETS, name, ns)
        return conditions.is_true((got.get("status") or {}).get("conditions"), "Completed")

    await wait_for(completed, timeout=180, what=f"JobSet {name} Completed")


async def test_a_jobset_runs_one_slurm_job_per_pod_by_default(
    bridge: BridgeEnv, gang_nodes: GangNodes, group_controllers: GroupControllers
) -> None:
    env, ns = bridge, bridge.managed_namespace
    name = f"js-{uuid.uuid4().hex[:6]}"
    await env.kube.create(JOBSETS, jobset(name, 2, ["sh", "-c", "sleep 3"], gang=False), ns)
    selector = f"{JOBSET_NAME}={name}"

    async def all_bound() -> list[JSON] | None:
        pods = await labelled(env, ns, selector)
        return pods if len(pods) == 2 and all(p["spec"].get("nodeName") for p in pods) else None

    pods = await wait_for(all_bound, timeout=120, what="both JobSet pods bound")
    ids = {job_of(p) for p in pods}
    assert len(ids) == 2  # one job per pod, as upstream
    for job_id in ids:
        assert len(expand_hostlist((await env.slurm.get_job(int(job_id))).nodes)) == 1
    await jobset_completed(env, name, ns)
    for job_id in ids:
        assert (await job_ended(env, int(job_id), timeout=60)).state == ["CANCELLED"]
    await env.kube.delete(JOBSETS, name, ns, propagation="Background")
    await cleanup(env, ns, selector)


async def test_a_gang_jobset_runs_as_one_slurm_job_and_its_pods_find_each_other_by_name(
    bridge: BridgeEnv, gang_nodes: GangNodes, group_controllers: GroupControllers
) -> None:
    """The JobSet controller gives each pod a hostname under the JobSet's headless Service;
    each pod looks the other one up by that name before it exits 0."""
    env, ns = bridge, bridge.managed_namespace
    name = f"jsg-{uuid.uuid4().hex[:6]}"
    peers = " ".join(f"{name}-w-{i}-0.{name}" for i in range(2))
    script = (
        f"for h in {peers}; do ok=; for i in $(seq 90); do "
        'getent hosts "$h" && ok=1 && break; sleep 1; done; [ -n "$ok" ] || exit 1; done'
    )
    await env.kube.create(JOBSETS, jobset(name, 2, ["sh", "-c", script], gang=True), ns)
    selector = f"{JOBSET_NAME}={name}"
    pods = await wait_all_bound(env, ns, selector, 2, timeout=120)
    job = await the_one_job(env, pods)
    assert job.name == f"{ns}/{name}-w"
    for p in pods:
        assert p["spec"].get("subdomain") == name and p["spec"].get("hostname")
    await jobset_completed(env, name, ns)
    ended = await job_ended(env, job.job_id, timeout=60)
    assert ended.state == ["CANCELLED"] and int(ended.raw.get("restart_cnt") or 0) == 0
    await env.kube.delete(JOBSETS, name, ns, propagation="Background")
    await cleanup(env, ns, selector)


async def test_each_leaderworkerset_replica_runs_as_one_slurm_job_and_deleting_it_cancels_them(
    bridge: BridgeEnv, gang_nodes: GangNodes, group_controllers: GroupControllers
) -> None:
    env, ns = bridge, bridge.managed_namespace
    name = f"lws-{uuid.uuid4().hex[:6]}"
    template = {
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "tolerations": [KWOK_TOLERATION],
            "containers": [container(["sleep", "600"])],
        }
    }
    lws = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 2, "workerTemplate": template}},
    }
    await env.kube.create(LWS, lws, ns)
    selector = f"{LWS_NAME}={name}"
    pods = await wait_all_bound(env, ns, selector, 4, timeout=180, per_job=2)
    jobs = []
    for index in ("0", "1"):
        replica = [p for p in pods if p["metadata"]["labels"].get(LWS_GROUP_INDEX) == index]
        job = await the_one_job(env, replica)  # one job of two nodes per replica
        assert job.name == f"{ns}/{name}-{index}"
        jobs.append(job)
    used = [n for j in jobs for n in expand_hostlist(j.nodes)]
    assert sorted(used) == sorted(gang_nodes.all)  # four distinct nodes
    await env.kube.delete(LWS, name, ns, propagation="Background")
    await cleanup(env, ns, selector)  # the kubelets (kwok: the test) report the pods ended
    for job in jobs:
        assert (await job_ended(env, job.job_id, timeout=120)).state == ["CANCELLED"]


# ---------------------------------------------------------------- Kubernetes 1.36 PodGroup

K8S_PODGROUPS = rest.Resource("scheduling.k8s.io", "v1alpha2", "podgroups", "PodGroup")


async def test_a_kubernetes_podgroup_with_a_gang_policy_runs_as_one_slurm_job(
    bridge: BridgeEnv, gang_nodes: GangNodes
) -> None:
    """The test bed's apiserver serves scheduling.k8s.io/v1alpha2 (feature gate
    GenericWorkload): pods naming a PodGroup with a gang policy of minCount 2 start
    together as one Slurm job of two nodes."""
    env, ns = bridge, bridge.managed_namespace
    name = f"kpg-{uuid.uuid4().hex[:6]}"
    group = {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    }
    await env.kube.create(K8S_PODGROUPS, group, ns)
    for i in range(2):
        pod = group_pod(f"{name}-{i}", name, ["sh", "-c", "sleep 3"])
        pod["metadata"]["labels"] = {"e2e-k8s-group": name}
        pod["spec"]["schedulingGroup"] = {"podGroupName": name}
        created = await env.kube.create(rest.PODS, pod, ns)
        assert created["spec"].get("schedulingGroup") == {"podGroupName": name}
    selector = f"e2e-k8s-group={name}"
    pods = await wait_all_bound(env, ns, selector, 2, timeout=90)
    job = await the_one_job(env, pods)
    assert job.name == f"{ns}/{name}"

    async def succeeded() -> bool:
        phases = [p["status"].get("phase") for p in await labelled(env, ns, selector)]
        return phases == ["Succeeded", "Succeeded"]

    await wait_for(succeeded, timeout=120, what="both pods Succeeded")
    assert (await job_ended(env, job.job_id, timeout=60)).state == ["CANCELLED"]
    await cleanup(env, ns, selector)
    await env.kube.delete(K8S_PODGROUPS, name, ns)


# ---------------------------------------------------------------- before allocation


async def test_a_pod_leaving_a_pending_group_cancels_its_job_and_the_group_waits_again(
    bridge: BridgeEnv, gang_nodes: GangNodes
) -> None:
    """A group whose job Slurm keeps pending (more CPUs per node than any node has): one pod
    deleted cancels the job; the other pod is not deleted, it waits for a whole group again,
    and a new pod makes the group whole: a new job."""
    env, ns = bridge, bridge.managed_namespace
    group = f"pgp-{uuid.uuid4().hex[:6]}"
    await env.kube.create(
        PODGROUPS, podgroup(group, 2, {SLURMJOB_PREFIX + "cpu-per-task": "64"}), ns
    )
    for i in range(2):
        await env.kube.create(rest.PODS, group_pod(f"{group}-{i}", group, ["sleep", "600"]), ns)
    selector = f"{PODGROUP_LABEL}={group}"

    async def one_pending_job() -> int | None:
        pods = await labelled(env, ns, selector)
        ids = {(p["metadata"].get("labels") or {}).get(SLURM_JOBID) for p in pods}
        if len(pods) != 2 or None in ids or len(ids) != 1:
            return None
        return int(str(ids.pop()))

    first = await wait_for(one_pending_job, timeout=60, what="one job for the group")
    assert (await env.slurm.get_job(first)).is_pending
    await env.kube.delete(rest.PODS, f"{group}-0", ns)
    assert (await job_ended(env, first, timeout=60)).state == ["CANCELLED"]

    async def waits_again() -> JSON | None:
        pod = await get_pod(env, f"{group}-1", ns)
        labels = (pod or {}).get("metadata", {}).get("labels") or {}
        return (
            pod if pod and SLURM_JOBID not in labels and reason(pod) == "WaitingForGroup" else None
        )

    await wait_for(waits_again, timeout=60, what="the other pod waits for its group again")
    await env.kube.create(rest.PODS, group_pod(f"{group}-2", group, ["sleep", "600"]), ns)
    second = await wait_for(one_pending_job, timeout=60, what="a new job for the whole group")
    assert second != first and (await env.slurm.get_job(second)).is_pending
    await cleanup(env, ns, selector)
    assert (await job_ended(env, second, timeout=60)).state == ["CANCELLED"]
    await env.kube.delete(PODGROUPS, group, ns)


async def test_a_group_larger_than_the_managed_nodes_is_not_submitted_and_says_why(
    bridge: BridgeEnv, gang_nodes: GangNodes
) -> None:
    env, ns = bridge, bridge.managed_namespace
    group = f"pgl-{uuid.uuid4().hex[:6]}"
    n = len(gang_nodes.all) + 1
    await env.kube.create(PODGROUPS, podgroup(group, n), ns)
    for i in range(n):
        pod = group_pod(f"{group}-{i}", group, ["sleep", "600"], kwok=True)
        await env.kube.create(rest.PODS, pod, ns)
    selector = f"{PODGROUP_LABEL}={group}"

    async def all_unfit() -> list[JSON] | None:
        pods = await labelled(env, ns, selector)
        ok = len(pods) == n and all(reason(p) == "NoManagedNodeFits" for p in pods)
        return pods if ok else None

    pods = await wait_for(all_unfit, timeout=60, what="every pod NoManagedNodeFits")
    message = conditions.find(pods[0]["status"]["conditions"], "PodScheduled")["message"]  # type: ignore[index]
    assert f"needs {n} nodes at once" in message, message
    assert all(SLURM_JOBID not in (p["metadata"].get("labels") or {}) for p in pods)
    await cleanup(env, ns, selector)
    await env.kube.delete(PODGROUPS, group, ns)


# ---------------------------------------------------------------- every kind: scancel, owner


@dataclass
class Kind:
    """How a test makes a group of two pods of one kind, finds them, and removes its owner."""

    resource: rest.Resource
    manifest: Any  # (name) -> the owner object
    selector: str  # label key whose value is the owner's name


def k8s_podgroup_owner(name: str) -> JSON:
    return {
        "apiVersion": "scheduling.k8s.io/v1alpha2",
        "kind": "PodGroup",
        "metadata": {"name": name},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 2}}},
    }


def lws_of_one_replica(name: str) -> JSON:
    template = {
        "spec": {"terminationGracePeriodSeconds": 2, "containers": [container(["sleep", "600"])]}
    }
    return {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {"replicas": 1, "leaderWorkerTemplate": {"size": 2, "workerTemplate": template}},
    }


KINDS = {
    "scheduler-plugins-podgroup": Kind(PODGROUPS, lambda n: podgroup(n, 2), PODGROUP_LABEL),
    "kubernetes-podgroup": Kind(K8S_PODGROUPS, k8s_podgroup_owner, "e2e-k8s-group"),
    "gang-job": Kind(JOBS, lambda n: gang_job(n, 2, ["sleep", "600"]), "e2e-gang"),
    "gang-jobset": Kind(JOBSETS, lambda n: jobset(n, 2, ["sleep", "600"], gang=True), JOBSET_NAME),
    "leaderworkerset": Kind(LWS, lws_of_one_replica, LWS_NAME),
}


async def create_group(env: BridgeEnv, kind: Kind, name: str, ns: str) -> None:
    """The owner, and for the two PodGroup kinds the two bare pods naming it."""
    await env.kube.create(kind.resource, kind.manifest(name), ns)
    if kind.resource in (PODGROUPS, K8S_PODGROUPS):
        for i in range(2):
            pod = group_pod(f"{name}-{i}", name, ["sleep", "600"])
            pod["metadata"]["labels"][kind.selector] = name
            if kind.resource == K8S_PODGROUPS:
                del pod["metadata"]["labels"][PODGROUP_LABEL]
                pod["spec"]["schedulingGroup"] = {"podGroupName": name}
            await env.kube.create(rest.PODS, pod, ns)


async def original_pods_gone(env: BridgeEnv, pods: list[JSON], ns: str) -> None:
    """Each pod deleted; a controller may make a new pod of the same name (LWS does), which
    is another pod (another UID)."""

    async def gone() -> bool:
        for p in pods:
            live = await get_pod(env, p["metadata"]["name"], ns)
            if live is not None and live["metadata"]["uid"] == p["metadata"]["uid"]:
                return False
        return True

    await wait_for(gone, timeout=90, interval=0.3, what="every pod of the group evicted")


async def no_live_job_named(env: BridgeEnv, prefix: str) -> None:
    async def none_left() -> bool:
        jobs, _ = await env.slurm.list_jobs()
        return not [j for j in jobs or [] if j.name.startswith(prefix) and not j.is_finished]

    await wait_for(none_left, timeout=120, interval=0.5, what=f"no live Slurm job {prefix}*")


@pytest.mark.parametrize("kind_name", list(KINDS))
async def test_every_kind_of_group_is_evicted_whole_by_scancel_and_deleting_its_owner_cancels(
    kind_name: str,
    bridge: BridgeEnv,
    gang_nodes: GangNodes,
    group_controllers: GroupControllers,
) -> None:
    """For each kind: the group binds whole as one Slurm job on two distinct nodes;
    `scancel` of that job evicts every pod of the group; deleting the owner (for the
    PodGroup kinds: the group's pods, which the PodGroup does not own) leaves no live Slurm
    job of the group behind, whatever the owner made again after the eviction; and deleting
    the owner of a second group while it runs cancels that group's job."""
    kind = KINDS[kind_name]
    env, ns = bridge, bridge.managed_namespace
    name = f"k{kind_name[:3]}-{uuid.uuid4().hex[:6]}"
    await create_group(env, kind, name, ns)
    selector = f"{kind.selector}={name}"
    pods = await wait_all_bound(env, ns, selector, 2, timeout=180)
    job = await the_one_job(env, pods)

    await env.slurm.cancel_job(job.job_id)
    await original_pods_gone(env, pods, ns)
    assert (await job_ended(env, job.job_id, timeout=60)).state == ["CANCELLED"]

    bare_pods = kind.resource in (PODGROUPS, K8S_PODGROUPS)
    if bare_pods:
        await cleanup(env, ns, selector)
    await env.kube.delete(kind.resource, name, ns, propagation="Background")
    await no_live_job_named(env, f"{ns}/{name}")
    await cleanup(env, ns, selector)
    if bare_pods:
        return  # a PodGroup owns no pod: deleting the pods is what ends them (above)

    # Deleting the owner of a group that runs cancels its job.
    second = f"{name}-b"
    await create_group(env, kind, second, ns)
    running = await wait_all_bound(env, ns, f"{kind.selector}={second}", 2, timeout=180)
    job = await the_one_job(env, running)
    await env.kube.delete(kind.resource, second, ns, propagation="Background")
    assert (await job_ended(env, job.job_id, timeout=120)).state == ["CANCELLED"]
    await cleanup(env, ns, f"{kind.selector}={second}")
