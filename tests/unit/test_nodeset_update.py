"""The rolling update pass by pass, on the views the operator had: pods as its cache showed
them, Slurm nodes as its last poll showed them, and slurmctld (answering the live reads of
drain and the drained check) as it really was."""

from __future__ import annotations

import datetime as dt
import json
import time
from types import SimpleNamespace
from typing import Any

import httpx2

from slinky.api.schema import parse
from slinky.api.v1alpha1.nodeset import NodeSetSpec
from slinky.kube.expectations import Expectations
from slinky.operator.clients import Connection
from slinky.operator.nodeset import scalein, update
from slinky.operator.nodeset.builder import ANNOTATION_CONDEMNED, LABEL_REVISION
from slinky.operator.nodeset.mirror import REGISTRATION_WINDOW_S
from slinky.operator.nodeset.podcontrol import PodControl
from slinky.operator.nodeset.view import Context, View
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.models import Node
from slinky.slurm.tokens import StaticToken
from tests.unit.fake_http import MockTransport

JSON = dict[str, Any]
OPENAPI: JSON = {"paths": {"/slurm/v0.0.45/ping/": {}}}
NS, KEY = "ns", "ns/roll"


def old_pod(name: str, ready_for_s: float) -> JSON:
    """A pod of the old revision, created a second before it became Ready `ready_for_s`
    seconds ago."""
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ready_for_s)
    created = since - dt.timedelta(seconds=1)
    return {
        "metadata": {
            "name": name,
            "creationTimestamp": created.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "namespace": NS,
            "uid": f"uid-{name}",
            "labels": {LABEL_REVISION: "old"},
            "annotations": {},
        },
        "spec": {"nodeName": "k1"},
        "status": {
            "phase": "Running",
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ"),
                }
            ],
        },
    }


def node(
    name: str, *states: str, slurmd_started_s_ago: float | None = None, reason: str = ""
) -> JSON:
    ident = {"namespace": NS, "podName": name, "nodeSet": "roll", "node": "k1"}
    raw: JSON = {"name": name, "state": list(states), "comment": json.dumps(ident)}
    if reason:
        raw["reason"] = reason
    if slurmd_started_s_ago is not None:
        started = int(time.time() - slurmd_started_s_ago)
        raw["slurmd_start_time"] = {"set": True, "infinite": False, "number": started}
    return raw


class Kube:
    """The apiserver, as far as the update writes to it."""

    def __init__(self) -> None:
        self.condemned: list[str] = []
        self.condemnations: list[tuple[str, str | None]] = []  # (pod, value written)
        self.deleted: list[str] = []

    async def patch(self, _res: Any, name: str, body: JSON, *_a: Any, **_k: Any) -> JSON:
        notes = (body.get("metadata") or {}).get("annotations") or {}
        if ANNOTATION_CONDEMNED in notes:
            self.condemned.append(name)
            self.condemnations.append((name, notes[ANNOTATION_CONDEMNED]))
        return {}

    async def delete(self, _res: Any, name: str, *_a: Any, **_k: Any) -> None:
        self.deleted.append(name)


class Bed:
    """One NodeSet `roll` (3 replicas unless told, maxUnavailable 1) rolling to revision
    `new`."""

    def __init__(self, live: dict[str, JSON], replicas: int = 3) -> None:
        self.live = live  # slurmctld's nodes, by name
        self.drained: list[str] = []
        self.undrained: list[str] = []

        def slurmrestd(req: httpx2.Request) -> httpx2.Response:
            if req.url.path == "/openapi/v3":
                return httpx2.Response(200, json=OPENAPI)
            name = req.url.path.rstrip("/").rsplit("/", 1)[-1]
            if req.method == "POST":
                state = json.loads(req.content or b"{}").get("state") or []
                (self.undrained if "UNDRAIN" in state else self.drained).append(name)
                return httpx2.Response(200, json={})
            known = self.live.get(name)
            return httpx2.Response(200, json={"nodes": [known] if known else []})

        client = SlurmClient("http://slurm.test", StaticToken("t", user="u"))
        client.http = MockTransport(client.url, slurmrestd)
        self.informer = SlurmInformer(client)
        self.informer._synced.set()
        self.informer.stale = False
        # Waiting on Slurm (fast polls) since before this pass, and polled since: "fresh".
        self.informer._demand[KEY] = time.monotonic() - 2
        self.informer._last_poll_done = time.monotonic() - 1
        self.conn = Connection("ns/slurm", "cuid", client.url, client, self.informer, "fp")
        self.kube = Kube()
        self.ctx = Context(
            kube=self.kube,  # type: ignore[arg-type]
            podcontrol=PodControl(self.kube, Expectations()),  # type: ignore[arg-type]
            recorder=SimpleNamespace(event=lambda *a, **k: None),  # type: ignore[arg-type]
            nodes=None,  # type: ignore[arg-type]
            expectations=Expectations(),
        )
        raw = {
            "clusterName": "slurm",
            "replicas": replicas,
            "selector": {},
            "template": {},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        }
        self.spec = parse(NodeSetSpec, raw, "spec")
        self.obj = {"metadata": {"name": "roll", "namespace": NS, "uid": "nsuid"}, "spec": raw}

    async def rolling_update(self, active: list[JSON], cached: list[JSON]) -> list[float]:
        """One pass: the pods the cache shows, the Slurm nodes the last poll showed."""
        return await update.rolling_update(self.ctx, self.view(active, cached))

    async def scale_then_update(self, active: list[JSON], cached: list[JSON]) -> list[float]:
        """The NodeSet sync's steps 3 and 4 on one view: scale-in by the excess, then the
        rolling update."""
        view = self.view(active, cached)
        excess = len(view.active) - view.spec.replicas
        requeue = await scalein.scale_in(self.ctx, view, excess, lambda _p: None)
        return requeue + await update.rolling_update(self.ctx, view)

    def view(self, active: list[JSON], cached: list[JSON]) -> View:
        self.informer.nodes = {n["name"]: Node.parse(n) for n in cached}
        return View(
            obj=self.obj,
            spec=self.spec,
            key=KEY,
            exp_key=f"{KEY}/nsuid",
            revision="new",
            conf_server=None,
            conn=self.conn,
            active={p["metadata"]["name"]: p for p in active},
            terminating={},
        )


async def test_an_update_right_after_the_pods_started_waits_for_a_view_that_shows_their_nodes() -> (
    None
):
    """The e2e flake, pass by pass (operator log of a run on the test bed): the NodeSet was
    created, its three slurmds registered, two jobs started, and the template changed,
    all within two seconds. The first pass of the update saw three Ready pods and none of
    their Slurm nodes: the informer counted as fresh (it had polled since the NodeSet began
    waiting on Slurm, for the registrations) but that poll came before the registrations.
    Taken for unavailable, all three went for free and were condemned at once ("3 pods
    unavailable at once"; roll-2, idle, was deleted, roll-0 and roll-1 waited for their
    jobs). Nothing is known about them until a view shows their nodes."""
    live = [node("roll-0", "MIXED"), node("roll-1", "MIXED"), node("roll-2", "IDLE")]
    bed = Bed({n["name"]: n for n in live})
    pods = [old_pod(n, ready_for_s=2) for n in ("roll-0", "roll-1", "roll-2")]

    await bed.rolling_update(pods, cached=[])
    assert bed.kube.condemned == [] and bed.drained == [] and bed.kube.deleted == []

    # The next poll shows the nodes (20 ms later in the log): one pod goes, the idle one.
    await bed.rolling_update(pods, cached=live)
    assert bed.kube.condemned == ["roll-2"] and bed.drained == ["roll-2"]


async def test_pods_whose_slurmd_never_registered_are_replaced_for_free_once_settled() -> None:
    """Every pod Ready for minutes and none in Slurm (a wrong --conf-server, say): they are
    unavailable for sure, so the update that fixes the template replaces them all at once
    rather than waiting for them to become available, which they never will."""
    bed = Bed({})
    pods = [old_pod(n, ready_for_s=600) for n in ("roll-0", "roll-1", "roll-2")]
    await bed.rolling_update(pods, cached=[])
    assert sorted(bed.kube.deleted) == ["roll-0", "roll-1", "roll-2"], "no such Slurm node"


async def test_a_pod_held_back_while_settling_is_decided_again_when_its_window_ends() -> None:
    bed = Bed({})
    requeue = await bed.rolling_update([old_pod("roll-0", ready_for_s=20)], cached=[])
    assert bed.kube.deleted == [] and bed.kube.condemned == []
    assert requeue and REGISTRATION_WINDOW_S - 22 <= min(requeue) <= REGISTRATION_WINDOW_S - 19


async def test_a_down_node_its_own_slurmd_registered_is_replaced_at_once_an_old_record_waits() -> (
    None
):
    """A pod Ready for 5 s whose Slurm node is DOWN: when the view shows the node as this
    pod's slurmd registered it (slurmd started after the pod was created), the DOWN is a fact
    and the pod goes for free at once; a DOWN record whose slurmd started before the pod
    existed is an earlier pod's, and the pod waits for its window."""
    fresh = node("roll-0", "DOWN", slurmd_started_s_ago=5)
    bed = Bed({"roll-0": fresh})
    await bed.rolling_update([old_pod("roll-0", ready_for_s=5)], cached=[fresh])
    assert bed.kube.deleted == ["roll-0"] or bed.kube.condemned == ["roll-0"]

    stale = node("roll-0", "DOWN", slurmd_started_s_ago=600)
    bed = Bed({"roll-0": stale})
    requeue = await bed.rolling_update([old_pod("roll-0", ready_for_s=5)], cached=[stale])
    assert bed.kube.deleted == [] and bed.kube.condemned == []
    assert requeue and min(requeue) <= REGISTRATION_WINDOW_S - 4


async def test_a_pod_an_update_condemned_goes_when_the_nodeset_scales_below_it() -> None:
    """The soak's stuck NodeSet (seed 11): compute-1 was condemned for an update and
    drained, then the HPA scaled the NodeSet to 0. The scale-in left pods an update is
    replacing to the update (they come back at the new revision), and the update waits
    while a scale-in is under way: the drained pod stayed Ready, with no job, for good.
    The scale-in takes them too."""
    drained = node("roll-1", "IDLE", "DRAIN")
    bed = Bed({"roll-1": drained}, replicas=0)
    condemned = old_pod("roll-1", ready_for_s=600)
    condemned["metadata"]["annotations"][ANNOTATION_CONDEMNED] = scalein.CONDEMNED_UPDATE
    await bed.scale_then_update([condemned], cached=[drained])
    assert bed.kube.deleted == ["roll-1"]


async def test_a_scale_in_takes_the_pod_an_update_drained_before_draining_another() -> None:
    """Four pods for three replicas, the last old one drained already for the update: that
    one goes, and no other node is drained (before, an idle pod at the new revision was
    drained and deleted, and the update then replaced the drained one)."""
    live = {n: node(n, "IDLE") for n in ("roll-0", "roll-1", "roll-2", "roll-3")}
    live["roll-0"] = node("roll-0", "IDLE", "DRAIN")
    bed = Bed(live, replicas=3)
    pods = [old_pod(n, ready_for_s=600) for n in ("roll-0", "roll-1", "roll-2", "roll-3")]
    pods[0]["metadata"]["annotations"][ANNOTATION_CONDEMNED] = scalein.CONDEMNED_UPDATE
    for p in pods[1:]:
        p["metadata"]["labels"][LABEL_REVISION] = "new"
    await bed.scale_then_update(pods, cached=list(live.values()))
    assert bed.kube.deleted == ["roll-0"] and bed.drained == []


async def test_replicas_back_up_let_the_update_carry_on_with_the_pod_it_was_replacing() -> None:
    """A busy pod condemned for the update, the NodeSet scaled to 0 and back to 1 before
    its job ended: it stays condemned for the update and drained (never undrained, so no
    new job starts on it), and the update goes on with it."""
    busy = node("roll-0", "MIXED", "DRAIN", reason="slurm-operator: rolling update")
    bed = Bed({"roll-0": busy}, replicas=0)
    pod = old_pod("roll-0", ready_for_s=600)
    pod["metadata"]["annotations"][ANNOTATION_CONDEMNED] = scalein.CONDEMNED_UPDATE
    await bed.scale_then_update([pod], cached=[busy])
    assert bed.kube.deleted == [] and bed.kube.condemnations in ([], [("roll-0", "update")])

    bed.spec = parse(NodeSetSpec, {**bed.obj["spec"], "replicas": 1}, "spec")
    await bed.scale_then_update([pod], cached=[busy])
    assert bed.kube.deleted == [] and all(v == "update" for _, v in bed.kube.condemnations)
    assert bed.undrained == []
