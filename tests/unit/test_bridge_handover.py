"""The hand-over rule: a pod whose containers have all ended gives its Slurm job back before
the kubelet reports it terminal, and the next pod is bound to that node at once only when
the kubelet would admit it beside the old one (`scheduler/handover.py`)."""

from __future__ import annotations

from typing import Any

from slinky.bridge import placeholder, podcontrol
from slinky.bridge.labels import FINALIZER, SLURM_JOBID
from slinky.bridge.scheduler import handover
from tests.unit.test_bridge_scheduler_sync import make_pod
from tests.unit.test_bridge_scheduler_sync import setup as scheduler_setup
from tests.unit.test_bridge_workload import setup as workload_setup

JSON = dict[str, Any]


def ended(exit_code: int = 0) -> JSON:
    return {"terminated": {"exitCode": exit_code, "reason": "Completed"}}


def pod_with(policy: str, *states: JSON, sidecar: JSON | None = None) -> JSON:
    pod = make_pod("p", "u1")
    pod["spec"]["restartPolicy"] = policy
    pod["spec"]["containers"] = [{"name": f"c{i}"} for i in range(len(states))]
    pod["status"] = {
        "phase": "Running",
        "containerStatuses": [{"name": f"c{i}", "state": s} for i, s in enumerate(states)],
    }
    if sidecar is not None:
        pod["spec"]["initContainers"] = [{"name": "side", "restartPolicy": "Always"}]
        pod["status"]["initContainerStatuses"] = [{"name": "side", "state": sidecar}]
    return pod


RUNNING: JSON = {"running": {"startedAt": "2026-11-29T14:59:34Z"}}


def test_a_pod_has_ended_when_no_container_of_it_runs_or_will_run_again() -> None:
    assert podcontrol.containers_ended(pod_with("Never", ended(), ended(1)))
    assert podcontrol.containers_ended(pod_with("OnFailure", ended()))
    assert podcontrol.containers_ended(pod_with("Never", ended(), sidecar=ended(137)))
    # Still running, to be restarted, or not reported yet: not ended.
    assert not podcontrol.containers_ended(pod_with("Never", ended(), RUNNING))
    assert not podcontrol.containers_ended(pod_with("OnFailure", ended(1)))
    assert not podcontrol.containers_ended(pod_with("Always", ended()))
    assert not podcontrol.containers_ended(pod_with("Never", ended(), sidecar=RUNNING))
    unreported = pod_with("Never", ended())
    unreported["spec"]["containers"].append({"name": "late"})
    assert not podcontrol.containers_ended(unreported)
    own_rules = pod_with("Never", ended(1))
    own_rules["spec"]["containers"][0]["restartPolicy"] = "OnFailure"
    assert not podcontrol.containers_ended(own_rules)
    # Failed: a container exited non-zero, or the phase says so.
    assert podcontrol.ended_failed(pod_with("Never", ended(), ended(2)))
    assert not podcontrol.ended_failed(pod_with("Never", ended(), ended()))
    assert not podcontrol.ended_failed(pod_with("Never", ended(2), RUNNING))


async def test_a_pods_job_is_cancelled_once_its_containers_ended_before_the_phase() -> None:
    """The kubelet reports the containers' end about a second before the terminal phase
    (it first tears down the sandbox): the node goes back to Slurm at the first."""
    sync, slurm, _kube, pods, _changed = workload_setup()
    pod = pods.get("ns/p")
    assert pod is not None
    pod["spec"]["restartPolicy"] = "Never"
    pod["status"]["containerStatuses"] = [{"name": "c", "state": RUNNING}]
    await sync.reconcile("ns/p")
    assert slurm.cancelled == []  # runs: keeps its job
    pod["status"]["containerStatuses"] = [{"name": "c", "state": ended()}]
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7]
    assert pod["metadata"]["finalizers"] == []
    pod["status"]["phase"] = "Succeeded"  # then the phase: nothing more to do
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7]


async def test_a_group_pod_whose_container_failed_ends_the_groups_job_before_the_phase() -> None:
    sync, slurm, _kube, pods, _changed = workload_setup()
    pod, other = pods.get("ns/p"), make_pod("q", "u2")
    assert pod is not None
    other["metadata"]["labels"][SLURM_JOBID] = "7"
    other["metadata"]["finalizers"] = [FINALIZER]
    other["spec"]["nodeName"] = "n2"
    other["status"]["phase"] = "Running"
    pods.upsert(other)
    slurm.jobs[7]["admin_comment"] = placeholder.admin_comment([pod, other], sync.config)
    pod["spec"]["restartPolicy"] = "Never"
    pod["status"]["containerStatuses"] = [{"name": "c", "state": ended(0)}]
    await sync.reconcile("ns/p")
    assert slurm.cancelled == []  # succeeded: the job stays for q
    pod["metadata"]["finalizers"] = [FINALIZER]
    pod["status"]["containerStatuses"] = [{"name": "c", "state": ended(3)}]
    await sync.reconcile("ns/p")
    assert slurm.cancelled == [7]  # failed: the group's job ends


def node(cpu: str) -> JSON:
    return {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": cpu, "memory": "4Gi"}}}


def asking(name: str, uid: str, cpu: str) -> JSON:
    pod = make_pod(name, uid)
    pod["spec"]["containers"] = [{"name": "c", "resources": {"requests": {"cpu": cpu}}}]
    return pod


def leaving(cpu: str, phase: str = "Running") -> JSON:
    pod = asking("old", "u0", cpu)
    pod["spec"].update(nodeName="n1", restartPolicy="Never")
    pod["status"] = {
        "phase": phase,
        "containerStatuses": [{"name": "c", "state": ended()}],
    }
    return pod


def test_a_pod_waits_for_a_leaving_pod_only_when_the_kubelet_would_refuse_it_beside_it() -> None:
    new = asking("new", "u1", "1")
    assert handover.leaving_blocks(new, node("2"), [leaving("2")]) == "ns/old"
    assert handover.leaving_blocks(new, node("2"), [leaving("500m")]) is None  # fits
    assert handover.leaving_blocks(new, node("2"), [leaving("2", "Succeeded")]) is None
    running = leaving("2")
    running["status"]["containerStatuses"][0]["state"] = RUNNING
    # A pod that still runs is Slurm's to keep off the node, not this rule's.
    assert handover.leaving_blocks(new, node("2"), [running]) is None
    # An extended resource the node lacks: never admitted beside it.
    gpu = asking("new", "u1", "1")
    gpu["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"] = "1"
    assert handover.leaving_blocks(gpu, node("8"), [leaving("1")]) == "ns/old"


async def test_a_pod_allocated_a_node_still_held_by_an_ended_pod_is_bound_once_it_is_released() -> (
    None
):
    """Binding it beside the old pod, which the kubelet still counts, would get it refused
    (OutOfcpu) and failed; it waits for the old pod's terminal phase, which brings it back."""
    sync, slurm, kube, pods = scheduler_setup()
    sync.nodes.store.upsert(node("2"))
    old = leaving("2")
    pods.upsert(old)
    pods.upsert(asking("new", "u1", "1"))
    await sync.reconcile("ns/new")
    (job_id,) = slurm.jobs
    slurm.allocate(job_id, "n1")
    sync.watch.jobs.pop(job_id)
    await sync.reconcile("ns/new")
    assert kube.bound == {}
    assert sync.released(old) == []  # not terminal yet
    old["status"]["phase"] = "Succeeded"
    assert sync.released(old) == ["ns/new"]
    await sync.reconcile("ns/new")
    assert kube.bound == {"ns/new": "n1"}
    assert sync.held == {} and sync.held_since == {}
