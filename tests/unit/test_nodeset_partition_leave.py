"""A NodeSet's own partition and the deletion of its Slurm nodes (soak seed 26: slurmctld
could not start again, "Invalid node names in partition compute").

slurmctld saves node and partition state in separate files, a few seconds after each change;
a node deleted while the saved partition still names it leaves a state a restart refuses.
So: a node leaves the partition first (at its condemnation), and its Slurm node is deleted
only `STATE_SAVE_S` after that, by the operator, before the pod; a partition update names
only nodes Slurm has; one that Slurm lost a node of is written again (so it is saved).

Against a stand-in slurmrestd that answers as Slurm does (an update naming an unknown node
is refused as a whole) and logs every write, with the monotonic clock moved by hand."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest

from slinky.api.schema import parse
from slinky.api.v1alpha1.nodeset import NodeSetSpec
from slinky.operator.clients import Connection
from slinky.operator.nodeset import partition, scalein
from slinky.operator.nodeset.builder import ANNOTATION_CONDEMNED
from slinky.operator.nodeset.joins import JOIN_AFTER_S
from slinky.operator.nodeset.partition import ANNOTATION_PARTITION, Partitions, members
from slinky.operator.nodeset.sync import NodeSetSync
from slinky.operator.nodeset.view import View
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.models import Node, Partition
from slinky.slurm.tokens import StaticToken
from tests.unit.fake_http import MockTransport

JSON = dict[str, Any]
OPENAPI = {"paths": {"/slurm/v0.0.45/ping/": {}}}
INVALID_NODE = {"errors": [{"error_number": 2018, "error": "Invalid node name specified"}]}


def slurm_node(name: str, state: list[str], pod: str | None = None) -> JSON:
    comment = json.dumps({"namespace": "ns", "podName": pod or name})
    return {"name": name, "state": [*state, "DYNAMIC_NORM"], "comment": comment}


class Slurm:
    """slurmrestd's answers for nodes and one partition; `writes` logs what changed Slurm,
    in order: ("partition", nodes), ("delete", node)."""

    def __init__(self, nodes: list[JSON], part_nodes: str) -> None:
        self.nodes = {n["name"]: n for n in nodes}
        self.part_nodes = part_nodes
        self.writes: list[tuple[str, str]] = []

    def handler(self, req: httpx2.Request) -> httpx2.Response:
        path = req.url.path
        if path == "/openapi/v3":
            return httpx2.Response(200, json=OPENAPI)
        if path.endswith("/partitions/") and req.method == "POST":
            (body,) = json.loads(req.content)["partitions"]
            nodes = body["nodes"]["configured"]
            if any(n not in self.nodes for n in nodes.split(",") if n):
                return httpx2.Response(500, json=INVALID_NODE)
            self.part_nodes = nodes
            self.writes.append(("partition", nodes))
            return httpx2.Response(200, json={})
        if path.endswith("/nodes/"):
            return httpx2.Response(200, json={"nodes": list(self.nodes.values())})
        name = path.rstrip("/").rsplit("/", 1)[-1]
        if req.method == "DELETE":
            self.nodes.pop(name, None)
            self.writes.append(("delete", name))
            return httpx2.Response(200, json={})
        if req.method == "POST":
            return httpx2.Response(200, json={})
        found = [self.nodes[name]] if name in self.nodes else []
        return httpx2.Response(200, json={"nodes": found})


class Clock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr(time, "monotonic", lambda: self.now)


class PodControl:
    def __init__(self) -> None:
        self.deleted: list[str] = []
        self.slurm: Slurm | None = None

    async def delete_pod(self, _exp: str, pod: JSON) -> bool:
        self.deleted.append(pod["metadata"]["name"])
        if self.slurm is not None:
            self.slurm.writes.append(("pod", pod["metadata"]["name"]))
        return True

    async def patch_metadata(self, pod: JSON, *, annotations: JSON) -> None:
        pod["metadata"].setdefault("annotations", {}).update(annotations)


def a_pod(name: str, *, condemned: str | None = None) -> JSON:
    annotations = {ANNOTATION_CONDEMNED: condemned} if condemned else {}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"u-{name}",
            "annotations": annotations,
        },
        "spec": {"nodeName": "k1"},
    }


class Bed:
    def __init__(self, slurm: Slurm, pods: list[JSON], *, shown: str | None) -> None:
        self.slurm = slurm
        client = SlurmClient("http://slurm.test", StaticToken("t", user="u"), retries=1)
        client.http = MockTransport(client.url, slurm.handler)
        informer = SlurmInformer(client)
        informer._synced.set()
        informer.stale = False
        informer._last_poll_done = time.monotonic()
        informer.partitions_synced = True
        self.informer = informer
        self.show_nodes(shown)
        self.conn = Connection("ns/slurm", "cuid", client.url, client, informer, "fp")
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.partitions = Partitions()
        self.podcontrol = PodControl()
        self.podcontrol.slurm = slurm
        self.events: list[str] = []
        self.ctx: Any = SimpleNamespace(
            podcontrol=self.podcontrol,
            recorder=SimpleNamespace(
                event=lambda _o, _t, reason, *_a, **_k: self.events.append(reason)
            ),
            partitions=self.partitions,
        )

    def show_nodes(self, shown: str | None) -> None:
        """What the informer last polled: Slurm's nodes and the partition."""
        self.informer.nodes = {n: Node.parse(raw) for n, raw in self.slurm.nodes.items()}
        self.informer.partitions = (
            {}
            if shown is None
            else {"cpu": Partition.parse({"name": "cpu", "nodes": {"configured": shown}})}
        )

    def view(self) -> View:
        obj = {
            "metadata": {
                "name": "cpu",
                "namespace": "ns",
                "uid": "nsuid",
                "annotations": {ANNOTATION_PARTITION: "cpu"},
            },
            "spec": {},
        }
        spec = parse(
            NodeSetSpec,
            {
                "clusterName": "slurm",
                "selector": {},
                "template": {},
                "partition": {"enabled": True},
            },
            "spec",
        )
        active = {n: p for n, p in self.pods.items() if n not in self.podcontrol.deleted}
        return View(obj, spec, "ns/cpu", "ns/cpu/nsuid", "rev", None, self.conn, active, {})


def idle_drained_bed(monkeypatch: pytest.MonkeyPatch) -> tuple[Bed, Clock]:
    clock = Clock(monkeypatch)
    slurm = Slurm(
        [slurm_node("cpu-0", ["IDLE"]), slurm_node("cpu-1", ["IDLE", "DRAIN"])], "cpu-[0-1]"
    )
    return Bed(slurm, [a_pod("cpu-0"), a_pod("cpu-1")], shown="cpu-[0-1]"), clock


def test_the_partition_lists_registered_pods_that_stay() -> None:
    slurm = Slurm(
        [slurm_node(n, ["IDLE"]) for n in ("cpu-0", "cpu-1", "cpu-2", "cpu-3")], "cpu-[0-3]"
    )
    pods = [a_pod("cpu-0"), a_pod("cpu-1", condemned="scale-in"), a_pod("cpu-2"), a_pod("cpu-4")]
    bed = Bed(slurm, pods, shown="cpu-[0-3]")
    view = bed.view()
    view.leaving.add("cpu-2")
    view.terminating["cpu-3"] = a_pod("cpu-3")
    # cpu-1 condemned, cpu-2 taken out now, cpu-3 terminating, cpu-4 never registered.
    assert members(view) == ["cpu-0"]


async def test_a_drained_pod_leaves_the_partition_then_its_node_then_the_pod_goes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bed, clock = idle_drained_bed(monkeypatch)
    view = bed.view()
    waiting = await scalein.remove_all(bed.ctx, view, [bed.pods["cpu-1"]], "scale-in", "r")
    # Out of the partition at once; the node and the pod wait for slurmctld's save.
    assert waiting == {"cpu-1": scalein.Drained.PARTITION}
    assert bed.slurm.writes == [("partition", "cpu-0")]
    assert view.recheck == [partition.STATE_SAVE_S]
    assert bed.pods["cpu-1"]["metadata"]["annotations"][ANNOTATION_CONDEMNED] == "scale-in"

    clock.now += partition.STATE_SAVE_S - 1
    bed.show_nodes("cpu-0")
    view = bed.view()
    assert await scalein.remove_all(bed.ctx, view, [bed.pods["cpu-1"]], "scale-in", "r")
    assert bed.slurm.writes == [("partition", "cpu-0")]
    assert view.recheck == [1.0]

    clock.now += 1
    view = bed.view()
    assert await scalein.remove_all(bed.ctx, view, [bed.pods["cpu-1"]], "scale-in", "r") == {}
    assert bed.slurm.writes == [("partition", "cpu-0"), ("delete", "cpu-1"), ("pod", "cpu-1")]
    assert "SlurmNodeDeleted" in bed.events and "Deleted" in bed.events


async def test_a_partition_that_cannot_be_written_keeps_the_pod(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bed, clock = idle_drained_bed(monkeypatch)
    refuse = bed.slurm.handler

    def down(req: httpx2.Request) -> httpx2.Response:
        if req.url.path.endswith("/partitions/"):
            return httpx2.Response(503, json={})
        return refuse(req)

    bed.slurm.handler = down  # type: ignore[method-assign]
    bed.conn.client.http = MockTransport(bed.conn.client.url, down)
    for _ in range(3):
        view = bed.view()
        waiting = await scalein.remove_all(bed.ctx, view, [bed.pods["cpu-1"]], "scale-in", "r")
        assert waiting == {"cpu-1": scalein.Drained.PARTITION}
        assert view.recheck == [partition.RETRY_S]
        clock.now += 60
    assert bed.slurm.writes == [] and bed.podcontrol.deleted == []


async def test_after_an_operator_restart_the_wait_starts_when_it_sees_the_node_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bed, clock = idle_drained_bed(monkeypatch)
    bed.show_nodes("cpu-0")  # taken out by the operator before its restart
    view = bed.view()
    assert await scalein.remove_all(bed.ctx, view, [bed.pods["cpu-1"]], "scale-in", "r")
    assert bed.slurm.writes == [] and view.recheck == [partition.STATE_SAVE_S]
    clock.now += partition.STATE_SAVE_S
    assert await scalein.remove_all(bed.ctx, bed.view(), [bed.pods["cpu-1"]], "scale-in", "r") == {}
    assert bed.slurm.writes == [("delete", "cpu-1"), ("pod", "cpu-1")]


async def test_without_a_partition_of_its_own_the_pod_goes_at_once() -> None:
    slurm = Slurm([slurm_node("cpu-0", ["IDLE", "DRAIN"])], "")
    bed = Bed(slurm, [a_pod("cpu-0")], shown=None)
    view = bed.view()
    view.obj["metadata"]["annotations"] = {}
    assert await scalein.remove_all(bed.ctx, view, [bed.pods["cpu-0"]], "scale-in", "r") == {}
    assert slurm.writes == [("pod", "cpu-0")]  # the pod's preStop deletes the Slurm node


async def test_a_write_naming_a_node_slurm_lost_is_filtered_by_a_live_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock(monkeypatch)
    slurm = Slurm([slurm_node("cpu-0", ["IDLE"]), slurm_node("cpu-1", ["IDLE"])], "cpu-0")
    bed = Bed(slurm, [a_pod("cpu-0"), a_pod("cpu-1")], shown="cpu-0")
    await bed.partitions.sync(bed.ctx, bed.view())  # cpu-1 waits to join (joins.py)
    clock.now += JOIN_AFTER_S
    # The informer still shows cpu-1, which someone deleted since its poll.
    del slurm.nodes["cpu-1"]
    outcome = await bed.partitions.sync(bed.ctx, bed.view())
    assert outcome is not None and outcome.ok, outcome
    assert slurm.writes == [("partition", "cpu-0")]


async def test_a_node_deleted_by_someone_else_makes_the_partition_written_again() -> None:
    # Slurm dropped cpu-1 from the partition in memory when it was deleted, but the saved
    # partition still names it until the partition is written again.
    slurm = Slurm([slurm_node("cpu-0", ["IDLE"]), slurm_node("cpu-1", ["IDLE"])], "cpu-[0-1]")
    bed = Bed(slurm, [a_pod("cpu-0"), a_pod("cpu-1")], shown="cpu-[0-1]")
    await bed.partitions.sync(bed.ctx, bed.view())
    assert slurm.writes == []  # as wanted: nothing sent
    del slurm.nodes["cpu-1"]
    bed.pods.pop("cpu-1")
    bed.show_nodes("cpu-0")
    await bed.partitions.sync(bed.ctx, bed.view())
    assert slurm.writes == [("partition", "cpu-0")]
    await bed.partitions.sync(bed.ctx, bed.view())
    assert slurm.writes == [("partition", "cpu-0")]  # once


async def test_a_departed_node_is_deleted_only_once_out_of_the_partition_long_enough(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`kubectl delete pod`: its preStop waited for the node to leave the partition in vain
    (DOWN, its reason) and the pod is gone."""
    clock = Clock(monkeypatch)
    down = {**slurm_node("cpu-1", ["DOWN", "DRAIN"]), "reason": "slurm-operator: pod terminating"}
    slurm = Slurm([slurm_node("cpu-0", ["IDLE"]), down], "cpu-[0-1]")
    bed = Bed(slurm, [a_pod("cpu-0")], shown="cpu-[0-1]")
    sync = NodeSetSync.__new__(NodeSetSync)
    sync.partitions = bed.partitions
    sync.ctx = bed.ctx
    await bed.partitions.sync(bed.ctx, bed.view())  # writes the partition without cpu-1
    view = bed.view()
    await sync.forget_departed(view)
    assert slurm.writes == [("partition", "cpu-0")] and view.recheck == [partition.STATE_SAVE_S]
    clock.now += partition.STATE_SAVE_S
    await sync.forget_departed(bed.view())
    assert slurm.writes == [("partition", "cpu-0"), ("delete", "cpu-1")]


# After an operator restart (or a failover) nothing is known of what was written; until the
# first partition list comes, a node may still be in the partition (review of the change).


def restarted(bed: Bed) -> Bed:
    bed.informer.partitions_synced = False
    bed.informer.partitions = {}
    return bed


async def test_after_a_restart_nothing_is_written_before_the_first_partition_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Which nodes the partition names is not known yet, so neither is which of the others
    must wait to join (joins.py): the drained pod waits for the list, then its write."""
    clock = Clock(monkeypatch)
    slurm = Slurm(
        [slurm_node("cpu-0", ["IDLE"]), slurm_node("cpu-1", ["IDLE", "DRAIN"])], "cpu-[0-1]"
    )
    bed = restarted(Bed(slurm, [a_pod("cpu-0"), a_pod("cpu-1", condemned="scale-in")], shown=None))
    view = bed.view()
    assert await scalein.remove_all(bed.ctx, view, [bed.pods["cpu-1"]], "scale-in", "r")
    assert slurm.writes == [] and view.recheck == [partition.RETRY_S]
    bed.informer.partitions_synced = True
    bed.show_nodes("cpu-[0-1]")
    assert await scalein.remove_all(bed.ctx, bed.view(), [bed.pods["cpu-1"]], "scale-in", "r")
    assert slurm.writes == [("partition", "cpu-0")], "cpu-0 stays: the partition names it"
    clock.now += partition.STATE_SAVE_S - 1
    bed.show_nodes("cpu-[0-1]")  # a list asked for before the write
    assert await scalein.remove_all(bed.ctx, bed.view(), [bed.pods["cpu-1"]], "scale-in", "r")
    assert slurm.writes == [("partition", "cpu-0")]
    clock.now += 1
    bed.show_nodes("cpu-0")
    assert await scalein.remove_all(bed.ctx, bed.view(), [bed.pods["cpu-1"]], "scale-in", "r") == {}
    assert slurm.writes == [("partition", "cpu-0"), ("delete", "cpu-1"), ("pod", "cpu-1")]


async def test_a_nodeset_deleted_across_a_restart_takes_its_nodes_out_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock(monkeypatch)
    slurm = Slurm([slurm_node("cpu-0", ["IDLE", "DRAIN"])], "cpu-0")
    bed = restarted(Bed(slurm, [a_pod("cpu-0", condemned="nodeset deleted")], shown=None))
    for _ in range(3):
        view = bed.view()
        view.obj["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"
        await scalein.remove_all(bed.ctx, view, list(view.active.values()), "nodeset deleted", "r")
        if not bed.informer.partitions_synced:
            assert slurm.writes == []  # the first list is waited for
            bed.informer.partitions_synced = True
            bed.show_nodes("cpu-0")
            continue
        clock.now += partition.STATE_SAVE_S
    assert slurm.writes == [("partition", ""), ("delete", "cpu-0"), ("pod", "cpu-0")]


async def test_a_departed_node_after_a_restart_is_taken_out_then_deleted_in_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock(monkeypatch)
    down = {**slurm_node("cpu-1", ["DOWN", "DRAIN"]), "reason": "slurm-operator: pod terminating"}
    slurm = Slurm([slurm_node("cpu-0", ["IDLE"]), down], "cpu-[0-1]")
    bed = restarted(Bed(slurm, [a_pod("cpu-0")], shown=None))
    sync = NodeSetSync.__new__(NodeSetSync)
    sync.partitions = bed.partitions
    sync.ctx = bed.ctx
    await sync.forget_departed(bed.view())
    assert slurm.writes == []  # the first list is waited for
    bed.informer.partitions_synced = True
    bed.show_nodes("cpu-[0-1]")
    await sync.forget_departed(bed.view())
    assert slurm.writes == [("partition", "cpu-0")]
    clock.now += partition.STATE_SAVE_S / 2
    bed.show_nodes("cpu-0")
    await sync.forget_departed(bed.view())
    assert slurm.writes == [("partition", "cpu-0")]
    clock.now += partition.STATE_SAVE_S / 2
    await sync.forget_departed(bed.view())
    assert slurm.writes == [("partition", "cpu-0"), ("delete", "cpu-1")]


async def test_a_node_slurm_put_back_waits_again_from_its_next_removal(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """slurmctld restarted from partition state saved before our write: the node is back."""
    bed, clock = idle_drained_bed(monkeypatch)
    await scalein.remove_all(bed.ctx, bed.view(), [bed.pods["cpu-1"]], "scale-in", "r")
    clock.now += partition.STATE_SAVE_S
    bed.informer.partitions_read_at = clock.now
    bed.show_nodes("cpu-[0-1]")
    view = bed.view()
    assert await scalein.remove_all(bed.ctx, view, [bed.pods["cpu-1"]], "scale-in", "r")
    assert bed.slurm.writes == [("partition", "cpu-0"), ("partition", "cpu-0")]
    assert view.recheck == [partition.STATE_SAVE_S]


async def test_options_slurm_refuses_do_not_keep_a_node_in_the_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A partition Slurm may have lost is written whole; refused (an unknown topology), its
    nodes are written alone."""
    Clock(monkeypatch)
    slurm = Slurm([slurm_node("cpu-0", ["IDLE"]), slurm_node("cpu-1", ["IDLE", "DRAIN"])], "")
    bed = Bed(slurm, [a_pod("cpu-0"), a_pod("cpu-1")], shown="cpu-[0-1]")
    await bed.partitions.sync(bed.ctx, bed.view())  # as wanted: nothing written
    bed.show_nodes(None)  # slurmctld lost the partition
    whole = slurm.handler

    def no_topology(req: httpx2.Request) -> httpx2.Response:
        if req.url.path.endswith("/partitions/") and b"topology" in req.content:
            return httpx2.Response(500, json={"errors": [{"error_number": 2106, "error": "x"}]})
        return whole(req)

    bed.conn.client.http = MockTransport(bed.conn.client.url, no_topology)
    view = bed.view()
    view.spec.partition.config = "Topology=nope"  # type: ignore[union-attr]
    waits = await bed.partitions.release(view, {"cpu-1"})
    assert waits == {"cpu-1": partition.STATE_SAVE_S}
    assert slurm.writes == [("partition", "cpu-0")]
