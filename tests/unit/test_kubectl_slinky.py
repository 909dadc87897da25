# ruff: noqa: E501  (the snapshots are the lines as printed)
"""`kubectl slinky`'s joins, plans and renderers on a fixed world (objects as the apiserver
and slurmrestd return them, a fixed clock): the printed text is compared whole."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any, cast

import pytest

from slinky.kubectl import plan, status, why
from slinky.kubectl.main import build_parser
from slinky.kubectl.world import SlurmSide, World, read_slurm
from slinky.slurm.models import Job, Node, Partition
from slinky.types import JSON

NOW = 1_800_000_000.0  # 2027-01-15 08:00:00Z
NS = "slurm"


def pod(name: str, *, node: str | None, ready: bool = True, **meta: JSON) -> JSON:
    labels = {"nodeset.slinky.slurm.net/name": "compute", "controller-revision-hash": "r1"}
    conditions = [
        {
            "type": "Ready",
            "status": "True" if ready else "False",
            "lastTransitionTime": "2027-01-15T07:00:00Z",
        }
    ]
    return {
        "metadata": {"name": name, "namespace": NS, "labels": labels, **meta},
        "spec": {"nodeName": node} if node else {},
        "status": {
            "phase": "Running" if node else "Pending",
            "conditions": conditions,
            "containerStatuses": [{"ready": ready}],
        },
    }


def slurm_node(name: str, *states: str, reason: str = "") -> Node:
    ident = json.dumps({"namespace": NS, "podName": name, "nodeSet": "compute", "node": ""})
    return Node.parse({"name": name, "state": list(states), "reason": reason, "comment": ident})


def job(
    job_id: int,
    nodes: str,
    *,
    state: str = "RUNNING",
    minutes_left: int | None = 10,
    partition: str = "compute",
    count: int = 1,
    limit: int | None = 30,
) -> Job:
    raw: JSON = {
        "job_id": job_id,
        "name": f"job{job_id}",
        "job_state": [state],
        "nodes": nodes,
        "partition": partition,
        "user_name": "alice",
        "node_count": {"set": True, "number": count},
        "time_limit": {"set": limit is not None, "number": limit or 0, "infinite": limit is None},
        "end_time": {"set": True, "number": int(NOW + 60 * minutes_left)} if minutes_left else {},
        "state_reason": "Resources" if state == "PENDING" else "None",
        "admin_comment": json.dumps({"scheduler": "s", "pods": ["apps/web"], "uids": ["w1"]})
        if partition == "bridge"
        else "",
    }
    return Job.parse(raw)


def world() -> World:
    nodeset = {
        "metadata": {
            "name": "compute",
            "namespace": NS,
            "uid": "u1",
            "annotations": {"nodeset.slinky.slurm.net/partition": "compute"},
        },
        "spec": {
            "clusterName": "slurm",
            "replicas": 3,
            "partition": {"enabled": True},
            "selector": {"matchLabels": {"app": "c"}},
            "template": {"spec": {"containers": [{"name": "slurmd", "image": "x"}]}},
        },
        "status": {
            "conditions": [
                {"type": "SlurmConnected", "status": "True", "reason": "Connected", "message": ""},
                {
                    "type": "SlurmNodesResponding",
                    "status": "False",
                    "reason": "SlurmNodeNotResponding",
                    "message": "compute-2 does not respond",
                },
            ]
        },
    }
    cluster = {
        "metadata": {"name": "slurm", "namespace": NS},
        "spec": {
            "server": "http://slurm:6820",
            "jwtKeyRef": {"name": "k"},
            "controller": {"host": "ctld", "port": 6817},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Connected"}]},
    }
    side = SlurmSide(
        "slurm/slurm",
        "http://slurm:6820",
        nodes={
            "compute-0": slurm_node("compute-0", "ALLOCATED"),
            "compute-1": slurm_node("compute-1", "IDLE"),
            "compute-2": slurm_node("compute-2", "IDLE", "NOT_RESPONDING"),
            "bridge-0": Node.parse({"name": "bridge-0", "state": ["IDLE"]}),
        },
        jobs={
            7: job(7, "compute-0", minutes_left=10),
            8: job(8, "compute-0", minutes_left=25),
            9: job(9, "", state="PENDING", minutes_left=None, count=2),
            20: job(20, "", state="PENDING", minutes_left=None, partition="bridge"),
        },
    )
    bridge_pod = {
        "metadata": {
            "name": "web",
            "namespace": "apps",
            "uid": "w1",
            "labels": {"scheduler.slinky.slurm.net/slurm-jobid": "20"},
            "annotations": {"slurmjob.slinky.slurm.net/timelimit": "5"},
        },
        "spec": {"schedulerName": "slurm-bridge-scheduler"},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "SlurmPending",
                    "message": "job 20 waits: Resources",
                }
            ],
        },
    }
    return World(
        namespace=NS,
        clusters=[cluster],
        nodesets=[nodeset],
        pods=[
            pod("compute-0", node="node-0"),
            pod("compute-1", node="node-1"),
            pod("compute-2", node="node-1"),
            bridge_pod,
        ],
        kube_nodes={},
        hpas=[],
        slurm={"slurm/slurm": side},
        now=NOW,
    )


STATUS = """\
Cluster slurm/slurm: Ready; slurmrestd http://slurm:6820; 4 Slurm nodes, 4 live jobs

NodeSet slurm/compute (partition compute, 1 queued): desired 3, ready 3, idle 2, allocated 1, draining 0, down 1
  ! SlurmNodesResponding=False SlurmNodeNotResponding: compute-2 does not respond
  POD         READY   PHASE     NODE     SLURM STATE           WHY   JOBS
  compute-0   1/1     Running   node-0   ALLOCATED             -     7 alice job7 (ends in 10m at the latest); 8 alice job8 (ends in 25m at the latest)
  compute-1   1/1     Running   node-1   IDLE                  -     -
  compute-2   1/1     Running   node-1   IDLE+NOT_RESPONDING   -     -

Bridge pods
  POD        PHASE     NODE   JOB   JOB STATE   WHY
  apps/web   Pending   -      20    PENDING     Resources

why is web Pending: kubectl slinky why web -n apps"""


def test_status_joins_pods_nodes_slurm_nodes_and_jobs() -> None:
    data = status.build(world())
    assert status.text(data) == STATUS
    compute0 = data["nodesets"][0]["pods"][0]
    assert [j["id"] for j in compute0["jobs"]] == [7, 8]
    assert compute0["jobs"][1]["secondsLeft"] == 25 * 60
    assert data["bridgePods"][0]["jobReason"] == "Resources"


def test_status_of_an_unknown_name_says_so() -> None:
    with pytest.raises(status.NotFound, match="no Cluster or NodeSet named 'nope'"):
        status.build(world(), "nope")


PLAN_SCALE_0 = """\
Scale NodeSet slurm/compute from 3 to 0 replicas
  #   POD         SLURM STATE           BLOCKED BY                                                                                 GOES
  1   compute-2   IDLE+NOT_RESPONDING   -                                                                                          now
  2   compute-1   IDLE                  -                                                                                          now
  3   compute-0   ALLOCATED             7 alice job7 (ends by 2027-01-15 08:10:00Z); 8 alice job8 (ends by 2027-01-15 08:25:00Z)   in 25m (2027-01-15 08:25:00Z)
  queued in its partition: 9 (alice)
  note: 1 jobs queued in partition compute wait for nodes (the partition stays; an autoscaler brings nodes back for them)
  completes at the latest in 25m (2027-01-15 08:25:00Z)"""


def test_plan_scale_to_zero_names_the_busy_pod_its_jobs_and_when_it_goes() -> None:
    data = plan.plan_scale(world(), "compute", 0)
    assert plan.text(data) == PLAN_SCALE_0
    assert [s["pod"] for s in data["steps"]] == ["compute-2", "compute-1", "compute-0"]
    assert data["completesIn"] == 25 * 60


def test_plan_scale_in_by_one_takes_the_operators_first_victim() -> None:
    # The operator's order: an unavailable pod before a ready one, idle before busy,
    # then the highest ordinal.
    steps = plan.plan_scale(world(), "compute", 2)["steps"]
    assert [s["pod"] for s in steps] == ["compute-2"]


def test_plan_delete_runs_the_queued_jobs_first() -> None:
    data = plan.plan_delete(world(), "compute")
    # job 9 (2 nodes, 30 min) starts when the two idle nodes are free (now) and ends in 30m.
    assert data["completesIn"] == 30 * 60
    assert [j["id"] for j in data["queued"]] == [9]


def test_plan_rollout_from_a_changed_template_replaces_every_pod_one_at_a_time() -> None:
    w = world()
    new = {
        "kind": "NodeSet",
        "spec": {"template": {"spec": {"containers": [{"name": "slurmd", "image": "y"}]}}},
    }
    data = plan.plan_rollout(w, "compute", new)
    assert data["maxUnavailable"] == 1
    assert len(data["steps"]) == 3
    # compute-2 (unavailable in Slurm: NOT_RESPONDING) costs nothing; then one at a time
    assert data["steps"][0]["pod"] == "compute-2" and data["steps"][0]["goesIn"] == 0


def test_why_a_pending_bridge_pod_gives_slurms_reason_and_what_it_asked() -> None:
    w = world()
    data = why.explain_pod(w, w.pods[3], [])
    assert why.text(data) == (
        "Pod apps/web\n"
        "  the bridge says: SlurmPending: job 20 waits: Resources\n"
        "  placeholder job 20 is PENDING, Slurm's reason: Resources\n"
        "  asked of Slurm: timelimit=5"
    )


def test_why_a_condemned_busy_pod_names_its_jobs() -> None:
    w = world()
    w.pods[0]["metadata"]["annotations"] = {"nodeset.slinky.slurm.net/condemned": "scale-in"}
    lines = why.explain_pod(w, w.pods[0], [])["why"]
    assert lines[0] == "leaving: scale-in"
    assert "finish 2 jobs: 7 alice job7 (ends in 10m at the latest)" in lines[1]
    w.pods[0]["metadata"]["annotations"].update(
        {
            "nodeset.slinky.slurm.net/condemned-at": "2026-11-26T12:00:00Z",
            "nodeset.slinky.slurm.net/drain-deadline": "2026-11-26T12:10:00Z",
        }
    )
    out = why.explain_pod(w, w.pods[0], [])
    assert out["why"][1] == (
        "condemned since 2026-11-26T12:00:00Z; its node's jobs end by 2026-11-26T12:10:00Z "
        "at the latest (time limits)"
    )
    assert out["pod"]["drainDeadline"] == "2026-11-26T12:10:00Z"


def test_flags_are_kubectls() -> None:
    args = build_parser().parse_args(["status", "compute", "-n", "x", "-o", "json"])
    assert (args.namespace, args.output, args.name) == ("x", "json", "compute")
    args = build_parser().parse_args(["plan", "scale", "compute", "0", "-A"])
    assert (args.plan, args.nodeset, args.replicas, args.all_namespaces) == (
        "scale",
        "compute",
        0,
        True,
    )


def test_flags_before_the_subcommand_count_too() -> None:
    args = build_parser().parse_args(["-n", "foo", "--kubeconfig", "k", "-o", "json", "status"])
    assert (args.namespace, args.kubeconfig, args.output) == ("foo", "k", "json")
    args = build_parser().parse_args(["plan", "-n", "foo", "scale", "compute", "1"])
    assert args.namespace == "foo"


def test_a_bridge_pods_job_id_in_another_slurm_is_not_its_job() -> None:
    w = world()
    w.slurm["slurm/slurm"].jobs[20].raw["admin_comment"] = json.dumps(
        {"scheduler": "s", "pods": ["apps/other"], "uids": ["x"]}
    )
    entry = status.bridge_entry(w, w.pods[3])
    assert entry["jobState"] == "not found in Slurm" and entry["jobReason"] is None


def test_plan_rollout_follows_the_update_strategy_and_pending_scale_in() -> None:
    w = world()
    w.nodesets[0]["spec"]["updateStrategy"] = {"type": "OnDelete"}
    new = {
        "kind": "NodeSet",
        "spec": {"template": {"spec": {"containers": [{"name": "slurmd", "image": "y"}]}}},
    }
    data = plan.plan_rollout(w, "compute", new)
    assert data["steps"] == [] and "OnDelete" in data["notes"][0]
    w = world()
    w.nodesets[0]["spec"]["replicas"] = 2
    data = plan.plan_rollout(w, "compute", new)
    assert data["steps"] == [] and "scale-in runs first" in data["notes"][0]


def test_plan_delete_says_a_queued_job_larger_than_the_nodeset_blocks_it() -> None:
    w = world()
    w.slurm["slurm/slurm"].jobs[9] = job(9, "", state="PENDING", minutes_left=None, count=5)
    data = plan.plan_delete(w, "compute")
    assert data["completesAt"] is None
    assert any("more nodes than the NodeSet has" in n for n in data["notes"])


def test_plan_delete_of_idle_nodes_with_a_queued_job_of_no_limit_blames_no_running_job() -> None:
    """No job holds the idle nodes: the queued job that runs there first is named, and with
    its partition's MaxTime known that limit is the bound."""
    w = world()
    w.pods = [p for p in w.pods if p["metadata"]["name"] != "compute-0"]  # 2 idle, 1 gone
    w.slurm["slurm/slurm"].jobs = {
        9: job(9, "", state="PENDING", minutes_left=None, count=2, limit=None)
    }
    data = plan.plan_delete(w, "compute")
    out = plan.text(data)
    assert "without a time limit holds" not in out and "(a job without a time limit)" not in out
    assert "queued job 9 has no time limit and runs on compute-1, compute-2 first" in out
    w.slurm["slurm/slurm"].partitions = {
        "compute": Partition.parse(
            {"name": "compute", "maximums": {"time": {"set": True, "number": 60}}}
        )
    }
    data = plan.plan_delete(w, "compute")
    assert data["completesIn"] == 60 * 60, plan.text(data)


def test_plan_delete_blocked_by_a_too_large_queued_job_says_that_and_not_time_limits() -> None:
    w = world()
    w.slurm["slurm/slurm"].jobs[9] = job(9, "", state="PENDING", minutes_left=None, count=5)
    out = plan.text(plan.plan_delete(w, "compute"))
    assert "without a time limit" not in out, out
    assert "completes: unknown (see the notes)" in out


STATUS_UNREACHABLE = """\
Cluster slurm/slurm: Ready; slurmrestd http://slurm:6820
  cannot read Slurm: slurmrestd http://slurm:6820 unreachable (GET /nodes): refused

NodeSet slurm/compute (partition compute): desired 3, ready 3, idle, allocated, draining, down: unknown (Slurm not read)
  ! SlurmNodesResponding=False SlurmNodeNotResponding: compute-2 does not respond
  POD         READY   PHASE     NODE     SLURM STATE                  WHY   JOBS
  compute-0   1/1     Running   node-0   unknown: Slurm unreachable   -     unknown
  compute-1   1/1     Running   node-1   unknown: Slurm unreachable   -     unknown
  compute-2   1/1     Running   node-1   unknown: Slurm unreachable   -     unknown

Bridge pods
  POD        PHASE     NODE   JOB   JOB STATE   WHY
  apps/web   Pending   -      20    unknown     SlurmPending: job 20 waits: Resources

Slurm of Cluster slurm/slurm not read: where http://slurm:6820 is reachable only inside the cluster, forward it (kubectl -n slurm port-forward svc/slurm 6820) and pass --slurm-server=http://127.0.0.1:6820
why is web Pending: kubectl slinky why web -n apps"""


def test_status_with_slurm_unreachable_says_unknown_not_unregistered() -> None:
    w = world()
    w.slurm["slurm/slurm"] = SlurmSide(
        "slurm/slurm",
        "http://slurm:6820",
        error="slurmrestd http://slurm:6820 unreachable (GET /nodes): refused",
        unreachable=True,
    )
    out = status.text(status.build(w))
    assert "not registered" not in out and "not found in Slurm" not in out
    assert out == STATUS_UNREACHABLE


async def test_reading_an_unreachable_slurm_leaves_no_request_running(
    unused_tcp_port: int,
) -> None:
    """All three lists end before the client is closed: one left running would open a new
    session after the close (aiohttp's "Unclosed client session" at exit)."""

    class Kube:
        async def get(self, res: object, name: str, ns: str) -> JSON:
            return {"data": {"jwt_hs256.key": base64.b64encode(b"k" * 32).decode()}}

    cluster = world().clusters[0]
    server = f"http://127.0.0.1:{unused_tcp_port}"  # nothing listens there
    side = await read_slurm(cast(Any, Kube()), cluster, server=server)
    assert side.unreachable and "unreachable" in side.error
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert others == []
