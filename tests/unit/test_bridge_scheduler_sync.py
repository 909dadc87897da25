"""The scheduler's steps against fakes of the apiserver and slurmrestd: never a second job
for a pod, never a job no one can find, and a pod bound only where Slurm put its job."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from types import SimpleNamespace
from typing import Any

import pytest

from slinky.bridge import placeholder, podcontrol
from slinky.bridge.config import parse_config
from slinky.bridge.jobwatch import JobWatch
from slinky.bridge.labels import (
    FINALIZER,
    REPLACED_JOB,
    SLURM_JOBID,
    SLURM_JOBID_ANNOTATION,
    SLURM_NODE,
    SLURMJOB_PREFIX,
)
from slinky.bridge.nodes.controller import BY_SLURM_NAME, index_slurm_name
from slinky.bridge.scheduler import exclusion
from slinky.bridge.scheduler.ledger import Ledger
from slinky.bridge.scheduler.sync import SchedulerSync
from slinky.kube import rest
from slinky.kube.store import Store
from slinky.slurm import errors
from slinky.slurm.models import Job, Node

JSON = dict[str, Any]
CONFIG = parse_config({"partition": "bridge", "schedulerName": "s1", "managedNamespaces": ["ns"]})


class FakeSlurm:
    """A slurmrestd that keeps jobs by id; `down` makes submissions fail unanswered (the
    job is still made: the request reached slurmctld, the answer was lost)."""

    def __init__(self) -> None:
        self.jobs: dict[int, JSON] = {}
        self.cancelled: list[int] = []
        self.lists = 0
        self.down = False
        self.refuse_cancel = False
        self.updates: list[tuple[int, JSON]] = []
        self.allocations = 0
        self.free_node: str | None = None
        self.allocate_missing = False
        self.last_id = 99
        self.tokens = SimpleNamespace(user="slurm")  # the bridge's own
        self.allocated_as: list[str] = []
        self.refuse_update = False
        self.unknown_users: set[str] = set()
        self.allocate_answer_lost = False
        self.started = 1_000  # slurmctld's start, as `diag` tells it (req_time_start)
        self.diags = 0

    async def diag(self) -> JSON:
        self.diags += 1
        return {"req_time_start": {"set": True, "number": self.started}}

    def new_id(self) -> int:
        """Slurm never gives an id twice, also after a job was purged."""
        self.last_id = max([self.last_id, *self.jobs]) + 1
        return self.last_id

    def job(self, job_id: int) -> Job:
        return Job.parse(self.jobs[job_id])

    async def submit_job(self, desc: JSON) -> int:
        job_id = self.new_id()
        self.jobs[job_id] = {**desc, "job_id": job_id, "job_state": ["PENDING"], "nodes": ""}
        if self.down:
            raise errors.SlurmUnavailable("connection reset")
        return job_id

    async def allocate_job(self, desc: JSON, *, tokens: Any = None) -> int:
        """`job/allocate` with immediate: allocated on `free_node`, else refused as busy (a
        FAILED record stays, as in Slurm); `allocate_missing`: an older slurmrestd. The job
        is the asking user's (`tokens`' user, else the bridge's)."""
        self.allocations += 1
        self.allocated_as.append((tokens or self.tokens).user)
        if self.allocate_missing:
            raise errors.SlurmEndpointMissing("HTTP 404", status=404)
        if (tokens or self.tokens).user in self.unknown_users:
            raise errors.SlurmAuthError("HTTP 401: user unknown to slurmctld")
        job_id = self.new_id()
        if self.free_node is None:
            self.jobs[job_id] = {**desc, "job_id": job_id, "job_state": ["FAILED"], "nodes": ""}
            raise errors.SlurmNodeBusy("Requested nodes are busy")
        self.jobs[job_id] = {
            **desc,
            "job_id": job_id,
            "job_state": ["RUNNING"],
            "nodes": self.free_node,
        }
        if self.allocate_answer_lost:
            raise errors.SlurmUnavailable("connection reset")
        return job_id

    async def get_job(self, job_id: int) -> Job:
        if job_id not in self.jobs:
            raise errors.SlurmNotFound(f"job {job_id}")
        return self.job(job_id)

    async def list_jobs(self) -> tuple[list[Job], int]:
        self.lists += 1
        return [self.job(j) for j in self.jobs], 0

    async def cancel_job(self, job_id: int) -> None:
        if self.refuse_cancel:
            raise errors.SlurmUnavailable("connection reset")
        self.cancelled.append(job_id)
        self.jobs[job_id]["job_state"] = ["CANCELLED"]

    async def update_job(self, job_id: int, changes: JSON) -> None:
        if self.refuse_update:
            raise errors.SlurmUnavailable("connection reset")
        self.updates.append((job_id, changes))
        self.jobs[job_id].update(changes)

    def allocate(self, job_id: int, node: str) -> None:
        self.jobs[job_id].update(job_state=["RUNNING"], nodes=node)


class FakeKube:
    """Pod writes land in the pod store, as the informer would show them."""

    def __init__(self, pods: Store) -> None:
        self.pods = pods
        self.bound: dict[str, str] = {}
        self.writes: list[str] = []  # "label ns/p", "bind ns/p", in order

    def _pod(self, name: str, ns: str, uid: str | None) -> JSON:
        pod = self.pods.get(f"{ns}/{name}")
        if pod is None:
            raise rest.ApiError(404, "NotFound", f"pod {name}")
        if uid is not None and pod["metadata"]["uid"] != uid:
            raise rest.ApiError(409, "Conflict", "uid precondition")
        return pod

    async def patch(self, _res: Any, name: str, body: Any, ns: str, **kw: Any) -> JSON:
        if kw.get("kind") == "json":  # only the finalizer's removal is sent as a JSON patch
            pod = self._pod(name, ns, None)
            for op in body:
                if op["op"] == "remove":
                    del pod["metadata"]["finalizers"][int(op["path"].rsplit("/", 1)[1])]
            return copy.deepcopy(pod)
        pod = self._pod(name, ns, body.get("metadata", {}).get("uid"))
        meta = body.get("metadata") or {}
        if meta.get("labels"):
            self.writes.append(f"label {ns}/{name}")
        pod["metadata"].setdefault("labels", {}).update(meta.get("labels") or {})
        pod["metadata"].setdefault("annotations", {}).update(meta.get("annotations") or {})
        for f in meta.get("finalizers") or []:  # strategic merge: appended once
            if f not in pod["metadata"].setdefault("finalizers", []):
                pod["metadata"]["finalizers"].append(f)
        return copy.deepcopy(pod)

    async def request(self, _method: str, _path: str, *, body: JSON) -> JSON:
        meta = body["metadata"]
        pod = self._pod(meta["name"], meta["namespace"], meta["uid"])
        pod["spec"]["nodeName"] = body["target"]["name"]
        pod["metadata"].setdefault("annotations", {}).update(meta.get("annotations") or {})
        self.bound[f"{meta['namespace']}/{meta['name']}"] = body["target"]["name"]
        self.writes.append(f"bind {meta['namespace']}/{meta['name']}")
        return {}


def make_pod(name: str, uid: str) -> JSON:
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": uid, "labels": {}},
        "spec": {"schedulerName": "s1", "containers": [{"name": "c"}]},
        "status": {"phase": "Pending"},
    }


def setup() -> tuple[SchedulerSync, FakeSlurm, FakeKube, Store]:
    slurm = FakeSlurm()
    pods = Store()
    nodes = Store({BY_SLURM_NAME: index_slurm_name})
    for n in ("n1", "n2"):
        nodes.upsert({"metadata": {"name": n, "labels": {}}, "spec": {}})
    kube = FakeKube(pods)
    informer = SimpleNamespace(
        nodes={n: Node.parse({"name": n, "partitions": ["bridge"]}) for n in ("n1", "n2")},
        mark=lambda: 0,
        shows_since=lambda _mark: False,  # no poll comes: claims stay
        demand=lambda _key, _wanted: None,
    )
    sync = SchedulerSync(
        kube,  # type: ignore[arg-type]
        config=CONFIG,
        pods=SimpleNamespace(store=pods),  # type: ignore[arg-type]
        nodes=SimpleNamespace(store=nodes),  # type: ignore[arg-type]
        # The bridge may act as any Slurm user, as it does with the JWT key.
        slurm=SimpleNamespace(  # type: ignore[arg-type]
            client=slurm, informer=informer, tokens_for=lambda user: SimpleNamespace(user=user)
        ),
        watch=JobWatch(slurm, on_change=lambda _: None),  # type: ignore[arg-type]
        recorder=SimpleNamespace(event=lambda *a, **k: None),  # type: ignore[arg-type]
    )
    return sync, slurm, kube, pods


def job_label(pod: JSON | None) -> str | None:
    assert pod is not None
    return (pod["metadata"].get("labels") or {}).get(SLURM_JOBID)


async def test_a_pod_is_bound_to_the_node_slurm_allocated_and_only_then() -> None:
    sync, slurm, kube, pods = setup()
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    assert job_label(pods.get("ns/p")) == str(job_id)
    assert kube.bound == {}  # pending: not bound anywhere
    slurm.allocate(job_id, "n2")
    sync.watch.jobs.pop(job_id)  # as the watch would, on the change
    await sync.reconcile("ns/p")
    assert kube.bound == {"ns/p": "n2"}
    assert list(slurm.jobs) == [job_id]
    # The binding carried the Slurm node annotation: no request of its own.
    assert pods.get("ns/p")["metadata"]["annotations"][SLURM_NODE] == "n2"  # type: ignore[index]


async def test_a_pod_outside_the_managed_namespaces_gets_nothing_submitted() -> None:
    """Naming the bridge's scheduler does not make a namespace the bridge's."""
    sync, slurm, _kube, pods = setup()
    pod = make_pod("p", "u1")
    pod["metadata"]["namespace"] = "elsewhere"
    pods.upsert(pod)
    said: list[str] = []
    sync.recorder = SimpleNamespace(event=lambda _o, _t, reason, *_a, **_k: said.append(reason))  # type: ignore[assignment]
    await sync.reconcile("elsewhere/p")
    assert slurm.jobs == {} and slurm.allocations == 0
    assert said == ["NamespaceNotManaged"]


async def test_a_pod_whose_job_slurm_lost_before_it_was_bound_gets_a_new_one() -> None:
    """slurmctld crashed after taking the job and before saving it: Slurm answers that the
    job does not exist, so the pod (never started) is submitted again, not deleted."""
    sync, slurm, kube, pods = setup()
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    (lost,) = slurm.jobs
    del slurm.jobs[lost]
    sync.watch.jobs.pop(lost, None)
    await sync.reconcile("ns/p")
    assert job_label(pods.get("ns/p")) is None  # the label goes: the pod comes back
    await sync.reconcile("ns/p")
    (new,) = slurm.jobs
    assert new != lost and job_label(pods.get("ns/p")) == str(new)
    assert kube.bound == {}


def reused(slurm: FakeSlurm, job_id: int, admin_comment: str, nodes: str = "n2") -> None:
    """slurmctld, killed and restarted from a state save older than job `job_id`, gave its
    id to another job, allocated `nodes`, whose admin_comment is `admin_comment`."""
    slurm.jobs[job_id] = {
        "job_id": job_id,
        "job_state": ["RUNNING"],
        "nodes": nodes,
        "admin_comment": admin_comment,
    }


OTHER_BRIDGE = parse_config({"schedulerName": "s1", "clusterId": "another-cluster"})
# What a job that took the id of pod ns/p's (UID u1) job may say in its admin_comment.
FOREIGN_COMMENTS = {
    "another-pod": placeholder.admin_comment([make_pod("q", "u9")], CONFIG),
    "same-name-other-uid": placeholder.admin_comment([make_pod("p", "u0")], CONFIG),
    "another-scheduler": placeholder.admin_comment(
        [make_pod("p", "u1")], parse_config({"schedulerName": "s2"})
    ),
    "another-cluster": placeholder.admin_comment([make_pod("p", "u1")], OTHER_BRIDGE),
    "not-a-bridge-job": "",
}


@pytest.mark.parametrize("comment", FOREIGN_COMMENTS.values(), ids=FOREIGN_COMMENTS.keys())
async def test_a_job_that_took_the_pods_job_id_after_a_slurmctld_restart_is_not_its_job(
    comment: str,
) -> None:
    """A job id alone is not identity: the job now behind the pod's label is someone
    else's. The pod is not bound to its node, it is not cancelled (not ours to kill), and
    the pod gets a new job, as when Slurm lost its own."""
    sync, slurm, kube, pods = setup()
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    reused(slurm, job_id, comment)
    sync.watch.jobs.pop(job_id)  # as the watch would, on the change
    await sync.reconcile("ns/p")
    assert kube.bound == {}, "bound to the node of a job that is not the pod's"
    assert job_label(pods.get("ns/p")) is None, "the pod still waits on a job not its own"
    await sync.reconcile("ns/p")
    new = max(slurm.jobs)
    assert new != job_id and job_label(pods.get("ns/p")) == str(new)
    assert slurm.cancelled == [], "cancelled a job that is not ours"
    assert slurm.jobs[job_id]["admin_comment"] == comment
    assert [u for u in slurm.updates if u[0] == job_id] == []


async def test_a_job_recorded_for_an_earlier_pod_of_the_same_name_is_never_bound() -> None:
    sync, slurm, kube, pods = setup()
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    slurm.allocate(job_id, "n1")
    again = make_pod("p", "u2")  # deleted and created anew, with the old pod's label
    again["metadata"]["labels"][SLURM_JOBID] = str(job_id)
    pods.upsert(again)
    sync.watch.jobs.pop(job_id)
    await sync.reconcile("ns/p")
    assert kube.bound == {}


async def test_a_pod_recreated_before_its_label_gets_a_new_job_the_old_one_cancelled() -> None:
    sync, slurm, kube, pods = setup()
    pods.upsert(make_pod("p", "u1"))
    sync.kube = SimpleNamespace(patch=_vanish(pods), request=kube.request)  # type: ignore[assignment]
    with contextlib.suppress(rest.ApiError):  # submitted; the label write finds a new pod
        await sync.reconcile("ns/p")
    (first,) = slurm.jobs
    sync.kube = kube  # type: ignore[assignment]
    await sync.reconcile("ns/p")
    second = max(slurm.jobs)
    assert second != first
    assert slurm.cancelled == [first]
    assert job_label(pods.get("ns/p")) == str(second)


def _vanish(pods: Store) -> Any:
    """A patch that finds the pod replaced by a new one of the same name (409 on its UID)."""

    async def patch(*_a: Any, **_k: Any) -> None:
        pods.upsert(make_pod("p", "u2"))
        raise rest.ApiError(409, "Conflict", "uid precondition")

    return patch


async def test_a_pod_deleted_before_its_label_has_its_job_cancelled_after_a_failed_cancel() -> None:
    sync, slurm, _kube, pods = setup()
    pods.upsert(make_pod("p", "u1"))
    sync.kube = SimpleNamespace(patch=_deleted(pods))  # type: ignore[assignment]
    with contextlib.suppress(rest.ApiError):
        await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    slurm.refuse_cancel = True
    with contextlib.suppress(errors.SlurmError):
        await sync.reconcile("ns/p")
    assert slurm.cancelled == []
    slurm.refuse_cancel = False
    await sync.reconcile("ns/p")  # the controller retries the key
    assert slurm.cancelled == [job_id]


async def test_a_pod_deleted_before_its_label_leaves_alone_a_job_that_took_its_jobs_id() -> None:
    """The job remembered for a pod that went away before its label names another pod now
    (slurmctld gave the id again after a restart): not ours to cancel."""
    sync, slurm, _kube, pods = setup()
    pods.upsert(make_pod("p", "u1"))
    sync.kube = SimpleNamespace(patch=_deleted(pods))  # type: ignore[assignment]
    with contextlib.suppress(rest.ApiError):
        await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    reused(slurm, job_id, FOREIGN_COMMENTS["another-pod"])
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [], "cancelled a job that is not ours"
    assert sync.ledger.unlabelled("ns/p") is None  # nothing left to retry


def _deleted(pods: Store) -> Any:
    async def patch(*_a: Any, **_k: Any) -> None:
        pods.delete("ns/p")
        raise rest.ApiError(404, "NotFound", "pod p")

    return patch


async def test_an_unanswered_submission_is_looked_for_before_another_and_once_for_all() -> None:
    sync, slurm, _kube, pods = setup()
    for name, uid in (("a", "ua"), ("b", "ub")):
        pods.upsert(make_pod(name, uid))
    slurm.down = True
    for key in ("ns/a", "ns/b"):
        with contextlib.suppress(errors.SlurmUnavailable):
            await sync.reconcile(key)
    assert len(slurm.jobs) == 2  # both reached Slurm; neither answer came back
    slurm.down = False
    for key in ("ns/a", "ns/b"):
        for _ in range(2):  # found, then labelled and placed
            await sync.reconcile(key)
    assert len(slurm.jobs) == 2  # no second job for either pod
    assert slurm.lists == 1  # one read of the job list answered for both
    assert {job_label(pods.get(k)) for k in ("ns/a", "ns/b")} == {str(j) for j in slurm.jobs}


async def test_a_pod_deleted_after_an_unanswered_submission_has_its_job_cancelled() -> None:
    sync, slurm, _kube, pods = setup()
    pods.upsert(make_pod("p", "u1"))
    slurm.down = True
    with contextlib.suppress(errors.SlurmUnavailable):
        await sync.reconcile("ns/p")
    slurm.down = False
    pods.delete("ns/p")
    await sync.reconcile("ns/p")
    assert slurm.cancelled == list(slurm.jobs)


def test_the_comment_of_a_submitted_job_names_the_pod_uid() -> None:
    comment = placeholder.admin_comment([make_pod("p", "u1")], CONFIG)
    assert placeholder.read_comment(comment) == placeholder.Comment("s1", {"ns/p": "u1"})


class FinalizerKube:
    """Applies JSON patches with their `test` to one live pod, as the apiserver does."""

    def __init__(self, live: JSON | None) -> None:
        self.live = live

    async def get(self, _res: Any, _name: str, _ns: str) -> JSON:
        if self.live is None:
            raise rest.ApiError(404, "NotFound", "pod p")
        return self.live

    async def patch(self, _res: Any, _name: str, ops: list[JSON], _ns: str, **_kw: Any) -> None:
        assert self.live is not None
        finalizers = self.live["metadata"]["finalizers"]
        test, remove = ops
        i = int(test["path"].rsplit("/", 1)[1])
        if i >= len(finalizers) or finalizers[i] != test["value"]:
            raise rest.ApiError(422, "Invalid", "test operation failed")
        del finalizers[int(remove["path"].rsplit("/", 1)[1])]


def with_finalizers(uid: str, *finalizers: str) -> JSON:
    pod = make_pod("p", uid)
    pod["metadata"]["finalizers"] = list(finalizers)
    return pod


async def test_the_finalizer_is_removed_from_the_live_pod_when_the_cache_is_behind() -> None:
    cached = with_finalizers("u1", FINALIZER)
    kube = FinalizerKube(with_finalizers("u1", "other/first", FINALIZER))
    await podcontrol.remove_finalizer(kube, cached)  # type: ignore[arg-type]
    assert kube.live is not None and kube.live["metadata"]["finalizers"] == ["other/first"]
    # Removed already (the cache has not seen it yet): nothing to do, no error.
    kube = FinalizerKube(with_finalizers("u1", "other/first"))
    await podcontrol.remove_finalizer(kube, cached)  # type: ignore[arg-type]
    # Another pod of the same name in its place: its finalizers are not ours to touch.
    kube = FinalizerKube(with_finalizers("u2", "other/first", FINALIZER))
    await podcontrol.remove_finalizer(kube, cached)  # type: ignore[arg-type]
    assert kube.live is not None and FINALIZER in kube.live["metadata"]["finalizers"]


def add_node(sync: SchedulerSync, name: str, labels: dict[str, str]) -> None:
    sync.nodes.store.upsert({"metadata": {"name": name, "labels": labels}, "spec": {}})
    sync.slurm.informer.nodes[name] = Node.parse({"name": name, "partitions": ["bridge"]})


def selective_pod() -> JSON:
    pod = make_pod("p", "u1")
    pod["spec"]["nodeSelector"] = {"pool": "a"}
    return pod


async def test_a_waiting_job_excludes_a_managed_node_added_after_its_submission() -> None:
    sync, slurm, _kube, pods = setup()
    for n in ("n1", "n2"):
        sync.nodes.store.upsert({"metadata": {"name": n, "labels": {"pool": "a"}}, "spec": {}})
    pods.upsert(selective_pod())
    await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    assert "excluded_nodes" not in slurm.jobs[job_id]
    add_node(sync, "n3", {"pool": "b"})  # the node controller registered a new node
    sync.watch.jobs.pop(job_id)
    await sync.reconcile("ns/p")  # brought back by the node event
    assert slurm.updates == [(job_id, {"excluded_nodes": ["n3"]})]
    sync.watch.jobs.pop(job_id)
    await sync.reconcile("ns/p")
    assert len(slurm.updates) == 1  # up to date: no second update


async def test_a_job_allocated_a_node_the_pod_rejects_is_replaced_never_bound_there() -> None:
    sync, slurm, kube, pods = setup()
    for n in ("n1", "n2"):
        sync.nodes.store.upsert({"metadata": {"name": n, "labels": {"pool": "a"}}, "spec": {}})
    pods.upsert(selective_pod())
    await sync.reconcile("ns/p")
    (first,) = slurm.jobs
    add_node(sync, "n3", {"pool": "b"})
    slurm.allocate(first, "n3")  # Slurm was faster than the excluded_nodes update
    sync.watch.jobs.pop(first)
    await sync.reconcile("ns/p")
    assert kube.bound == {}
    second = max(slurm.jobs)
    assert second != first and slurm.cancelled == [first]
    pod = pods.get("ns/p")
    assert pod is not None
    assert job_label(pod) == str(second)
    assert pod["metadata"]["annotations"][REPLACED_JOB] == str(first)
    assert slurm.jobs[second]["excluded_nodes"] == ["n3"]
    slurm.allocate(second, "n1")
    sync.watch.jobs.pop(second, None)
    await sync.reconcile("ns/p")
    assert kube.bound == {"ns/p": "n1"}
    assert len(slurm.jobs) == 2


async def test_allocated_at_once_on_a_rejected_node_the_pod_keeps_its_finalizer() -> None:
    """Allocated inside the request on a node the pod's selector rejects (the node changed
    after the claim): the pod is labelled with its finalizer before it is replaced, so the
    replacement job's pod, once bound and ended, still has its job cancelled."""
    sync, slurm, kube, pods = setup()
    sync.nodes.store.upsert({"metadata": {"name": "n1", "labels": {"pool": "a"}}, "spec": {}})
    add_node(sync, "n2", {"pool": "b"})
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"  # Slurm takes the one the exclusion had not caught up with
    pods.upsert(selective_pod())
    await sync.reconcile("ns/p")
    assert kube.bound == {} and len(slurm.jobs) == 2
    pod = pods.get("ns/p")
    assert pod is not None and FINALIZER in pod["metadata"]["finalizers"]


async def test_a_replacement_submitted_before_a_crash_is_found_not_made_again() -> None:
    sync, slurm, kube, pods = setup()
    for n in ("n1", "n2"):
        sync.nodes.store.upsert({"metadata": {"name": n, "labels": {"pool": "a"}}, "spec": {}})
    pods.upsert(selective_pod())
    await sync.reconcile("ns/p")
    (first,) = slurm.jobs
    add_node(sync, "n3", {"pool": "b"})
    slurm.allocate(first, "n3")
    sync.watch.jobs.pop(first)
    failing = SimpleNamespace(patch=_unavailable, request=kube.request)
    sync.kube = failing  # type: ignore[assignment]
    with contextlib.suppress(rest.ApiError):
        await sync.reconcile("ns/p")  # replacement submitted; the relabelling failed
    sync.ledger = Ledger()  # ... and the scheduler restarted
    sync.kube = kube  # type: ignore[assignment]
    await sync.reconcile("ns/p")
    assert len(slurm.jobs) == 2  # the replacement was found by its admin_comment
    assert job_label(pods.get("ns/p")) == str(max(slurm.jobs))
    assert slurm.cancelled == [first]


async def _unavailable(*_a: Any, **_k: Any) -> None:
    raise rest.ApiError(503, "ServiceUnavailable", "apiserver restarting")


def test_only_a_node_added_relabelled_or_retainted_brings_back_the_waiting_pods() -> None:
    node: JSON = {"metadata": {"name": "n", "labels": {"a": "1"}}, "spec": {}}
    heartbeat = copy.deepcopy(node) | {"status": {"conditions": [{"type": "Ready"}]}}
    relabelled = copy.deepcopy(node)
    relabelled["metadata"]["labels"]["a"] = "2"
    tainted = copy.deepcopy(node)
    tainted["spec"]["taints"] = [{"key": "k", "effect": "NoSchedule"}]
    assert exclusion.placement_relevant(None, node)
    assert not exclusion.placement_relevant(node, heartbeat)
    assert exclusion.placement_relevant(node, relabelled)
    assert exclusion.placement_relevant(node, tainted)


# ---------------------------------------------------------------- allocation at once


def idle(sync: SchedulerSync, *names: str) -> None:
    """The Slurm informer shows these nodes IDLE, nothing allocated."""
    for n in names:
        sync.slurm.informer.nodes[n] = Node.parse(
            {"name": n, "partitions": ["bridge"], "state": ["IDLE"], "cpus": 8, "real_memory": 4096}
        )


def live(slurm: FakeSlurm) -> list[int]:
    return [j for j in slurm.jobs if not slurm.job(j).is_finished]


async def test_a_pod_with_a_free_node_is_allocated_inside_the_request_and_bound_at_once() -> None:
    """Bound first, with one write fewer before the binding: the Binding carries the job id
    (the apiserver copies its annotations onto the pod), and the label and finalizer
    follow it."""
    sync, slurm, kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    assert slurm.allocations == 1
    assert kube.bound == {"ns/p": "n2"}  # one pass: no waiting for Slurm's next one
    assert kube.writes == ["bind ns/p", "label ns/p"]
    pod = pods.get("ns/p")
    assert pod is not None
    assert pod["metadata"]["annotations"][SLURM_JOBID_ANNOTATION] == str(job_id)
    assert job_label(pod) == str(job_id) and FINALIZER in pod["metadata"]["finalizers"]


async def test_a_pod_whose_job_waits_in_slurm_is_labelled_before_it_is_bound() -> None:
    sync, slurm, kube, pods = setup()
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    assert kube.writes == ["label ns/p"]
    slurm.allocate(job_id, "n2")
    sync.watch.jobs.pop(job_id)
    await sync.reconcile("ns/p")
    assert kube.writes == ["label ns/p", "bind ns/p"]
    pod = pods.get("ns/p")
    assert pod is not None and pod["metadata"]["annotations"][SLURM_JOBID_ANNOTATION] == str(job_id)


async def test_a_pod_allocated_at_once_that_cannot_be_bound_yet_is_labelled_first() -> None:
    """No Kubernetes node stands for the Slurm node yet: the pod waits, labelled (the job
    watch and the workload controller find it by the label)."""
    sync, slurm, kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    sync.nodes.store.delete("n2")  # type: ignore[attr-defined]
    pods.upsert(make_pod("p", "u1"))
    result = await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    assert kube.writes == ["label ns/p"] and kube.bound == {}
    assert job_label(pods.get("ns/p")) == str(job_id) and result.requeue_after


async def test_a_bound_pod_whose_label_could_not_be_written_keeps_its_job() -> None:
    """The label after the binding fails (the apiserver went): the pass does not fail, the
    pod's job id is on the pod through the Binding, and nothing cancels the job."""
    sync, slurm, kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    pods.upsert(make_pod("p", "u1"))
    real_patch = kube.patch

    async def refuse_labels(res: Any, name: str, body: Any, ns: str, **kw: Any) -> JSON:
        if (body.get("metadata") or {}).get("labels"):
            raise rest.ApiError(500, "InternalError", "etcd")
        return await real_patch(res, name, body, ns, **kw)

    kube.patch = refuse_labels  # type: ignore[method-assign]
    await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    pod = pods.get("ns/p")
    assert pod is not None and kube.bound == {"ns/p": "n2"} and job_label(pod) is None
    assert podcontrol.job_id_of(pod) == job_id
    await sync.reconcile("ns/p")  # its binding's event
    assert live(slurm) == [job_id]


def test_a_bound_pods_job_is_the_one_its_binding_named_whatever_label_was_written_before() -> None:
    pod = make_pod("p", "u1")
    pod["metadata"]["labels"][SLURM_JOBID] = "13"  # anyone may label a pod not yet bound
    assert podcontrol.job_id_of(pod) == 13 and podcontrol.is_labelled(pod)
    pod["spec"]["nodeName"] = "n1"
    pod["metadata"]["annotations"] = {SLURM_JOBID_ANNOTATION: "12"}
    assert podcontrol.job_id_of(pod) == 12
    assert not podcontrol.is_labelled(pod)  # the label names another job


async def test_a_pass_after_the_binding_that_the_informer_does_not_show_yet_does_nothing() -> None:
    """The label's own event brings a bound pod back before the informer shows it bound: that
    pass read the job again (not tracked any more) and sent a second binding (409). While
    the read was on its way, the pod's job counted as possibly pending: every pod deciding
    beside it was submitted instead of allocated (98 of 100 in a burst bench run)."""
    sync, slurm, kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    assert kube.bound == {"ns/p": "n2"}
    lagging = copy.deepcopy(pods.get("ns/p"))
    assert lagging is not None
    lagging["spec"].pop("nodeName")
    pods.upsert(lagging)  # the label's event, before the binding's
    reads, binds = sync.watch.reads, dict(kube.bound)
    kube.bound.clear()
    await sync.reconcile("ns/p")
    assert sync.watch.reads == reads and kube.bound == {}
    assert not sync.pending_in("bridge")
    pods.upsert(lagging | {"spec": {**lagging["spec"], "nodeName": binds["ns/p"]}})
    await sync.reconcile("ns/p")  # the binding's event: forgotten
    assert sync.just_bound == {}


async def test_an_allocation_is_asked_as_the_jobs_slurm_user_then_marked_as_ours() -> None:
    """Slurm allocates a job to whoever asks (a user_id in it is not honoured there), and
    only an administrator may set admin_comment: the bridge asks as the policy's user with
    its mark in `comment`, then writes admin_comment as administrator, then binds."""
    sync, slurm, kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    assert slurm.allocated_as == ["65534"]  # nobody: the default policy's user
    asked = slurm.jobs[job_id]
    assert "user_id" not in asked or asked["user_id"] is None
    mark = json.loads(asked["comment"])
    assert mark["uids"] == ["u1"]
    assert slurm.updates == [(job_id, {"admin_comment": asked["comment"]})]
    assert kube.bound == {"ns/p": "n2"}


class MarkAfterRead(FakeSlurm):
    """A slurmrestd whose admin_comment update is answered only once the job was read too:
    a bridge that reads the job only after its mark was written waits here in vain."""

    def __init__(self) -> None:
        super().__init__()
        self.read_seen = asyncio.Event()

    async def get_job(self, job_id: int) -> Job:
        self.read_seen.set()
        return Job.parse(copy.deepcopy((await super().get_job(job_id)).raw))  # as answered

    async def update_job(self, job_id: int, changes: JSON) -> None:
        try:
            await asyncio.wait_for(self.read_seen.wait(), 1.0)
        except TimeoutError:
            raise errors.SlurmUnavailable("the read never came") from None
        await super().update_job(job_id, changes)


async def test_an_allocation_is_read_while_it_is_marked_as_ours_and_kept_as_marked() -> None:
    """The mark and the read of a job allocated as its user were two round trips one after
    the other; they go together, and the job is kept as marked (place() trusts only a job
    whose admin_comment names the pod)."""
    sync, _slurm, kube, pods = setup()
    slurm = MarkAfterRead()
    sync.slurm.client = slurm  # type: ignore[misc]
    sync.watch = JobWatch(slurm, on_change=lambda _: None)  # type: ignore[arg-type]
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    # Bound: place() took the job, read before its mark landed, for the pod's.
    assert slurm.cancelled == [] and kube.bound == {"ns/p": "n2"}
    assert slurm.jobs[job_id]["admin_comment"] == slurm.jobs[job_id]["comment"]


async def test_an_allocation_that_cannot_be_marked_as_ours_is_cancelled_and_submitted() -> None:
    sync, slurm, kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    slurm.refuse_update = True
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    allocated, submitted = sorted(slurm.jobs)
    assert slurm.cancelled == [allocated]
    assert slurm.job(submitted).is_pending and slurm.jobs[submitted]["user_id"] == "65534"
    assert job_label(pods.get("ns/p")) == str(submitted) and kube.bound == {}


async def test_a_bridge_that_cannot_act_as_the_jobs_user_submits_it() -> None:
    """A stored token speaks for its own user only: no allocation as anyone else."""
    sync, slurm, _kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    sync.slurm.tokens_for = lambda _user: None  # type: ignore[method-assign]
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    assert slurm.allocations == 0
    assert (slurm.jobs[job_id]["user_id"], slurm.jobs[job_id]["group_id"]) == ("65534", "65534")


async def test_a_pod_that_picks_another_user_or_asks_a_priority_is_submitted() -> None:
    """An allocation runs in the asking user's primary group and cannot carry a priority:
    only the rule's first user and group match what a submission makes."""
    sync, slurm, _kube, pods = setup()
    sync.config = parse_config(
        {
            "partition": "bridge",
            "schedulerName": "s1",
            "managedNamespaces": ["ns"],
            "policy": {
                "default": {"users": ["1000", "1001"], "groups": ["1000"], "allowPriority": True}
            },
        }
    )
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    for name, key, value in (("p1", "user-id", "1001"), ("p2", "priority", "10")):
        pod = make_pod(name, f"u-{name}")
        pod["metadata"]["annotations"] = {SLURMJOB_PREFIX + key: value}
        pods.upsert(pod)
        await sync.reconcile(f"ns/{name}")
    assert slurm.allocations == 0
    assert sorted(j["user_id"] for j in slurm.jobs.values()) == ["1000", "1001"]


async def test_an_allocation_whose_answer_was_lost_is_cancelled_not_left_running() -> None:
    """slurmctld allocated the job as the pod's user, the answer never came back: the job
    carries the mark only in `comment`, so the look for the pod's job cancels it (nothing
    ran there) and the pod gets another job."""
    sync, slurm, _kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    slurm.allocate_answer_lost = True
    pods.upsert(make_pod("p", "u1"))
    with contextlib.suppress(errors.SlurmUnavailable):
        await sync.reconcile("ns/p")
    (lost,) = slurm.jobs
    slurm.allocate_answer_lost = False
    for _ in range(2):
        await sync.reconcile("ns/p")
    assert slurm.cancelled == [lost]
    (other,) = live(slurm)
    assert job_label(pods.get("ns/p")) == str(other)


async def test_a_cancel_that_fails_is_owed_and_retried_until_slurm_takes_it() -> None:
    sync, slurm, _kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    slurm.refuse_update = slurm.refuse_cancel = True
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")  # allocated, not marked, not cancelled: submitted instead
    (allocated, _submitted) = sorted(slurm.jobs)
    assert slurm.cancelled == [] and [j for j, _ in sync.ledger.owed()] == [allocated]
    slurm.refuse_cancel = False
    sync._cancel_tried = 0.0  # the retry interval passed
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [allocated] and sync.ledger.owed() == []


async def test_a_cancel_owed_from_before_a_restart_spares_the_job_that_took_its_id() -> None:
    """The owed cancel waited out a slurmctld restart from older state, which gave the id
    to another user's job: re-checked before it is sent, it is paid without a cancel."""
    sync, slurm, _kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    slurm.refuse_update = slurm.refuse_cancel = True
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    (allocated, _submitted) = sorted(slurm.jobs)
    assert [j for j, _ in sync.ledger.owed()] == [allocated]
    slurm.jobs[allocated] = {
        "job_id": allocated,
        "job_state": ["RUNNING"],
        "nodes": "n2",
        "user_id": "1234",
        "comment": "an ordinary job",
    }
    slurm.refuse_cancel = False
    sync._cancel_tried = 0.0  # the retry interval passed
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [] and sync.ledger.owed() == []


async def test_a_cancel_owed_is_never_sent_to_another_pods_placeholder_under_its_id() -> None:
    """The owed id went, after a slurmctld restart from older state, to another pod's
    placeholder job, marked by this very bridge: still not the job made for pod p, so it
    is left running, and the ledger's record of the other pod's job is not dropped."""
    sync, slurm, _kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    slurm.refuse_update = slurm.refuse_cancel = True
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    (allocated, _submitted) = sorted(slurm.jobs)
    other = make_pod("q", "u2")
    mark = placeholder.admin_comment([other], sync.config)
    slurm.jobs[allocated] = {
        "job_id": allocated,
        "job_state": ["RUNNING"],
        "nodes": "n2",
        "admin_comment": mark,
        "comment": mark,
    }
    sync.ledger.made(allocated, [("ns/q", "u2")])
    slurm.refuse_cancel = False
    sync._cancel_tried = 0.0
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [] and sync.ledger.owed() == []
    assert sync.ledger.job_made_for("u2") == allocated


async def test_a_user_slurmctld_refuses_to_act_as_is_submitted_and_not_tried_again_soon() -> None:
    sync, slurm, _kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.free_node = "n2"
    slurm.unknown_users = {"65534"}
    for name in ("p", "q"):
        pods.upsert(make_pod(name, f"u-{name}"))
        await sync.reconcile(f"ns/{name}")
    assert slurm.allocations == 1  # asked once, then remembered
    assert len(live(slurm)) == 2 and all(slurm.job(j).is_pending for j in live(slurm))


async def test_a_refused_allocation_is_submitted_instead_and_leaves_one_live_job() -> None:
    sync, slurm, kube, pods = setup()
    idle(sync, "n1")  # looks free in the cache, but Slurm says busy
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    assert slurm.allocations == 1
    (job_id,) = live(slurm)
    assert slurm.job(job_id).is_pending
    assert job_label(pods.get("ns/p")) == str(job_id)
    assert kube.bound == {}


async def test_no_allocation_is_asked_when_no_allowed_node_looks_free() -> None:
    sync, slurm, _kube, pods = setup()  # nodes in an unknown state
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    assert slurm.allocations == 0
    assert len(live(slurm)) == 1


async def test_a_pod_slurm_refused_before_is_submitted_not_allocated() -> None:
    sync, slurm, _kube, pods = setup()
    idle(sync, "n1")
    slurm.free_node = "n1"
    sync.rejections["u1"] = 1
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    assert slurm.allocations == 0
    assert len(live(slurm)) == 1


async def test_without_job_allocate_in_slurmrestd_pods_are_submitted_from_then_on() -> None:
    sync, slurm, _kube, pods = setup()
    idle(sync, "n1", "n2")
    slurm.allocate_missing = True
    pods.upsert(make_pod("p", "u1"))
    pods.upsert(make_pod("q", "u2"))
    await sync.reconcile("ns/p")
    await sync.reconcile("ns/q")
    assert slurm.allocations == 1
    assert len(live(slurm)) == 2


async def test_immediate_allocation_can_be_turned_off_in_the_config() -> None:
    sync, slurm, _kube, pods = setup()
    sync.allocate_at_once = parse_config({"immediateAllocation": False}).immediate_allocation
    idle(sync, "n1")
    slurm.free_node = "n1"
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    assert slurm.allocations == 0


async def test_a_node_taken_by_our_own_allocation_is_not_offered_again_before_a_poll() -> None:
    """Two pods, two free-looking nodes, Slurm would refuse everything after the first:
    the second pod sees the first one's node taken (claims) and only the other node free,
    so its request is made; with one node, no second request is made at all."""
    sync, slurm, kube, pods = setup()
    idle(sync, "n1")
    slurm.free_node = "n1"
    pods.upsert(make_pod("p", "u1"))
    pods.upsert(make_pod("q", "u2"))
    await sync.reconcile("ns/p")
    await sync.reconcile("ns/q")
    assert slurm.allocations == 1  # the informer still shows n1 IDLE; the claim says taken
    assert kube.bound == {"ns/p": "n1"}
    assert len(live(slurm)) == 2  # q's job was submitted and waits


async def test_a_pod_behind_a_pending_job_of_ours_is_submitted_not_allocated() -> None:
    """Slurm would refuse it ("insufficient priority") and keep a FAILED record of the try."""
    sync, slurm, _kube, pods = setup()
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")  # no node looks free: submitted, pending
    (first,) = slurm.jobs
    assert slurm.job(first).is_pending
    slurm.jobs[first]["partition"] = "bridge"
    sync.watch.jobs[first] = slurm.job(first)
    idle(sync, "n1")  # a node frees up before Slurm's next pass gives it to the first job
    slurm.free_node = "n1"
    pods.upsert(make_pod("q", "u2"))
    await sync.reconcile("ns/q")
    assert slurm.allocations == 0
    assert len(live(slurm)) == 2


async def test_after_a_takeover_no_allocation_is_asked_before_the_labelled_pods_were_seen() -> None:
    """The replica before this one left pods labelled with jobs that may still wait in
    Slurm: until each was looked at, new pods are submitted behind them."""
    sync, slurm, kube, pods = setup()
    waiting = make_pod("old", "u0")
    waiting["metadata"]["labels"][SLURM_JOBID] = "100"
    slurm.jobs[100] = {"job_id": 100, "job_state": ["PENDING"], "nodes": "",
                       "partition": "bridge", "admin_comment": placeholder.admin_comment(
                           [waiting], CONFIG)}  # fmt: skip
    pods.upsert(waiting)
    await sync.recover()
    idle(sync, "n1")
    slurm.free_node = "n1"
    pods.upsert(make_pod("new", "u1"))
    await sync.reconcile("ns/new")
    assert slurm.allocations == 0  # submitted behind the old pod's job
    await sync.reconcile("ns/old")  # seen: its job is pending, so still behind it
    slurm.allocate(100, "n2")
    sync.watch.jobs.pop(100)
    await sync.reconcile("ns/old")
    assert kube.bound == {"ns/old": "n2"}
    new_job = int(job_label(pods.get("ns/new")) or 0)
    slurm.allocate(new_job, "n3")
    sync.watch.jobs.pop(new_job)
    await sync.reconcile("ns/new")
    pods.upsert(make_pod("third", "u2"))
    await sync.reconcile("ns/third")
    assert slurm.allocations == 1  # nothing of ours waits any more


async def test_a_pod_larger_than_every_managed_node_is_not_submitted_until_one_fits() -> None:
    """64 CPUs asked, 4 per node: Slurm would keep the job pending for good
    (PartitionConfig); the pod says why, with the numbers, and nothing is submitted."""
    sync, slurm, _kube, pods = setup()
    for n in ("n1", "n2"):
        sync.slurm.informer.nodes[n] = Node.parse(
            {"name": n, "partitions": ["bridge"], "cpus": 4, "real_memory": 8000}
        )
    pod = make_pod("big", "ub")
    pod["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "64"}}
    pods.upsert(pod)
    await sync.reconcile("ns/big")
    assert slurm.jobs == {} and "ns/big" in sync.unfit
    sync.slurm.informer.nodes["n2"] = Node.parse(
        {"name": "n2", "partitions": ["bridge"], "cpus": 64, "real_memory": 8000}
    )
    await sync.reconcile("ns/big")  # brought back by the node event
    assert len(slurm.jobs) == 1 and "ns/big" not in sync.unfit


async def test_a_pod_waiting_because_slurm_refuses_the_bridges_credentials_says_so() -> None:
    """A rotated JWT key: slurmrestd refuses every request; the pod's condition says why it
    waits (it used to sit Pending with nothing said)."""
    sync, slurm, kube, pods = setup()
    written: list[JSON] = []

    async def patch(_res: Any, name: str, body: Any, ns: str, **kw: Any) -> JSON:
        if kw.get("subresource") == "status":
            written.append(body["status"]["conditions"][0])
            return {}
        return await FakeKube.patch(kube, _res, name, body, ns, **kw)

    kube.patch = patch  # type: ignore[method-assign]

    async def refused(_desc: JSON, **_kw: Any) -> int:
        raise errors.SlurmAuthError("Unauthorized", status=401)

    slurm.submit_job = refused  # type: ignore[method-assign]
    slurm.allocate_job = refused  # type: ignore[method-assign]
    pods.upsert(make_pod("p", "u1"))
    with contextlib.suppress(errors.SlurmAuthError):
        await sync.reconcile("ns/p")
    assert written and written[-1]["reason"] == "SlurmAuthFailed"
    assert "refused the bridge's credentials" in written[-1]["message"]


class GatedSlurm(FakeSlurm):
    """Allocations answer only once `gate` opens; each takes the next of `free`."""

    def __init__(self, free: list[str]) -> None:
        super().__init__()
        self.free = free
        self.gate = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0

    async def allocate_job(self, desc: JSON, *, tokens: Any = None) -> int:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.gate.wait()
            self.free_node = self.free.pop(0) if self.free else None
            return await super().allocate_job(desc, tokens=tokens)
        finally:
            self.in_flight -= 1


def gated(free: list[str]) -> tuple[SchedulerSync, GatedSlurm, FakeKube, Store]:
    sync, _slurm, kube, pods = setup()
    slurm = GatedSlurm(free)
    sync.slurm.client = slurm  # type: ignore[misc]
    sync.watch.client = slurm  # type: ignore[assignment]
    return sync, slurm, kube, pods


async def test_a_burst_has_its_allocations_in_flight_together_each_claiming_a_node() -> None:
    """Two pods, two free nodes: both requests are asked before either is answered (a
    burst is not one round trip after another), and both pods are bound, one per node."""
    sync, slurm, kube, pods = gated(["n1", "n2"])
    idle(sync, "n1", "n2")
    pods.upsert(make_pod("p", "u1"))
    pods.upsert(make_pod("q", "u2"))
    both = asyncio.gather(sync.reconcile("ns/p"), sync.reconcile("ns/q"))
    try:
        await wait_until(lambda: slurm.in_flight == 2)
    finally:
        slurm.gate.set()
        await asyncio.wait_for(both, 5)
    assert slurm.most_in_flight == 2 and slurm.allocations == 2
    assert sorted(kube.bound.values()) == ["n1", "n2"]


async def test_a_request_in_flight_counts_as_taking_its_node_for_the_next_pod() -> None:
    """One free node (exclusive pods): while the first pod's request is unanswered the
    second pod sees no node free and is submitted, never asked for (Slurm would refuse it
    and keep a FAILED record)."""
    sync, slurm, kube, pods = gated(["n1"])
    idle(sync, "n1")
    pods.upsert(make_pod("p", "u1"))
    pods.upsert(make_pod("q", "u2"))
    first = asyncio.ensure_future(sync.reconcile("ns/p"))
    try:
        await wait_until(lambda: slurm.in_flight == 1)
        await asyncio.wait_for(sync.reconcile("ns/q"), 5)  # not queued behind p's request
    finally:
        slurm.gate.set()
        await asyncio.wait_for(first, 5)
    assert slurm.allocations == 1 and slurm.most_in_flight == 1
    assert kube.bound == {"ns/p": "n1"}
    assert not any(slurm.job(j).state == ["FAILED"] for j in slurm.jobs)


async def wait_until(check: Any) -> None:
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


class SlowMarkSlurm(FakeSlurm):
    """slurmctld takes a while to write admin_comment (the answer comes after other
    requests' answers)."""

    def job(self, job_id: int) -> Job:
        return Job.parse(copy.deepcopy(self.jobs[job_id]))  # a read is what it was then

    async def update_job(self, job_id: int, changes: JSON) -> None:
        for _ in range(5):
            await asyncio.sleep(0)
        await super().update_job(job_id, changes)


async def test_a_job_allocated_as_the_pods_user_is_read_only_once_marked_as_ours() -> None:
    """A read racing the mark would show no admin_comment: the pod would take its own job
    for someone else's, make another and leave this one running (bench_bridge found four
    live jobs for one pod that way)."""
    sync, _slurm, kube, pods = setup()
    slurm = SlowMarkSlurm()
    sync.slurm.client = slurm  # type: ignore[misc]
    sync.watch.client = slurm  # type: ignore[assignment]
    idle(sync, "n1")
    slurm.free_node = "n1"
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    (job_id,) = slurm.jobs
    assert kube.bound == {"ns/p": "n1"} and slurm.cancelled == []
    assert job_label(pods.get("ns/p")) == str(job_id)


async def test_a_pod_of_higher_priority_in_flight_asks_for_the_free_node_first() -> None:
    """Workers run side by side: the high-priority pod was taken from the queue first, but
    its way to the decision is slower (here: its group lookup). The low-priority pod waits
    for it to ask, so the one free node is the high one's; the low one's job waits."""
    sync, slurm, kube, pods = setup()
    idle(sync, "n1")
    slurm.free_node = "n1"
    high, low = make_pod("high", "u1"), make_pod("low", "u2")
    high["spec"]["priority"] = 10
    pods.upsert(high)
    pods.upsert(low)
    gate = asyncio.Event()
    lookup = sync.gangs.group

    async def slow_for_high(pod: JSON) -> Any:
        if pod["metadata"]["name"] == "high":
            await gate.wait()
        return await lookup(pod)

    sync.gangs.group = slow_for_high  # type: ignore[method-assign]
    first = asyncio.ensure_future(sync.reconcile("ns/high"))
    await wait_until(lambda: "ns/high" in sync.undecided)
    second = asyncio.ensure_future(sync.reconcile("ns/low"))
    for _ in range(50):
        await asyncio.sleep(0)
    assert slurm.allocations == 0, "the low-priority pod waits for the high one to ask"
    gate.set()
    await asyncio.wait_for(asyncio.gather(first, second), 5)
    assert kube.bound == {"ns/high": "n1"}
    assert slurm.job(int(job_label(pods.get("ns/low")) or 0)).is_pending
    assert sync.undecided == {}


async def test_a_poll_made_while_an_allocation_was_in_flight_does_not_clear_its_claim() -> None:
    """The informer polled (and saw n1 idle) while p's request was still in slurmctld: that
    poll cannot show p's allocation, so q must still see n1 taken and not ask for it
    (Slurm would refuse it and keep a FAILED record; the bench saw one per run)."""
    sync, slurm, kube, pods = gated(["n1"])
    idle(sync, "n1")
    polls = {"started": 0, "done": 0}
    sync.slurm.informer.mark = lambda: polls["started"]
    sync.slurm.informer.shows_since = lambda mark: polls["done"] > mark
    pods.upsert(make_pod("p", "u1"))
    pods.upsert(make_pod("q", "u2"))
    first = asyncio.ensure_future(sync.reconcile("ns/p"))
    try:
        await wait_until(lambda: slurm.in_flight == 1)
        polls["started"] += 1  # a poll while p's request is in flight: n1 still idle there
        polls["done"] += 1
    finally:
        slurm.gate.set()
        await asyncio.wait_for(first, 5)
    await sync.reconcile("ns/q")
    assert slurm.allocations == 1 and kube.bound == {"ns/p": "n1"}
    assert not any(slurm.job(j).state == ["FAILED"] for j in slurm.jobs)


async def test_a_submission_goes_after_the_allocations_asked_before_it() -> None:
    """p's allocation is in flight on n1; q finds no free node and is submitted, but only
    once p's request was answered: a pending job of ours ahead of an allocation makes Slurm
    refuse it ("insufficient priority", a FAILED record each: ten per run in the bench).
    While q's job is on its way, r counts it as pending and is submitted, not allocated."""
    sync, slurm, _kube, pods = gated(["n1"])
    idle(sync, "n1")
    for name, uid in (("p", "u1"), ("q", "u2")):
        pods.upsert(make_pod(name, uid))
    first = asyncio.ensure_future(sync.reconcile("ns/p"))
    second: asyncio.Future[Any] | None = None
    try:
        await wait_until(lambda: slurm.in_flight == 1)
        second = asyncio.ensure_future(sync.reconcile("ns/q"))
        await wait_until(lambda: sync.submitting.get("bridge") == 1)
        assert len(slurm.jobs) == 0, "q's job waits for p's answer"
        idle(sync, "n2")  # a node frees up meanwhile: r must still not jump the queue
        pods.upsert(make_pod("r", "u3"))
        await asyncio.wait_for(sync.reconcile("ns/r"), 5)  # it waits at most TURN_WAIT_S
        assert slurm.most_in_flight == 1, "r asked for no allocation"
    finally:
        slurm.gate.set()
        await asyncio.wait_for(asyncio.gather(first, *([second] if second else [])), 5)
    assert slurm.allocations == 1
    assert sorted(slurm.job(j).state[0] for j in slurm.jobs) == ["PENDING", "PENDING", "RUNNING"]


async def test_a_job_id_slurm_gives_again_after_a_restart_is_the_new_jobs() -> None:
    """The soak (seed 23): slurmctld, killed -9, came back from a state save older than a
    gang's job 59 and gave 59 to pod p27's new job; the bridge still held its read of the
    gang's 59, took p27's job for another's and submitted p27 again: two live jobs for one
    pod, the first left running with no pod for minutes."""
    sync, slurm, kube, pods = setup()
    pods.upsert(make_pod("q", "u2"))
    await sync.reconcile("ns/q")
    (old,) = slurm.jobs
    assert sync.watch.jobs.get(old) is not None  # the watch read and keeps q's job
    del slurm.jobs[old]  # restarted from an older state save: the job is gone ...
    slurm.last_id = old - 1  # ... and its id is given again
    pods.upsert(make_pod("p", "u1"))
    await sync.reconcile("ns/p")
    assert list(slurm.jobs) == [old], "p's job was taken for q's and p submitted again"
    assert job_label(pods.get("ns/p")) == str(old)
    slurm.allocate(old, "n2")
    sync.watch.jobs.pop(old, None)  # as the watch would, on the change
    await sync.reconcile("ns/p")
    assert kube.bound == {"ns/p": "n2"}
    assert list(slurm.jobs) == [old] and slurm.cancelled == []


async def test_a_pod_slurm_refused_is_not_asked_again_before_its_backoff_whatever_comes() -> None:
    sync, slurm, _kube, pods = setup()
    asked = 0

    async def refuse(_desc: JSON) -> int:
        nonlocal asked
        asked += 1
        raise errors.SlurmError("Invalid account or account/partition combination specified")

    slurm.submit_job = refuse  # type: ignore[method-assign]
    pods.upsert(make_pod("p", "u1"))
    first = await sync.reconcile("ns/p")
    again = await sync.reconcile("ns/p")  # its status write came back as an event
    assert asked == 1
    assert first.requeue_after and again.requeue_after
    assert 0 < again.requeue_after <= first.requeue_after
    sync.not_before["u1"] = 0.0  # the backoff is over
    await sync.reconcile("ns/p")
    assert asked == 2 and sync.rejections["u1"] == 2
