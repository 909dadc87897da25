"""The chaos soak's invariants added with the node faults (bench/soak_invariants): a pod
never runs on a node without its own job RUNNING there for long, and no job is cancelled
but by its own pod's end; and how a lost node's jobs are told apart (soak_state.NodeFault)."""

from __future__ import annotations

import json
from typing import Any

from bench import soak_chaos
from bench.soak_invariants import (
    InvariantWatch,
    Snapshot,
    jobs_cancelled_under_their_pods,
    pods_without_allocation,
)
from bench.soak_state import NodeFault

from slinky.bridge import labels
from slinky.slurm.models import Job
from slinky_testbed import dev_bridge, nodes

NS = dev_bridge.MANAGED_NAMESPACE


def pod(
    name: str, node: str, job_id: int, *, phase: str = "Running", deleting: bool = False
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": NS,
        "uid": f"uid-{name}",
        "labels": {labels.SLURM_JOBID: str(job_id)},
        "annotations": {},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "containers": [{"name": "main"}],
        },
        "status": {
            "phase": phase,
            "containerStatuses": [{"name": "main", "state": {"running": {}}}],
        },
    }


def job(job_id: int, state: str, nodes: str, *, pods: tuple[str, ...] = (), name: str = "") -> Job:
    comment = ""
    if pods:
        comment = json.dumps(
            {
                "pods": [f"{NS}/{p}" for p in pods],
                "uids": [f"uid-{p}" for p in pods],
                "scheduler": dev_bridge.SCHEDULER_NAME,
            }
        )
    return Job.parse(
        {
            "job_id": job_id,
            "name": name or f"job{job_id}",
            "job_state": [state],
            "nodes": nodes,
            "admin_comment": comment,
        }
    )


def test_a_running_pod_whose_job_runs_elsewhere_pends_or_is_gone_has_no_allocation() -> None:
    s = Snapshot(
        100.0,
        [
            pod("ok", "kwok-0", 1),
            pod("moved", "kwok-0", 2),
            pod("pending", "kwok-1", 3),
            pod("forgotten", "kwok-1", 4),
            pod("ended", "kwok-1", 5),
            pod("done", "kwok-1", 6, phase="Succeeded"),
        ],
        [
            job(1, "RUNNING", "kwok-0", pods=("ok",)),
            job(2, "RUNNING", "kwok-1", pods=("moved",)),
            job(3, "PENDING", "", pods=("pending",)),
            job(5, "COMPLETED", "kwok-1", pods=("ended",)),
            job(6, "CANCELLED", "kwok-1", pods=("done",)),
        ],
    )
    out = pods_without_allocation(s)
    assert sorted(out) == [f"{NS}/ended", f"{NS}/forgotten", f"{NS}/moved", f"{NS}/pending"]
    assert "runs on kwok-1" in out[f"{NS}/moved"]
    assert "unknown to Slurm" in out[f"{NS}/forgotten"]


def test_a_pod_without_allocation_breaches_only_after_30_seconds() -> None:
    watch = InvariantWatch()
    pods = [pod("p", "kwok-0", 9)]
    jobs = [job(9, "PENDING", "", pods=("p",))]
    name = "pods running without their own allocation"
    watch.sample(Snapshot(100.0, pods, jobs))
    watch.sample(Snapshot(129.0, pods, jobs))
    assert not [b for b in watch.breaches.values() if b.invariant == name]
    watch.sample(Snapshot(131.0, pods, jobs))
    assert [b.key for b in watch.breaches.values() if b.invariant == name] == [f"{NS}/p"]


def test_a_placeholder_job_cancelled_under_its_running_pod_is_a_breach() -> None:
    s = Snapshot(
        100.0,
        [
            pod("victim", "kwok-0", 11),
            pod("finished", "kwok-0", 12, phase="Succeeded"),
            pod("deleted", "kwok-0", 13, deleting=True),
            pod("rebound", "kwok-0", 15),  # its job now is 15; 14 was a replaced one
        ],
        [
            job(11, "CANCELLED", "kwok-0", pods=("victim",)),
            job(12, "CANCELLED", "kwok-0", pods=("finished",)),
            job(13, "CANCELLED", "kwok-0", pods=("deleted",)),
            job(14, "CANCELLED", "", pods=("rebound",)),
            job(15, "RUNNING", "kwok-0", pods=("rebound",)),
            job(16, "CANCELLED", "slurmd-0", name="soak-b3"),
            job(17, "CANCELLED", "slurmd-0", name="someone-elses"),
            job(18, "COMPLETED", "slurmd-0", name="soak-b4"),
        ],
    )
    out = jobs_cancelled_under_their_pods(s)
    assert sorted(out) == ["job 11", "job 16"]
    assert f"its pod {NS}/victim is Running on kwok-0" in out["job 11"]
    assert out["job 16"] == "batch job 16 (soak-b3) CANCELLED"


def test_a_lost_nodes_fault_covers_work_that_ran_there_while_it_lasted() -> None:
    lost = NodeFault(100.0, "node-0", ["compute-0", "batch-1"], until=200.0)
    assert lost.hit({"batch-1"}, 50.0, 150.0)  # ran there when the machine died
    assert lost.hit({"compute-0", "x"}, 150.0, 400.0)
    assert not lost.hit({"batch-1"}, 210.0, 260.0)  # a new pod of that name, after
    assert not lost.hit({"batch-0"}, 50.0, 150.0)
    assert not lost.hit({"compute-0"}, 10.0, 90.0)  # ended before
    ongoing = NodeFault(100.0, "node-0", ["compute-0"])
    assert ongoing.hit({"compute-0"}, 300.0, 350.0)


def test_the_default_plan_has_the_node_faults_and_the_apiserver_kill() -> None:
    for name in ("lose-node", "cut-node", "kill-apiserver"):
        assert name in soak_chaos.DEFAULT_ACTIONS
    planned = [p.name for p in soak_chaos.plan(5, 900.0, 1.0)]
    assert {"lose-node", "cut-node", "kill-apiserver"} <= set(planned)
    assert planned == [p.name for p in soak_chaos.plan(5, 900.0, 1.0)]  # same seed, same plan


def test_a_cut_drops_the_nodes_traffic_outside_it_and_keeps_what_stays_inside() -> None:
    names = nodes.Names("slkabc123", 70)
    rules = nodes.cut_rules(names, 1, [40001, 40002], "unified/slkabc123-cut1")
    assert "table inet slinky-cut-1 {" in rules
    assert "ip saddr 10.70.2.0/24 ip daddr != 10.70.2.0/24 drop" in rules  # its pods out
    assert "ip daddr 10.70.2.0/24 ip saddr != 10.70.2.0/24 drop" in rules  # and in
    assert "ip daddr 10.70.2.1 ip saddr != 10.70.2.0/24 drop" in rules  # apiserver -> kubelet
    assert "ip daddr 10.70.0.1 tcp sport { 40001, 40002 } drop" in rules  # its open sockets
    assert 'socket cgroupv2 level 1 "unified/slkabc123-cut1" drop' in rules  # its new ones
    assert "tcp sport" not in nodes.cut_rules(names, 1, [], "unified/x")
