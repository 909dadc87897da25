"""A Slurm node that outlived its slurmd pod (the pod's preStop could not delete it:
slurmctld was down then, or restarted from state saved before the delete; the soak saw
batch-1 stay DOWN with no pod for 20 minutes) is deleted by its NodeSet: only a node of this
NodeSet's naming, claimed by that pod (or by none), with no pod of that name, no job, and
its slurmd not responding, confirmed by a fresh read."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import httpx2

from slinky.api.schema import parse
from slinky.api.v1alpha1.nodeset import NodeSetSpec
from slinky.operator.clients import Connection
from slinky.operator.nodeset import mirror
from slinky.operator.nodeset.partition import Partitions
from slinky.operator.nodeset.sync import NodeSetSync
from slinky.operator.nodeset.view import View
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.models import Node
from slinky.slurm.tokens import StaticToken
from tests.unit.fake_http import MockTransport

JSON = dict[str, Any]
OPENAPI = {"paths": {"/slurm/v0.0.45/ping/": {}}}


def node(name: str, state: list[str], namespace: str = "ns", pod: str | None = None) -> JSON:
    """A dynamic node (as `slurmd -Z` registers) in `state`, claimed by `pod` in `namespace`."""
    comment = json.dumps({"namespace": namespace, "podName": pod or name})
    return {"name": name, "state": [*state, "DYNAMIC_NORM"], "comment": comment}


class Slurm:
    """slurmrestd's answers: the nodes it knows now (the live read), and the deletes."""

    def __init__(self, nodes: list[JSON]) -> None:
        self.nodes = {n["name"]: n for n in nodes}
        self.deleted: list[str] = []
        self.updated: list[tuple[str, JSON]] = []

    def handler(self, req: httpx2.Request) -> httpx2.Response:
        if req.url.path == "/openapi/v3":
            return httpx2.Response(200, json=OPENAPI)
        name = req.url.path.rstrip("/").rsplit("/", 1)[-1]
        if req.method == "DELETE":
            self.deleted.append(name)
            self.nodes.pop(name, None)
            return httpx2.Response(200, json={})
        if req.method == "POST":
            self.updated.append((name, json.loads(req.content)))
            return httpx2.Response(200, json={})
        found = [self.nodes[name]] if name in self.nodes else []
        return httpx2.Response(200, json={"nodes": found})


def setup(
    cached: list[JSON], pods: list[str], live: list[JSON] | None = None
) -> tuple[NodeSetSync, View, Slurm, list[tuple[str, str]]]:
    slurm = Slurm(live if live is not None else cached)
    client = SlurmClient("http://slurm.test", StaticToken("t", user="u"))
    client.http = MockTransport(client.url, slurm.handler)
    informer = SlurmInformer(client)
    informer._synced.set()
    informer.stale = False
    informer._last_poll_done = time.monotonic()
    informer.nodes = {n["name"]: Node.parse(n) for n in cached}
    conn = Connection("ns/slurm", "cuid", client.url, client, informer, "fp")
    obj = {"metadata": {"name": "cpu", "namespace": "ns", "uid": "nsuid"}, "spec": {}}
    spec = parse(NodeSetSpec, {"clusterName": "slurm", "selector": {}, "template": {}}, "spec")
    active = {p: {"metadata": {"name": p, "namespace": "ns"}} for p in pods}
    view = View(obj, spec, "ns/cpu", "ns/cpu/nsuid", "rev", None, conn, active, {})
    said: list[tuple[str, str]] = []
    sync = NodeSetSync.__new__(NodeSetSync)
    sync.partitions = Partitions()
    sync.ctx = SimpleNamespace(  # type: ignore[assignment]
        recorder=SimpleNamespace(event=lambda _o, _t, reason, msg, **_k: said.append((reason, msg)))
    )
    return sync, view, slurm, said


async def test_a_node_whose_pod_is_gone_is_deleted_with_an_event() -> None:
    gone = node("cpu-1", ["DOWN", "DRAIN", "DYNAMIC_NORM", "NOT_RESPONDING"])
    # A slurmctld restarted from older state may have lost the comment as well.
    uncommented = {"name": "cpu-7", "state": ["IDLE", "DYNAMIC_NORM", "NOT_RESPONDING"]}
    sync, view, slurm, said = setup([node("cpu-0", ["IDLE"]), gone, uncommented], pods=["cpu-0"])
    await sync.forget_departed(view)
    assert slurm.deleted == ["cpu-1", "cpu-7"]
    reason, message = said[0]
    assert reason == "SlurmNodeDeleted" and "cpu-1" in message and "outlived its pod" in message


async def test_only_nodes_of_this_nodeset_without_pod_or_job_are_touched() -> None:
    gone = "NOT_RESPONDING"
    cached = [
        node("cpu-0", ["IDLE", gone]),  # its pod exists
        node("cpu-1", ["IDLE"]),  # its slurmd still answers
        node("cpu-2", ["ALLOCATED", gone]),  # runs a job: Slurm's to handle
        node("cpu-3", ["MIXED", "COMPLETING", gone]),  # one job completing, one running
        node("cpu-4", ["DOWN", gone], namespace="other"),  # another namespace's pod's
        node("cpu-5", ["DOWN", gone], pod="cpu-6"),  # claimed by another pod
        node("cpu-x", ["DOWN", gone]),  # not an ordinal of this NodeSet
        node("cpu-1-0", ["DOWN", gone]),  # NodeSet cpu-1's
        {"name": "cpu-8", "state": ["DOWN", gone]},  # a node of slurm.conf, not dynamic
    ]
    sync, view, slurm, said = setup(cached, pods=["cpu-0"])
    assert mirror.departed(view) == []
    await sync.forget_departed(view)
    assert slurm.deleted == [] and slurm.updated == [] and said == []


async def test_a_node_whose_ended_jobs_wait_completing_on_the_gone_slurmd_is_set_down_first() -> (
    None
):
    """The soak: a job slurmctld restored as running after a kill -9 timed out on batch-1,
    whose pod was gone; it stayed COMPLETING (no slurmd to run its epilog) until
    SlurmdTimeout set the node DOWN, 5 minutes later."""
    completing = node("cpu-1", ["IDLE", "COMPLETING", "NOT_RESPONDING"])
    sync, view, slurm, said = setup([completing], pods=[])
    await sync.forget_departed(view)
    assert slurm.deleted == []
    ((name, body),) = slurm.updated
    assert name == "cpu-1" and body["state"] == ["DOWN"] and "pod is gone" in body["reason"]
    assert said[0][0] == "SlurmNodeDown"
    down = node("cpu-1", ["DOWN", "NOT_RESPONDING"])  # Slurm ended the COMPLETING jobs
    slurm.nodes["cpu-1"] = down
    view.conn.informer.nodes["cpu-1"] = Node.parse(down)  # type: ignore[union-attr]
    await sync.forget_departed(view)
    assert slurm.deleted == ["cpu-1"] and said[1][0] == "SlurmNodeDeleted"


async def test_the_fresh_read_decides_and_a_terminating_pod_keeps_its_node() -> None:
    gone = ["IDLE", "NOT_RESPONDING"]
    cached = [node("cpu-1", gone), node("cpu-2", gone), node("cpu-3", gone), node("cpu-4", gone)]
    live = [
        node("cpu-1", ["ALLOCATED", "NOT_RESPONDING"]),
        node("cpu-2", gone, pod="cpu-9"),
        node("cpu-4", ["IDLE"]),  # its slurmd answers again
    ]
    sync, view, slurm, said = setup(cached, pods=[], live=live)
    view.terminating["cpu-3"] = {"metadata": {"name": "cpu-3", "namespace": "ns"}}
    assert [n.name for n in mirror.departed(view)] == ["cpu-1", "cpu-2", "cpu-4"]
    await sync.forget_departed(view)  # cpu-1 took a job, cpu-2 is another pod's now
    assert slurm.deleted == [] and said == []


async def test_nothing_is_decided_on_a_stale_slurm_view() -> None:
    sync, view, slurm, _ = setup([node("cpu-1", ["DOWN", "NOT_RESPONDING"])], pods=[])
    assert view.conn is not None
    view.conn.informer.stale = True
    await sync.forget_departed(view)
    assert slurm.deleted == []
