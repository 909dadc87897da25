"""Autoscaling (issue 13) against the real apiserver, the real HPA controller of
kube-controller-manager and real Slurm: a NodeSet's own partition, the external metrics API
the operator serves through the apiserver, and an HPA scaling a NodeSet from zero and back.
Every job asserted here ends COMPLETED and was never requeued."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from slinky.kube import rest
from slinky.operator.nodeset import partition as partition_module
from slinky.operator.nodeset.partition import ANNOTATION_PARTITION
from slinky.operator.resources import NODESETS
from slinky.slurm import errors
from slinky.slurm.models import Job, Partition, expand_hostlist
from slinky_testbed import bed, slurmstate
from slinky_testbed.waiting import wait_for
from tests.e2e.nodeset_fixtures import Env, completed_once, nodeset_manifest
from tests.e2e.operator_fixtures import condition

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

JSON = dict[str, Any]
HPAS = rest.Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")
METRICS = "/apis/external.metrics.k8s.io/v1beta1/namespaces"


def unique(prefix: str) -> str:
    """Slurm partition names are global to the test bed: never reuse one across tests."""
    return f"{prefix}{uuid.uuid4().hex[:6]}"


def with_partition(name: str, replicas: int, config: str = "") -> JSON:
    return nodeset_manifest(name, replicas, partition={"enabled": True, "config": config})


async def create_nodeset(e: Env, manifest: JSON) -> None:
    await e.kube.create(NODESETS, manifest, e.namespace)


async def partition(e: Env, name: str) -> Partition | None:
    try:
        return await e.slurm.get_partition(name)
    except errors.SlurmNotFound:
        return None


async def submit_to(
    e: Env,
    part: str,
    seconds: int,
    *,
    nodes: int = 1,
    hold: bool = False,
    exclusive: bool = False,
    name: str = "e2e-as",
) -> int:
    job: JSON = {
        "name": name,
        "partition": part,
        "minimum_nodes": nodes,
        "maximum_nodes": nodes,
        "tasks": nodes,
        "current_working_directory": "/tmp",
        "environment": ["PATH=/usr/bin:/bin"],
        "time_limit": {"set": True, "number": 10},
    }
    if hold:
        job["hold"] = True
    if exclusive:
        job["shared"] = ["none"]
    return await e.slurm.submit_job(job, script=f"#!/bin/sh\nsleep {seconds}\n")


async def completed(e: Env, job_id: int, timeout: float) -> Job:
    """Wait for the job to end; it must end COMPLETED and never have been requeued."""
    return await completed_once(e.slurm, job_id, timeout)


async def nodeset_condition(e: Env, name: str, type_: str, reason: str) -> JSON:
    async def has() -> JSON | None:
        c = condition(await e.nodeset(name), type_)
        return c if c.get("reason") == reason else None

    return await wait_for(has, timeout=60, interval=0.3, what=f"{name} {type_}={reason}")


async def metric(e: Env, name: str, selector: str) -> tuple[int, JSON]:
    """GET an external metric through the apiserver (as the HPA controller does)."""
    try:
        body = await e.kube.request(
            "GET", f"{METRICS}/{e.namespace}/{name}", params={"labelSelector": selector}
        )
        return 200, body
    except rest.ApiError as err:
        return err.code, {"message": err.message}


async def metric_value(e: Env, name: str, selector: str) -> int:
    code, body = await metric(e, name, selector)
    assert code == 200, body
    return sum(int(i["value"]) for i in body["items"])


async def wait_metric(e: Env, name: str, selector: str, want: int) -> None:
    async def equal() -> bool:
        # A 404 until the operator's informer polled once since the partition was made.
        code, body = await metric(e, name, selector)
        return code == 200 and sum(int(i["value"]) for i in body["items"]) == want

    await wait_for(equal, timeout=60, interval=0.5, what=f"{name}{{{selector}}} == {want}")


async def test_partition_follows_the_nodeset_and_outlives_scale_to_zero(env: Env) -> None:
    e = env
    name = unique("asp")
    await create_nodeset(e, with_partition(name, 1, "MaxTime=30 OverSubscribe=NO"))

    async def with_node() -> Partition | None:
        p = await partition(e, name)
        return p if p is not None and p.nodes == f"{name}-0" else None

    part = await wait_for(with_node, timeout=90, interval=0.3, what=f"partition {name} with node")
    assert part.raw["maximums"]["time"]["number"] == 30
    await nodeset_condition(e, name, "PartitionReady", "PartitionReady")
    assert (await e.nodeset(name))["metadata"]["annotations"][ANNOTATION_PARTITION] == name
    await completed(e, await submit_to(e, name, 1), timeout=60)

    await e.scale(name, 0)

    async def no_pods() -> bool:
        return not await e.pods(name)

    await wait_for(no_pods, timeout=90, what="NodeSet scaled to 0")
    waiting = await submit_to(e, name, 1)  # accepted: the partition stays with no nodes

    async def pending_for_nodes() -> Job | None:
        job = await e.slurm.get_job(waiting)
        return job if job.is_pending and job.state_reason else None

    job = await wait_for(pending_for_nodes, timeout=30, what=f"job {waiting} pending")
    assert job.state_reason in (
        "PartitionConfig",
        "Resources",
        "Nodes_required_for_job_are_DOWN,_DRAINED_and_or_reserved_for_jobs_in_higher_priority_partitions",
    ), job.state_reason
    assert await partition(e, name) is not None

    await e.scale(name, 1)
    await completed(e, waiting, timeout=120)
    await e.kube.delete(NODESETS, name, e.namespace)

    async def nodeset_gone() -> bool:
        try:
            await e.nodeset(name)
        except rest.ApiError as err:
            return err.not_found
        return False

    await wait_for(nodeset_gone, timeout=120, what=f"NodeSet {name} deleted")
    assert await partition(e, name) is None, "the NodeSet's partition outlived it"


async def test_bad_partition_inputs_are_conditions_and_nothing_is_deleted(env: Env) -> None:
    e = env
    foreign = unique("asf")
    await e.slurm.put_partition({"name": foreign, "maximums": {"time": {"set": True, "number": 7}}})
    try:
        await create_nodeset(e, with_partition(foreign, 0))
        cond = await nodeset_condition(e, foreign, "PartitionReady", "PartitionConflict")
        assert foreign in cond["message"] and cond["status"] == "False"

        bad_config = unique("asc")
        await create_nodeset(e, with_partition(bad_config, 0, "MaxTime=30 Bogus=1"))
        cond = await nodeset_condition(e, bad_config, "PartitionReady", "InvalidPartitionConfig")
        assert "Bogus" in cond["message"]
        assert await partition(e, bad_config) is None

        await create_nodeset(e, with_partition("default", 0))  # a name Slurm reserves
        cond = await nodeset_condition(e, "default", "PartitionReady", "PartitionRefused")
        assert "default" in cond["message"]

        for n in (foreign, bad_config, "default"):
            await e.kube.delete(NODESETS, n, e.namespace)

        async def all_gone() -> bool:
            return not (await e.kube.list(NODESETS, e.namespace))["items"]

        await wait_for(all_gone, timeout=60, what="NodeSets deleted")
        kept = await partition(e, foreign)
        assert kept is not None, "a partition the NodeSet did not create was deleted"
        assert kept.raw["maximums"]["time"]["number"] == 7, "a foreign partition was changed"
    finally:
        await e.slurm.delete_partition(foreign)


async def test_metrics_api_counts_waiting_jobs_and_refuses_unknown_names(env: Env) -> None:
    e = env
    name = unique("asm")
    await create_nodeset(e, with_partition(name, 0))
    await nodeset_condition(e, name, "PartitionReady", "PartitionReady")
    jobs = [
        await submit_to(e, name, 1),
        await submit_to(e, name, 1, nodes=2),
        await submit_to(e, name, 1, hold=True),  # held: not demand
    ]
    try:
        await wait_metric(e, "slurm_partition_jobs_pending", f"partition={name}", 2)
        assert await metric_value(e, "slurm_partition_jobs_pending_nodes", f"partition={name}") == 3
        assert await metric_value(e, "slurm_partition_nodes_idle", f"partition={name}") == 0
        assert await metric_value(e, "slurm_nodeset_jobs_pending", f"nodeset={name}") == 2
        assert await metric_value(e, "slurm_nodeset_jobs_pending_nodes", f"nodeset={name}") == 3
        scraped = e.operator.metrics()
        assert (
            # The cluster label is the Cluster's name, as in the external metrics API (the
            # exposition sorts label names).
            f'slurm_partition_jobs_pending{{cluster="slurm",namespace="{e.namespace}",'
            f'partition="{name}"}} 2.0' in scraped
        )
        assert (
            f'slurm_nodeset_jobs_pending_nodes{{namespace="{e.namespace}",nodeset="{name}"}} 3.0'
            in scraped
        )

        for bad, selector, says in [
            ("slurm_partition_jobs_missing", f"partition={name}", "unknown metric"),
            ("slurm_partition_jobs_pending", "", "needs labelSelector partition"),
            ("slurm_partition_jobs_pending", "partition=no-such-partition", "not found"),
            ("slurm_nodeset_jobs_pending", "nodeset=no-such-nodeset", "not found"),
            ("slurm_nodeset_jobs_pending", f"partition={name}", "needs labelSelector nodeset"),
        ]:
            code, body = await metric(e, bad, selector)
            assert code == 404, (bad, selector, body)
            assert says in body["message"], (bad, selector, body)
    finally:
        for job_id in jobs:
            await e.slurm.cancel_job(job_id)


def hpa(name: str, *, scale_down_window: int) -> JSON:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "slinky.slurm.net/v1alpha1",
                "kind": "NodeSet",
                "name": name,
            },
            "minReplicas": 0,
            "maxReplicas": 2,
            "metrics": [
                {
                    "type": "External",
                    "external": {
                        "metric": {
                            "name": "slurm_nodeset_jobs_pending_nodes",
                            "selector": {"matchLabels": {"nodeset": name}},
                        },
                        # AverageValue: desired = ceil(nodes asked / 1), also from 0 replicas.
                        "target": {"type": "AverageValue", "averageValue": "1"},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0},
                "scaleDown": {
                    "stabilizationWindowSeconds": scale_down_window,
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 1}],
                },
            },
        },
    }


async def test_hpa_scales_a_nodeset_from_zero_and_back_draining_busy_pods(env: Env) -> None:
    e = env
    name = unique("ash")
    # Kubernetes 1.36 scales up from zero only a target that the HPA itself scaled to zero
    # (condition ScaledToZero); one created or scaled by hand to 0 counts as disabled.
    await create_nodeset(e, with_partition(name, 1))
    await nodeset_condition(e, name, "PartitionReady", "PartitionReady")
    await e.kube.create(HPAS, hpa(name, scale_down_window=5), e.namespace)

    async def hpa_scaled_to_zero() -> bool:
        obj = await e.kube.get(HPAS, name, e.namespace)
        return condition(obj, "ScaledToZero").get("status") == "True"

    await wait_for(hpa_scaled_to_zero, timeout=90, interval=0.3, what="empty queue: HPA to 0")

    async def no_pods() -> bool:
        return not await e.pods(name)

    await wait_for(no_pods, timeout=90, what="NodeSet at 0 pods")
    short, long = await submit_to(e, name, 2), await submit_to(e, name, 40)

    async def scaled_up() -> bool:
        return int((await e.nodeset(name))["spec"]["replicas"]) >= 1

    await wait_for(scaled_up, timeout=90, interval=0.3, what="HPA scales the NodeSet from 0")
    await completed(e, short, timeout=120)
    running_on = await e.running_on(long, timeout=60)

    # No job pending any more: after its window the HPA asks for 0 while `long` still runs.
    async def scaled_to_zero() -> bool:
        return int((await e.nodeset(name))["spec"]["replicas"]) == 0

    await wait_for(scaled_to_zero, timeout=90, interval=0.3, what="HPA scales the NodeSet to 0")
    assert (await e.slurm.get_job(long)).is_running, "the HPA's scale-in stopped a running job"
    assert running_on in await e.live_pod_names(name) + [
        p["metadata"]["name"] for p in await e.pods(name)
    ], "the busy pod was deleted while its job ran"
    await completed(e, long, timeout=120)
    await wait_for(no_pods, timeout=120, what="the drained pod deleted after its job")
    assert await partition(e, name) is not None, "replicas 0 keeps the partition"


async def test_an_hpa_that_will_not_scale_a_nodeset_made_at_zero_is_named(env: Env) -> None:
    """A NodeSet created with replicas 0 and an HPA: Kubernetes never scales it up (it did
    not scale it to 0 itself), whatever the queue. The NodeSet says so, and what to do."""
    e = env
    name = unique("hz")
    await create_nodeset(e, with_partition(name, 0))
    await e.kube.create(HPAS, hpa(name, scale_down_window=5), e.namespace)
    got = await nodeset_condition(e, name, "Autoscaling", "HPACannotScaleFromZero")
    assert got["status"] == "False" and f"HorizontalPodAutoscaler {name}" in got["message"]
    await e.kube.patch(NODESETS, name, {"spec": {"replicas": 1}}, e.namespace)
    await nodeset_condition(e, name, "Autoscaling", "Scalable")
    await e.kube.delete(HPAS, name, e.namespace)
    await e.kube.delete(NODESETS, name, e.namespace)


async def test_partition_goes_when_disabled_and_waits_for_queued_jobs_on_deletion(
    env: Env,
) -> None:
    e = env
    name = unique("asd")
    await create_nodeset(e, with_partition(name, 0))
    await nodeset_condition(e, name, "PartitionReady", "PartitionReady")
    await e.kube.patch(NODESETS, name, {"spec": {"partition": {"enabled": False}}}, e.namespace)

    async def disabled() -> bool:
        return await partition(e, name) is None

    await wait_for(disabled, timeout=60, what=f"partition {name} deleted when disabled")
    await nodeset_condition(e, name, "PartitionReady", "PartitionDisabled")
    annotations = (await e.nodeset(name))["metadata"].get("annotations") or {}
    assert ANNOTATION_PARTITION not in annotations

    await e.kube.patch(NODESETS, name, {"spec": {"partition": {"enabled": True}}}, e.namespace)
    await nodeset_condition(e, name, "PartitionReady", "PartitionReady")
    queued = await submit_to(e, name, 1)
    await e.kube.delete(NODESETS, name, e.namespace)

    async def waits_for_the_queue() -> str | None:
        message = str(condition(await e.nodeset(name), "Deleting").get("message") or "")
        return message if f"partition {name}" in message else None

    await wait_for(waits_for_the_queue, timeout=60, what="Deleting names the partition")
    assert await partition(e, name) is not None, "a partition with a queued job was deleted"
    assert (await e.slurm.get_job(queued)).is_pending
    await e.slurm.cancel_job(queued)

    async def gone() -> bool:
        return await partition(e, name) is None

    await wait_for(gone, timeout=60, what=f"partition {name} deleted once its queue is empty")


async def test_a_slurmctld_crash_keeps_the_partition_and_its_running_and_queued_jobs(
    env: Env,
) -> None:
    """slurmctld killed (-9) and started again: the partition the operator made is still
    there (ReconfigFlags=KeepPartInfo), and a running and a queued job in it both run to
    COMPLETED. (Without it, slurmctld forgot the partition and failed both: NODE_FAIL,
    PartitionDown.)"""
    e = env
    name = unique("asr")
    await create_nodeset(e, with_partition(name, 1))

    async def with_node() -> Partition | None:
        p = await partition(e, name)
        return p if p is not None and p.nodes == f"{name}-0" else None

    await wait_for(with_node, timeout=90, interval=0.3, what=f"partition {name} with node")
    running = await submit_to(e, name, 20, exclusive=True)
    queued = await submit_to(e, name, 1, exclusive=True)

    async def one_runs_one_waits() -> bool:
        a, b = await e.slurm.get_job(running), await e.slurm.get_job(queued)
        return a.is_running and b.is_pending

    await wait_for(one_runs_one_waits, timeout=60, what="one job running, one queued")
    # Slurm saves its state periodically; a kill -9 right after a submission loses the job
    # (Slurm's own, not tested here): let the state be saved first.
    await wait_for(lambda: _saved(e, queued), timeout=30, interval=0.5, what="job state saved")
    e.testbed.kill_component("slurmctld")
    e.testbed.start_component("slurmctld")
    assert await partition(e, name) is not None
    for job_id in (running, queued):
        await completed(e, job_id, timeout=120)
    await nodeset_condition(e, name, "PartitionReady", "PartitionReady")


async def _saved(e: Env, job_id: int) -> bool:
    """Whether slurmctld's job state file was written after the job was submitted."""
    state = e.testbed.root / "var" / "spool" / "slurmctld" / "job_state"
    submitted = (await e.slurm.get_job(job_id)).raw.get("submit_time") or {}
    # submit_time is in whole seconds: a file written earlier in that same second is older
    # than the job (a CI run lost the job to exactly that).
    return state.exists() and state.stat().st_mtime > float(submitted.get("number") or 0) + 1


async def test_a_partition_slurm_lost_is_made_again_at_once_even_with_no_nodes(
    env: Env,
) -> None:
    """A partition gone from Slurm (slurmctld restarted without KeepPartInfo, as a hybrid
    cluster's slurm.conf may; here an admin deleting it) is made again as soon as the
    operator's next poll shows slurmctld changed, also at 0 replicas, and says so."""
    e = env
    name = unique("asl")
    await create_nodeset(e, with_partition(name, 0, "MaxTime=30"))
    await nodeset_condition(e, name, "PartitionReady", "PartitionReady")
    await e.slurm.delete_partition(name)
    # A reconfigure advances slurmctld's update times, as a restart does: the operator's
    # next node poll sees a change and reads the partitions again.
    out = e.testbed.slurm(["scontrol", "reconfigure"], capture=True)
    assert out.returncode == 0, out.stderr

    async def back() -> Partition | None:
        return await partition(e, name)

    made = await wait_for(back, timeout=90, interval=0.5, what=f"partition {name} made again")
    assert made.raw["maximums"]["time"]["number"] == 30
    await nodeset_condition(e, name, "PartitionReady", "PartitionReady")

    async def recreated_event() -> bool:
        # Events are written after the reconcile that made the partition (the recorder
        # sends them in the background): looked for until they are there.
        events = (await e.kube.list(rest.EVENTS, e.namespace))["items"]
        return any(
            ev.get("reason") == "PartitionRecreated"
            and (ev.get("regarding") or {}).get("name") == name
            for ev in events
        )

    assert await wait_for(
        recreated_event, timeout=30, interval=0.5, what="a PartitionRecreated event"
    )


class SavedState:
    """What slurmctld would start from after a kill -9 now (`slinky_testbed.slurmstate`)."""

    def __init__(self, e: Env, nodeset: str) -> None:
        self.root = e.testbed.root
        self.dir = e.testbed.root / slurmstate.STATE_DIR
        self.nodeset = nodeset
        self.samples = 0

    def unknown_in_partition(self) -> set[str]:
        self.samples += 1
        return slurmstate.unknown_in_partitions(self.root, [self.nodeset])

    async def both_hold_all(self) -> bool:
        """Both files name both nodes of the NodeSet (slurmctld saved them since they came)."""
        want = {f"{self.nodeset}-0", f"{self.nodeset}-1"}
        files = (self.dir / "part_state", self.dir / "node_state")
        return all(slurmstate.saved_names(f, [self.nodeset]) == want for f in files)

    async def nodes_saved_without_them(self) -> bool:
        """A node_state on disk (not the moment between slurmctld's two renames) without
        the NodeSet's nodes."""
        data = slurmstate.read_state(self.dir / "node_state")
        return data is not None and not slurmstate.names_in(data, [self.nodeset])


async def test_nodes_leave_the_partition_before_slurm_forgets_them_so_a_kill_9_restarts(
    env: Env,
) -> None:
    """Soak seed 26: right after a NodeSet with its own partition went from 2 idle nodes to
    0, a kill -9 of slurmctld left it unable to start ("fatal: Invalid node names in
    partition"): the saved partition still named nodes the saved node state no longer had.
    Now a node leaves the partition when it is condemned (a busy one keeps its job), and its
    Slurm node is deleted only after slurmctld saved the partition without it. Watched on
    disk the whole time: 2 idle -> 0, then slurmctld killed (it must start again); 0 -> 2,
    a `kubectl delete pod` of the idle one, and 2 -> 0 with a job running; then new nodes
    take jobs in the partition."""
    e = env
    name = unique("asz")
    saved = SavedState(e, name)
    breaches: list[set[str]] = []

    async def consistent(done: Callable[[], Awaitable[bool]], what: str) -> None:
        async def check() -> bool:
            if bad := saved.unknown_in_partition():
                breaches.append(bad)
            return await done()

        await wait_for(check, timeout=180, interval=0.1, what=what)

    async def both_in() -> bool:
        p = await partition(e, name)
        return p is not None and set(expand_hostlist(p.nodes)) == {f"{name}-0", f"{name}-1"}

    async def all_gone() -> bool:
        if await e.pods(name):
            return False
        return all([await e.slurm_node(f"{name}-{i}") is None for i in (0, 1)])

    await create_nodeset(e, with_partition(name, 2))
    await wait_for(both_in, timeout=120, interval=0.3, what=f"partition {name} with 2 nodes")
    await consistent(saved.both_hold_all, "slurmctld saved the partition and its nodes")
    await e.scale(name, 0)
    await consistent(all_gone, "2 idle pods and their Slurm nodes gone")
    await consistent(saved.nodes_saved_without_them, "slurmctld saved its nodes without them")
    e.testbed.kill_component("slurmctld")
    try:
        e.testbed.start_component("slurmctld", timeout=30)
    except bed.TestbedError as err:
        # Leave the test bed usable for the next tests, then fail.
        (saved.dir / "part_state").unlink(missing_ok=True)
        e.testbed.start_component("slurmctld")
        raise AssertionError(f"slurmctld did not start again ({err}); saw {breaches}") from None
    assert not breaches, f"saved partition named nodes the saved nodes lacked: {breaches}"
    assert await partition(e, name) is not None

    await e.scale(name, 2)
    await consistent(both_in, f"partition {name} with 2 nodes again")
    job = await submit_to(e, name, 40)
    busy = await e.running_on(job)
    # A pod deleted by hand (not by the operator) while the operator cannot reach Slurm:
    # its preStop may not delete its Slurm node, which the partition still names.
    idle = f"{name}-1" if busy == f"{name}-0" else f"{name}-0"
    old_pod = await e.kube.get(rest.PODS, idle, e.namespace)
    e.testbed.stop_component("slurmrestd")
    try:
        await e.kube.delete(rest.PODS, idle, e.namespace)

        async def old_pod_gone() -> bool:
            try:
                pod = await e.kube.get(rest.PODS, idle, e.namespace)
            except rest.ApiError:
                return True
            return pod["metadata"]["uid"] != old_pod["metadata"]["uid"]

        await consistent(old_pod_gone, f"pod {idle} gone")
        gone_at = time.time()

        async def a_save_later() -> bool:  # whatever slurmctld saves meanwhile is watched
            return time.time() > gone_at + partition_module.STATE_SAVE_S

        await consistent(a_save_later, "slurmctld saving its state")
    finally:
        e.testbed.start_component("slurmrestd")

    async def replaced() -> bool:
        try:
            pod = await e.kube.get(rest.PODS, idle, e.namespace)
        except rest.ApiError:
            return False
        node = await e.slurm_node(idle)
        return (
            pod["metadata"]["uid"] != old_pod["metadata"]["uid"]
            and node is not None
            and node.state.is_idle
            and node.address == pod["status"].get("podIP")
        )

    await consistent(replaced, f"pod {idle} made again and registered at its address")
    await e.scale(name, 0)

    async def none_in() -> bool:
        p = await partition(e, name)
        return p is not None and not p.nodes

    await consistent(none_in, "both nodes out of the partition")
    assert (await e.slurm.get_job(job)).is_running, "the busy node left only after its job"
    await consistent(all_gone, "the pods and their Slurm nodes gone")
    await completed(e, job, timeout=60)
    assert not breaches, f"saved partition named nodes the saved nodes lacked: {breaches}"
    assert saved.samples > 100

    await e.scale(name, 1)
    await completed(e, await submit_to(e, name, 1), timeout=120)
