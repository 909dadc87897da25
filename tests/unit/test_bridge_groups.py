"""Pod groups: how a pod's group is found (labels, controller owners, what may not be read),
what one job for a whole group looks like, and the scheduler's all-or-nothing steps against
fakes of the apiserver and slurmrestd."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from types import SimpleNamespace
from typing import Any

import pytest

from slinky.bridge import groups, placeholder
from slinky.bridge.config import parse_config
from slinky.bridge.groups import GANG, Group, GroupProblem, GroupResolver
from slinky.bridge.jobwatch import JobWatch
from slinky.bridge.labels import FINALIZER, SLURM_JOBID, SLURM_JOBID_ANNOTATION, SLURMJOB_PREFIX
from slinky.bridge.scheduler import gang
from slinky.bridge.scheduler import sync as sched_sync
from slinky.bridge.workload.sync import BY_JOB, WorkloadSync, index_job
from slinky.kube import rest
from slinky.kube.store import Store
from slinky.slurm import errors
from slinky.slurm.started import SlurmctldStart
from tests.unit.test_bridge_scheduler_sync import (
    FakeKube,
    FakeSlurm,
    idle,
    job_label,
    make_pod,
    setup,
)

JSON = dict[str, Any]
CONFIG = parse_config(
    {
        "partition": "bridge",
        "schedulerName": "s1",
        "managedNamespaces": ["ns"],
        "policy": {"namespaces": {"ns": {"partitions": ["p2"]}}},
    }
)


class Owners:
    """An apiserver that answers GETs of owners from a dict; 403 for `forbidden` paths."""

    def __init__(
        self, objects: dict[tuple[str, str], JSON], forbidden: frozenset[str] = frozenset()
    ) -> None:
        self.objects = objects
        self.forbidden = forbidden
        self.gets: list[str] = []

    async def get(self, res: rest.Resource, name: str, ns: str | None = None) -> JSON:
        path = res.path(ns, name)
        self.gets.append(path)
        if res.plural in self.forbidden:
            raise rest.ApiError(403, "Forbidden", "no")
        obj = self.objects.get((res.plural, name))
        if obj is None:
            raise rest.ApiError(404, "NotFound", path)
        return obj


def owned(obj: JSON, kind: str, name: str, uid: str, api_version: str) -> JSON:
    obj.setdefault("metadata", {})["ownerReferences"] = [
        {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid, "controller": True}
    ]
    return obj


def job(name: str, uid: str, *, gang: str | None = None, **spec: Any) -> JSON:
    annotations = {GANG: gang} if gang is not None else {}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "annotations": annotations},
        "spec": spec,
    }


async def resolve(pod: JSON, kube: Owners) -> Group | None:
    return await GroupResolver(kube).resolve(pod)  # type: ignore[arg-type]


# ---------------------------------------------------------------- resolution


async def test_a_bare_pod_and_a_job_without_the_annotation_are_on_their_own() -> None:
    kube = Owners({("jobs", "j"): job("j", "ju", parallelism=2, completions=2)})
    assert await resolve(make_pod("p", "u"), kube) is None
    pod = owned(make_pod("p", "u"), "Job", "j", "ju", "batch/v1")
    assert await resolve(pod, kube) is None


async def test_a_gang_job_is_one_group_of_parallelism_pods() -> None:
    kube = Owners({("jobs", "j"): job("j", "ju", gang="true", parallelism=3, completions=3)})
    pod = owned(make_pod("j-0", "u"), "Job", "j", "ju", "batch/v1")
    group = await resolve(pod, kube)
    assert group is not None and (group.kind, group.size, group.name) == ("Job", 3, "ns/j")


async def test_a_gang_job_must_start_every_pod_at_once() -> None:
    kube = Owners({("jobs", "j"): job("j", "ju", gang="true", parallelism=2, completions=4)})
    pod = owned(make_pod("j-0", "u"), "Job", "j", "ju", "batch/v1")
    with pytest.raises(GroupProblem, match=r"spec.completions \(4\) must equal"):
        await resolve(pod, kube)


async def test_a_gang_jobset_is_one_group_per_replicated_job_and_restart() -> None:
    jobset = {
        "metadata": {"name": "js", "namespace": "ns", "uid": "jsu",
                     "annotations": {GANG: "true"}},
        "spec": {"replicatedJobs": [
            {"name": "workers", "replicas": 2,
             "template": {"spec": {"parallelism": 2, "completions": 2}}},
        ]},
    }  # fmt: skip
    child = owned(job("js-workers-0", "ju"), "JobSet", "js", "jsu", "jobset.x-k8s.io/v1alpha2")
    child["metadata"]["labels"] = {groups.JOBSET_RJOB: "workers", groups.JOBSET_RESTARTS: "1"}
    kube = Owners({("jobs", "js-workers-0"): child, ("jobsets", "js"): jobset})
    pod = owned(make_pod("p", "u"), "Job", "js-workers-0", "ju", "batch/v1")
    group = await resolve(pod, kube)
    assert group is not None and (group.kind, group.size) == ("JobSet", 4)
    assert group.key.endswith("/workers/1") and group.name == "ns/js-workers"


async def test_a_leaderworkerset_replica_is_one_group_of_size_pods() -> None:
    lws = {"metadata": {"name": "lws", "namespace": "ns", "uid": "lu"},
           "spec": {"leaderWorkerTemplate": {"size": 3}}}  # fmt: skip
    leader_sts = owned({"metadata": {"name": "lws", "uid": "lsu"}}, "LeaderWorkerSet", "lws",
                       "lu", "leaderworkerset.x-k8s.io/v1")  # fmt: skip
    leader = owned(make_pod("lws-0", "lp"), "StatefulSet", "lws", "lsu", "apps/v1")
    worker_sts = owned({"metadata": {"name": "lws-0", "uid": "wsu"}}, "Pod", "lws-0", "lp", "v1")
    kube = Owners({
        ("leaderworkersets", "lws"): lws, ("statefulsets", "lws"): leader_sts,
        ("statefulsets", "lws-0"): worker_sts, ("pods", "lws-0"): leader,
    })  # fmt: skip
    worker = owned(make_pod("lws-0-1", "wp"), "StatefulSet", "lws-0", "wsu", "apps/v1")
    worker["metadata"]["labels"] = {groups.LWS_HASH: "abc", groups.LWS_GROUP_INDEX: "0"}
    group = await resolve(worker, kube)
    assert group is not None and (group.kind, group.size, group.name) == (
        "LeaderWorkerSet", 3, "ns/lws-0"
    )  # fmt: skip


async def test_a_leaderworkerset_whose_workers_wait_for_a_placed_leader_is_refused() -> None:
    for spec, meta in (
        ({"startupPolicy": "LeaderReady"}, {}),
        ({}, {"annotations": {groups.LWS_EXCLUSIVE: "kubernetes.io/hostname"}}),
    ):
        lws = {"metadata": {"name": "lws", "namespace": "ns", "uid": "lu", **meta},
               "spec": {"leaderWorkerTemplate": {"size": 2}, **spec}}  # fmt: skip
        kube = Owners({("leaderworkersets", "lws"): lws})
        pod = owned(make_pod("lws-0", "lp"), "LeaderWorkerSet", "lws", "lu",
                    "leaderworkerset.x-k8s.io/v1")  # fmt: skip
        pod["metadata"]["labels"] = {groups.LWS_HASH: "abc"}
        with pytest.raises(GroupProblem, match=r"a group is bound whole|starts whole"):
            await resolve(pod, kube)


async def test_an_owner_the_bridge_may_not_read_is_skipped() -> None:
    kube = Owners({("jobs", "j"): job("j", "ju", gang="true", parallelism=2)}, frozenset({"jobs"}))
    pod = owned(make_pod("p", "u"), "Job", "j", "ju", "batch/v1")
    assert await resolve(pod, kube) is None


async def test_owners_are_read_once_for_all_pods_of_a_group() -> None:
    kube = Owners({("jobs", "j"): job("j", "ju", gang="true", parallelism=2, completions=2)})
    resolver = GroupResolver(kube)  # type: ignore[arg-type]
    for i in range(5):
        await resolver.resolve(owned(make_pod(f"p{i}", f"u{i}"), "Job", "j", "ju", "batch/v1"))
    assert kube.gets == ["/apis/batch/v1/namespaces/ns/jobs/j"]


async def test_a_podgroup_label_names_the_group_and_its_min_member() -> None:
    pg = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"minMember": 2}}
    pod = make_pod("p", "u")
    pod["metadata"]["labels"] = {groups.PODGROUP_LABEL: "g"}
    group = await resolve(pod, Owners({("podgroups", "g"): pg}))
    assert group is not None and (group.kind, group.size) == ("PodGroup", 2)
    with pytest.raises(GroupProblem, match=r"PodGroup ns/g .* does not exist"):
        await resolve(pod, Owners({}))


async def test_a_kubernetes_podgroup_with_a_gang_policy_is_a_group_and_basic_is_not() -> None:
    pod = make_pod("p", "u")
    pod["spec"]["schedulingGroup"] = {"podGroupName": "g"}
    gang = {"metadata": {"name": "g", "namespace": "ns", "uid": "gu"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 4}}}}  # fmt: skip
    group = await resolve(pod, Owners({("podgroups", "g"): gang}))
    assert group is not None and group.size == 4
    basic = {"metadata": {"name": "g", "namespace": "ns"},
             "spec": {"schedulingPolicy": {"basic": {}}}}  # fmt: skip
    assert await resolve(pod, Owners({("podgroups", "g"): basic})) is None


# ---------------------------------------------------------------- the job


def test_one_job_for_a_group_has_n_nodes_one_task_each_and_names_every_pod_in_rank_order() -> None:
    root = {"kind": "Job", "metadata": {"name": "j", "namespace": "ns", "annotations": {
        SLURMJOB_PREFIX + "partition": "p2", GANG: "true"}},
        "spec": {"activeDeadlineSeconds": 61}}  # fmt: skip
    pods = []
    for i, cpu in ((1, "3"), (0, "1")):
        p = make_pod(f"j-{i}", f"u{i}")
        p["metadata"]["labels"] = {groups.JOB_COMPLETION_INDEX: str(i)}
        p["spec"]["containers"] = [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]
        pods.append(p)
    desc = groups.job_description(pods, Group("Job/ns/j", "Job", 2, root, "ns/j"), CONFIG)
    assert (desc["minimum_nodes"], desc["maximum_nodes"], desc["tasks"]) == (2, 2, 2)
    assert desc["tasks_per_node"] == 1 and desc["cpus_per_task"] == 3  # the largest pod
    assert desc["partition"] == "p2" and desc["name"] == "ns/j"
    assert desc["time_limit"] == {"set": True, "number": 2}  # the Job's deadline
    comment = placeholder.read_comment(desc["admin_comment"])
    assert comment is not None and list(comment.pods) == ["ns/j-0", "ns/j-1"]


def test_a_group_roots_annotation_outside_the_policy_is_refused_naming_the_rule() -> None:
    """A root object (here a Job) never passes the webhook: the policy is applied when its
    job is described, with the root's annotations merged over the pods'."""
    root = {"kind": "Job", "metadata": {"name": "j", "namespace": "ns", "annotations": {
        SLURMJOB_PREFIX + "account": "someone-elses", GANG: "true"}}, "spec": {}}  # fmt: skip
    pods = [make_pod(f"j-{i}", f"u{i}") for i in range(2)]
    with pytest.raises(placeholder.PlaceholderProblem) as e:
        groups.job_description(pods, Group("Job/ns/j", "Job", 2, root, "ns/j"), CONFIG)
    assert e.value.reason == "PolicyDenied"
    assert "'someone-elses' is not allowed" in e.value.message
    assert "policy.namespaces.ns.accounts" in e.value.message


# ---------------------------------------------------------------- the scheduler's steps


class GroupKube(FakeKube):
    """Pods as FakeKube keeps them, a PodGroup to read, and label removal."""

    def __init__(self, pods: Store, min_member: int) -> None:
        super().__init__(pods)
        self.podgroup = {"metadata": {"name": "g", "namespace": "ns"},
                         "spec": {"minMember": min_member}}  # fmt: skip

    async def get(self, res: rest.Resource, name: str, ns: str | None = None) -> JSON:
        assert res.plural == "podgroups" and name == "g"
        return self.podgroup

    async def patch(self, res: Any, name: str, body: Any, ns: str, **kw: Any) -> JSON:
        pod = await super().patch(res, name, body, ns, **kw)
        labels = pod["metadata"]["labels"]
        for k in [k for k, v in labels.items() if v is None]:
            del labels[k]
        return pod


def group_pods(n: int) -> list[JSON]:
    out = []
    for i in range(n):
        p = make_pod(f"g-{i}", f"u{i}")
        p["metadata"]["labels"] = {groups.PODGROUP_LABEL: "g"}
        out.append(p)
    return out


def gang_setup(min_member: int) -> Any:
    sync, slurm, _kube, pods = setup()
    kube = GroupKube(pods, min_member)
    sync.kube = kube  # type: ignore[assignment]
    sync.gangs.resolver = GroupResolver(kube)  # type: ignore[arg-type]
    return sync, slurm, kube, pods


async def submitted_group(sync: Any, slurm: Any, pods: Store) -> int:
    """Both pods of group `g` created and looked at: its one job (pending: no node is free)."""
    for p in group_pods(2):
        pods.upsert(p)
        await sync.reconcile(f"ns/{p['metadata']['name']}")
    (job_id,) = slurm.jobs
    return int(job_id)


def allocate(sync: Any, slurm: Any, job_id: int, nodes: str) -> None:
    """Slurm allocates the job; the watch would drop its cached read on the change."""
    slurm.allocate(job_id, nodes)
    sync.watch.jobs.pop(job_id)


async def test_a_group_waits_without_a_job_until_it_has_every_pod() -> None:
    sync, slurm, kube, pods = gang_setup(2)
    first = group_pods(2)[0]
    pods.upsert(first)
    await sync.reconcile("ns/g-0")
    assert slurm.jobs == {} and kube.bound == {}


async def test_a_whole_group_gets_one_job_and_binds_only_once_allocated_on_distinct_nodes() -> None:
    sync, slurm, kube, pods = gang_setup(2)
    job_id = await submitted_group(sync, slurm, pods)
    desc = slurm.jobs[job_id]
    assert (desc["minimum_nodes"], desc["maximum_nodes"]) == (2, 2)
    assert [job_label(pods.get(f"ns/g-{i}")) for i in range(2)] == [str(job_id)] * 2
    assert kube.bound == {}  # pending: no pod bound
    allocate(sync, slurm, job_id, "n[1-2]")
    await sync.reconcile("ns/g-1")
    assert kube.bound == {"ns/g-0": "n1", "ns/g-1": "n2"}  # rank i -> i-th node, all at once
    assert len(slurm.jobs) == 1


async def test_a_pod_leaving_a_pending_group_cancels_the_job_and_frees_the_others() -> None:
    sync, slurm, kube, pods = gang_setup(2)
    job_id = await submitted_group(sync, slurm, pods)
    await sync.reconcile("ns/g-1")  # both members placed: both wait on the job
    pods.delete("ns/g-0")
    await sync.reconcile("ns/g-0")
    assert slurm.cancelled == [job_id]
    assert job_label(pods.get("ns/g-1")) is None  # waits for a whole group again
    assert kube.bound == {}
    # No one waits on the cancelled job any more: it would keep every later pod from an
    # immediate allocation ("a pending job of ours may be there") and Slurm polled fast.
    assert sync.ledger.waited_jobs() == [] and sync.ledger.waiters(job_id) == []
    assert not sync.pending_in("bridge")


async def test_a_pod_leaving_an_allocated_group_before_any_binding_cancels_the_job() -> None:
    """Slurm can allocate a group's job before its pods are placed (inside the request,
    even): a pod that leaves then still cancels it, or no one ever would."""
    sync, slurm, kube, pods = gang_setup(2)
    job_id = await submitted_group(sync, slurm, pods)
    allocate(sync, slurm, job_id, "n[1-2]")
    pods.delete("ns/g-0")  # before the scheduler placed the group
    await sync.reconcile("ns/g-0")
    assert slurm.cancelled == [job_id]
    assert job_label(pods.get("ns/g-1")) is None  # waits for a whole group again
    assert kube.bound == {}


async def test_a_group_whose_pod_was_replaced_before_binding_binds_none_and_starts_over() -> None:
    """The owner replaced a pod (same name, new UID) between allocation and binding: no pod
    of the group is bound alone on the job made for the old one."""
    sync, slurm, kube, pods = gang_setup(2)
    job_id = await submitted_group(sync, slurm, pods)
    allocate(sync, slurm, job_id, "n[1-2]")
    again = group_pods(1)[0]
    again["metadata"]["uid"] = "u0-new"
    pods.upsert(again)
    await sync.reconcile("ns/g-1")
    assert kube.bound == {}
    assert slurm.cancelled == [job_id]
    assert job_label(pods.get("ns/g-1")) is None
    await sync.reconcile("ns/g-0")  # the new pod and g-1: a new job for the whole group
    await sync.reconcile("ns/g-1")
    assert len([j for j in slurm.jobs if j != job_id]) == 1


def another_groups_job(slurm: Any, job_id: int, config: Any, uids: tuple[str, str]) -> str:
    """slurmctld, killed and restarted from a state save older than the group's job, gave
    its id to another group's job (pods `h-0`, `h-1`), allocated n[1-2]; its admin_comment."""
    others = [make_pod(f"h-{i}", uid) for i, uid in enumerate(uids)]
    comment = placeholder.admin_comment(others, config)
    slurm.jobs[job_id] = {
        "job_id": job_id,
        "job_state": ["RUNNING"],
        "nodes": "n[1-2]",
        "admin_comment": comment,
    }
    return comment


async def test_a_group_whose_job_id_names_another_groups_job_is_never_bound_there() -> None:
    """The chaos soak's defect: after a slurmctld restart the group's job id named another
    group's job, and the bridge bound the group to that job's nodes. Now no pod is bound
    there, that job is not cancelled (not ours to kill), and the group gets a job of its
    own, as when Slurm lost its job."""
    sync, slurm, kube, pods = gang_setup(2)
    job_id = await submitted_group(sync, slurm, pods)
    await sync.reconcile("ns/g-1")  # both members placed: both wait on the job
    comment = another_groups_job(slurm, job_id, sync.config, ("v0", "v1"))
    sync.watch.jobs.pop(job_id)  # as the watch would, on the change
    for key in ("ns/g-0", "ns/g-1"):
        await sync.reconcile(key)
    assert kube.bound == {}, "bound to the nodes of a job that is not the group's"
    assert slurm.cancelled == [], "cancelled a job that is not ours"
    assert slurm.jobs[job_id]["admin_comment"] == comment
    new = [j for j in slurm.jobs if j != job_id]
    labels = [job_label(pods.get(f"ns/g-{i}")) for i in range(2)]
    assert len(new) == 1, "the group got no job of its own"
    assert labels == [str(new[0])] * 2


async def test_a_group_whose_job_slurm_lost_before_binding_gets_a_new_one() -> None:
    """slurmctld restarted from a state save older than the group's job: Slurm no longer
    knows it, so the group (never started) gets another job, as a single pod does."""
    sync, slurm, kube, pods = gang_setup(2)
    job_id = await submitted_group(sync, slurm, pods)
    del slurm.jobs[job_id]
    sync.watch.jobs.pop(job_id)
    for _ in range(2):
        for key in ("ns/g-0", "ns/g-1"):
            await sync.reconcile(key)
    (new,) = slurm.jobs
    assert new != job_id
    assert [job_label(pods.get(f"ns/g-{i}")) for i in range(2)] == [str(new)] * 2
    assert kube.bound == {} and slurm.cancelled == []


async def test_a_pod_leaving_a_group_leaves_alone_a_job_that_took_its_jobs_id() -> None:
    """A pod of a pending group leaves after slurmctld gave the group's job id to a job of
    another bridge whose pods have the same names (another Kubernetes cluster on the same
    Slurm): that job is not ours to cancel."""
    sync, slurm, _kube, pods = gang_setup(2)
    job_id = await submitted_group(sync, slurm, pods)
    await sync.reconcile("ns/g-1")
    elsewhere = parse_config({"schedulerName": "s1", "clusterId": "another-cluster"})
    others = [make_pod(f"g-{i}", f"x{i}") for i in range(2)]
    slurm.jobs[job_id]["admin_comment"] = placeholder.admin_comment(others, elsewhere)
    sync.watch.jobs.pop(job_id)
    pods.delete("ns/g-0")
    await sync.reconcile("ns/g-0")
    assert slurm.cancelled == [], "cancelled a job that is not ours"


async def test_a_terminating_member_at_bind_time_binds_none_of_the_group() -> None:
    """A member being deleted (deletionTimestamp set, still in the cache) when the job is
    allocated can never take its node: binding the others would run the gang incomplete."""
    sync, slurm, kube, pods = gang_setup(2)
    job_id = await submitted_group(sync, slurm, pods)
    allocate(sync, slurm, job_id, "n[1-2]")
    leaving = pods.get("ns/g-0")
    assert leaving is not None
    leaving["metadata"]["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    pods.upsert(leaving)
    await sync.reconcile("ns/g-1")
    assert kube.bound == {}
    assert slurm.cancelled == [job_id]
    assert job_label(pods.get("ns/g-1")) is None  # waits for a whole group again


async def test_a_member_leaving_while_the_others_are_bound_waits_for_the_binding() -> None:
    """`left` takes the group's lock: a member leaving while `place` binds the group
    finds the job started and leaves it to the workload controller, instead of cancelling
    it under pods that are being bound."""
    sync, slurm, kube, pods = gang_setup(2)
    job_id = await submitted_group(sync, slurm, pods)
    allocate(sync, slurm, job_id, "n[1-2]")
    entered, release = asyncio.Event(), asyncio.Event()
    real_bind = kube.request

    async def slow_bind(*args: Any, **kwargs: Any) -> JSON:
        entered.set()
        await release.wait()
        return await real_bind(*args, **kwargs)

    kube.request = slow_bind  # type: ignore[method-assign]
    placing = asyncio.create_task(sync.reconcile("ns/g-1"))
    await entered.wait()  # the first binding is in flight
    gone = pods.get("ns/g-0")
    assert gone is not None
    gone = {**gone, "metadata": {**gone["metadata"], "deletionTimestamp": "2026-11-26T00:00:00Z"}}
    pods.upsert(gone)
    leaving = asyncio.create_task(sync.reconcile("ns/g-0"))
    await asyncio.sleep(0.05)
    assert slurm.cancelled == []  # not while the binding holds the group
    release.set()
    await placing
    await leaving
    assert slurm.cancelled == []
    assert kube.bound == {"ns/g-0": "n1", "ns/g-1": "n2"}


async def test_a_cancel_that_fails_when_a_group_is_abandoned_is_retried() -> None:
    """The waiting pods lose the job's label first, so no pod leads back to the job: a
    failed cancel is owed by the scheduler and retried, not lost."""
    sync, slurm, _kube, pods = gang_setup(2)
    job_id = await submitted_group(sync, slurm, pods)
    slurm.refuse_cancel = True
    pods.delete("ns/g-0")
    await sync.reconcile("ns/g-0")
    assert job_label(pods.get("ns/g-1")) is None and [j for j, _ in sync.ledger.owed()] == [job_id]
    slurm.refuse_cancel = False
    sync._cancel_tried = 0.0
    await sync.reconcile("ns/g-1")
    assert slurm.cancelled == [job_id]


def test_a_group_whose_pods_would_run_as_different_users_is_refused() -> None:
    config = parse_config(
        {
            "partition": "bridge",
            "schedulerName": "s1",
            "policy": {"namespaces": {"ns": {"users": ["alice", "2001"], "groups": ["a"]}}},
        }
    )
    pods = group_pods(2)
    pods[0]["metadata"].setdefault("annotations", {})[SLURMJOB_PREFIX + "user-id"] = "2001"
    group = Group("PodGroup/ns/g", "PodGroup", 2, {"metadata": {"name": "g"}}, "ns/g")
    with pytest.raises(placeholder.PlaceholderProblem) as e:
        groups.job_description(pods, group, config)
    assert e.value.reason == "PolicyDenied" and "different Slurm users" in e.value.message


# ---------------------------------------------------------------- the workload controller


def workload_setup(comment_pods: list[JSON]) -> Any:
    slurm = FakeSlurm()
    pods = Store({BY_JOB: index_job})
    job_id = 7
    slurm.jobs[job_id] = {
        "job_id": job_id,
        "job_state": ["RUNNING"],
        "nodes": "n[1-2]",
        "admin_comment": placeholder.admin_comment(comment_pods, CONFIG),
    }
    for p in comment_pods:
        # The job-id label and the finalizer come in one patch (podcontrol.mark_submitted).
        p["metadata"]["labels"][SLURM_JOBID] = str(job_id)
        p["metadata"]["finalizers"] = [FINALIZER]
        p["spec"]["nodeName"] = "n1"
        pods.upsert(p)
    kube = DeletingKube(pods)
    sync = WorkloadSync(
        kube,  # type: ignore[arg-type]
        config=CONFIG,
        pods=SimpleNamespace(store=pods),  # type: ignore[arg-type]
        slurm=SimpleNamespace(  # type: ignore[arg-type]
            client=slurm,
            informer=SimpleNamespace(poke=lambda: None),
            slurmctld=SlurmctldStart(slurm),  # type: ignore[arg-type]
        ),
        watch=JobWatch(slurm, on_change=lambda _: None),  # type: ignore[arg-type]
        recorder=SimpleNamespace(event=lambda *a, **k: None),  # type: ignore[arg-type]
    )
    return sync, slurm, kube, pods, job_id


class DeletingKube(FakeKube):
    def __init__(self, pods: Store) -> None:
        super().__init__(pods)
        self.deleted: list[str] = []

    async def get(self, _res: Any, name: str, ns: str | None = None) -> JSON:
        pod = self.pods.get(f"{ns}/{name}")
        if pod is None:
            raise rest.ApiError(404, "NotFound", name)
        return pod

    async def delete(self, _res: Any, name: str, ns: str, **_kw: Any) -> JSON:
        self.deleted.append(f"{ns}/{name}")
        return {}


async def test_a_failed_pod_of_a_group_ends_the_job_and_a_succeeded_one_does_not() -> None:
    sync, slurm, _kube, pods, job_id = workload_setup(group_pods(2))
    pods.get("ns/g-0")["status"]["phase"] = "Succeeded"  # type: ignore[index]
    await sync.reconcile("ns/g-0")
    assert slurm.cancelled == []  # g-1 still runs: the job is its too
    pods.get("ns/g-1")["status"]["phase"] = "Failed"  # type: ignore[index]
    await sync.reconcile("ns/g-1")
    assert slurm.cancelled == [job_id]

    sync, slurm, _kube, pods, job_id = workload_setup(group_pods(2))
    pods.get("ns/g-0")["status"]["phase"] = "Failed"  # type: ignore[index]
    await sync.reconcile("ns/g-0")
    assert slurm.cancelled == [job_id]  # g-1 runs, yet the gang is over


async def test_an_unbound_group_pod_set_free_of_a_cancelled_job_is_not_deleted() -> None:
    sync, slurm, kube, pods, job_id = workload_setup(group_pods(2))
    slurm.jobs[job_id]["job_state"] = ["CANCELLED"]
    cached = pods.get("ns/g-0")
    assert cached is not None
    cached["spec"]["nodeName"] = ""
    # The live pod lost its label (the scheduler freed it) while the cache still shows it.
    live = {**cached, "metadata": {**cached["metadata"], "labels": {}}}

    async def get(_res: object, name: str, _ns: str) -> JSON:
        return live if name == "g-0" else pods.get(f"ns/{name}")

    kube.get = get  # type: ignore[method-assign]
    await sync.reconcile("ns/g-0")
    assert kube.deleted == []
    await sync.reconcile("ns/g-1")  # bound: deleted with its job
    assert kube.deleted == ["ns/g-1"]


async def test_a_restart_after_the_group_job_was_submitted_finds_it_and_makes_no_other() -> None:
    """The scheduler stopped after Slurm took the group's job, before any label: started
    again, it finds the job by its admin_comment and places both pods through it."""
    sync, slurm, kube, pods = gang_setup(2)
    members = group_pods(2)
    for p in members:
        pods.upsert(p)
    root = await GroupResolver(kube).resolve(members[0])  # type: ignore[arg-type]
    assert root is not None
    job_id = await slurm.submit_job(groups.job_description(members, root, CONFIG))
    assert await sync.recover() == 2
    slurm.allocate(job_id, "n[1-2]")
    for p in members:
        await sync.reconcile(f"ns/{p['metadata']['name']}")
    assert list(slurm.jobs) == [job_id]
    assert kube.bound == {"ns/g-0": "n1", "ns/g-1": "n2"}


async def test_a_pod_says_it_waits_for_its_group_only_after_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pods of a group mostly come together: a status write per waiting pod, each made
    under the group's lock, held the last pod's job back (a gang of 8 took 736 ms)."""
    sync, _slurm, _kube, pods = gang_setup(2)
    said: list[str] = []

    async def set_unschedulable(_kube: Any, pod: JSON, reason: str, _message: str) -> bool:
        said.append(f"{pod['metadata']['name']}:{reason}")
        return True

    monkeypatch.setattr(gang.podcontrol, "set_unschedulable", set_unschedulable)
    pods.upsert(group_pods(2)[0])
    result = await sync.reconcile("ns/g-0")
    assert said == [] and 0 < (result.requeue_after or 0) <= gang.WAIT_REPORT_S
    sync.gangs.waiting_since["ns/g-0"] -= gang.WAIT_REPORT_S  # it has waited that long
    await sync.reconcile("ns/g-0")
    assert said == ["g-0:WaitingForGroup"]


class LaggingKube(GroupKube):
    """Writes that the pod informer has not shown yet: a patch answers the patched pod but
    leaves the store as it was; every request is counted."""

    def __init__(self, pods: Store, min_member: int) -> None:
        super().__init__(pods, min_member)
        self.patched: list[str] = []

    async def patch(self, res: Any, name: str, body: Any, ns: str, **kw: Any) -> JSON:
        self.patched.append(name)
        before = copy.deepcopy(self.pods.get(f"{ns}/{name}"))
        answer = await super().patch(res, name, body, ns, **kw)
        if before is not None:
            self.pods.upsert(before)
        return answer


async def test_a_group_allocated_at_once_labels_each_pod_once_then_binds_it() -> None:
    """The pods' labels were sent again, once for the pod reconciled and once more for every
    member before its binding, when the informer had not shown the first ones yet: three
    rounds of requests to the apiserver instead of two (a gang of 8 took 132 ms against a
    single pod's 36)."""
    sync, slurm, _kube, pods = gang_setup(2)
    kube = LaggingKube(pods, 2)
    sync.kube = kube  # type: ignore[assignment]
    sync.gangs.resolver = GroupResolver(kube)  # type: ignore[arg-type]
    idle(sync, "n1", "n2")
    slurm.free_node = "n[1-2]"
    for p in group_pods(2):
        pods.upsert(p)
        await sync.reconcile(f"ns/{p['metadata']['name']}")
    assert kube.bound == {"ns/g-0": "n1", "ns/g-1": "n2"}
    assert sorted(kube.patched) == ["g-0", "g-1"]  # one label each
    # The label's event before the binding's: nothing more to do for the bound pod (one
    # job: `(job_id,)` below).
    lagging = copy.deepcopy(pods.get("ns/g-0"))
    assert lagging is not None
    lagging["spec"].pop("nodeName")
    (job_id,) = slurm.jobs
    lagging["metadata"]["labels"][SLURM_JOBID] = str(job_id)  # the label's event
    pods.upsert(lagging)
    reads = sync.watch.reads
    kube.bound.clear()
    await sync.reconcile("ns/g-0")
    assert sync.watch.reads == reads and kube.bound == {} and len(kube.patched) == 2


async def test_a_group_allocated_at_once_is_bound_with_its_job_id_then_labelled() -> None:
    """The round of N label writes before the bindings is gone: each member's Binding carries
    the job id, and its label and finalizer follow its binding."""
    sync, slurm, kube, pods = gang_setup(2)
    idle(sync, "n1", "n2")
    slurm.free_node = "n[1-2]"
    for p in group_pods(2):
        pods.upsert(p)
        await sync.reconcile(f"ns/{p['metadata']['name']}")
    (job_id,) = slurm.jobs
    assert kube.bound == {"ns/g-0": "n1", "ns/g-1": "n2"}
    assert kube.writes[0].startswith("bind ")
    for name in ("g-0", "g-1"):
        assert kube.writes.index(f"bind ns/{name}") < kube.writes.index(f"label ns/{name}")
        pod = pods.get(f"ns/{name}")
        assert pod is not None and pod["metadata"]["labels"][SLURM_JOBID] == str(job_id)
        assert pod["metadata"]["annotations"][SLURM_JOBID_ANNOTATION] == str(job_id)
        assert FINALIZER in pod["metadata"]["finalizers"]


async def test_a_member_whose_binding_failed_is_looked_at_again() -> None:
    """Allocated at once, bound before labelled: a member whose binding failed has no label
    whose event would bring it back; the pass that failed queues it."""
    sync, slurm, kube, pods = gang_setup(2)
    idle(sync, "n1", "n2")
    slurm.free_node = "n[1-2]"
    real_request = kube.request

    async def refuse_g1(method: str, path: str, *, body: JSON) -> JSON:
        if body["metadata"]["name"] == "g-1":
            raise rest.ApiError(500, "InternalError", "etcd")
        return await real_request(method, path, body=body)

    kube.request = refuse_g1  # type: ignore[method-assign]
    queued: list[str] = []
    sync.gangs.enqueue = queued.append
    for p in group_pods(2):
        pods.upsert(p)
        with contextlib.suppress(rest.ApiError):
            await sync.reconcile(f"ns/{p['metadata']['name']}")
    assert kube.bound == {"ns/g-0": "n1"} and "ns/g-1" in queued
    kube.request = real_request  # type: ignore[method-assign]
    await sync.reconcile("ns/g-1")
    assert kube.bound == {"ns/g-0": "n1", "ns/g-1": "n2"} and len(slurm.jobs) == 1


async def test_the_pods_of_a_group_arriving_together_read_their_owner_once() -> None:
    class Slow(Owners):
        async def get(self, res: rest.Resource, name: str, ns: str | None = None) -> JSON:
            await asyncio.sleep(0.01)
            return await super().get(res, name, ns)

    kube = Slow({("jobs", "j"): job("j", "ju", gang="true", parallelism=8, completions=8)})
    resolver = GroupResolver(kube)  # type: ignore[arg-type]
    pods = [owned(make_pod(f"p{i}", f"u{i}"), "Job", "j", "ju", "batch/v1") for i in range(8)]
    found = await asyncio.gather(*(resolver.resolve(p) for p in pods))
    assert kube.gets == ["/apis/batch/v1/namespaces/ns/jobs/j"]
    assert all(g is not None and g.size == 8 for g in found)


async def test_a_failed_read_of_an_owner_is_not_taken_as_the_answer_by_those_waiting() -> None:
    class FailsOnce(Owners):
        failed = False

        async def get(self, res: rest.Resource, name: str, ns: str | None = None) -> JSON:
            await asyncio.sleep(0.01)
            if not self.failed:
                self.failed = True
                raise rest.ApiError(500, "InternalError", "etcd")
            return await super().get(res, name, ns)

    kube = FailsOnce({("jobs", "j"): job("j", "ju", gang="true", parallelism=2, completions=2)})
    resolver = GroupResolver(kube)  # type: ignore[arg-type]
    pods = [owned(make_pod(f"p{i}", f"u{i}"), "Job", "j", "ju", "batch/v1") for i in range(2)]
    first, second = await asyncio.gather(
        *(resolver.resolve(p) for p in pods), return_exceptions=True
    )
    assert isinstance(first, rest.ApiError)
    assert isinstance(second, Group) and second.size == 2  # read again, itself


async def test_a_group_slurm_refuses_is_asked_again_only_after_its_backoff() -> None:
    """Slurm refused a gang's job ("Invalid account"): each reconcile of a member (the status
    write on the others brings them back at once) asked again at once, thousands of times,
    until the backoff's 2**n overflowed (found by trying make dev before its policy)."""
    sync, slurm, kube, pods = gang_setup(2)
    asked = 0
    said: dict[str, str] = {}
    patch = kube.patch

    async def record(res: Any, name: str, body: Any, ns: str, **kw: Any) -> Any:
        if kw.get("subresource") == "status":
            said[name] = body["status"]["conditions"][0]["message"]
            return {}
        return await patch(res, name, body, ns, **kw)

    kube.patch = record

    async def refuse(_desc: JSON) -> int:
        nonlocal asked
        asked += 1
        raise errors.SlurmError("Invalid account or account/partition combination specified")

    slurm.submit_job = refuse
    for p in group_pods(2):
        pods.upsert(p)
    results = [await sync.reconcile(f"ns/g-{i % 2}") for i in range(50)]
    assert asked == 1
    assert all(r.requeue_after and r.requeue_after > 0 for r in results[1:])
    # Both members say the same thing (two wordings made each write bring the other back).
    assert set(said) == {"g-0", "g-1"} and len(set(said.values())) == 1
    # Long refused: the backoff stays at its maximum, never overflows.
    sync.rejections["u0"] = 5000
    for uid in ("u0", "u1"):
        sync.not_before.pop(uid, None)
    result = await sync.reconcile("ns/g-0")
    assert asked == 2 and result.requeue_after == sched_sync.REJECT_BACKOFF_MAX_S
