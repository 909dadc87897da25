"""A slurmd pod that is Ready but unknown to Slurm: slurmctld restarted from state saved
before the pod registered, so the node is gone for good and slurmd is never asked again.
The NodeSet says so, and replaces the pod only when its pods can register (some did), once
Slurm confirms there is no such node, and not in a loop."""

from __future__ import annotations

import datetime as dt
import time
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest

from slinky.api.schema import parse
from slinky.api.v1alpha1.nodeset import NodeSetSpec
from slinky.operator.clients import Connection
from slinky.operator.nodeset import mirror
from slinky.operator.nodeset.sync import REGISTERED, NodeSetSync
from slinky.operator.nodeset.view import View
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.models import Node
from slinky.slurm.tokens import StaticToken
from tests.unit.fake_http import MockTransport

JSON = dict[str, Any]
OPENAPI = {"paths": {"/slurm/v0.0.45/ping/": {}}}


def ready_pod(name: str, ready_for_s: float) -> JSON:
    since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=ready_for_s)
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "annotations": {}},
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


class Deletes:
    def __init__(self) -> None:
        self.deleted: list[str] = []

    async def delete_pod(self, _exp: str, pod: JSON) -> bool:
        self.deleted.append(pod["metadata"]["name"])
        return True


def setup(registered: list[str], pod_ages: dict[str, float]) -> tuple[NodeSetSync, View, Deletes]:
    """Slurm knows the nodes in `registered` (cache and live reads agree)."""

    def handler(req: httpx2.Request) -> httpx2.Response:
        if req.url.path == "/openapi/v3":
            return httpx2.Response(200, json=OPENAPI)
        name = req.url.path.rstrip("/").rsplit("/", 1)[-1]
        return httpx2.Response(200, json={"nodes": [{"name": name}] if name in registered else []})

    client = SlurmClient("http://slurm.test", StaticToken("t", user="u"))
    client.http = MockTransport(client.url, handler)
    informer = SlurmInformer(client)
    informer._synced.set()
    informer.stale = False
    informer._last_poll_done = time.monotonic()  # polled just now
    informer.nodes = {n: Node.parse({"name": n}) for n in registered}
    conn = Connection("ns/slurm", "cuid", client.url, client, informer, "fp")
    obj = {"metadata": {"name": "cpu", "namespace": "ns", "uid": "nsuid"}, "spec": {}}
    spec = parse(NodeSetSpec, {"clusterName": "slurm", "selector": {}, "template": {}}, "spec")
    pods = {name: ready_pod(name, age) for name, age in pod_ages.items()}
    view = View(obj, spec, "ns/cpu", "ns/cpu/nsuid", "rev", None, conn, pods, {})
    deletes = Deletes()
    sync = NodeSetSync.__new__(NodeSetSync)
    sync.registered_once = set()
    sync.replacing = {}
    sync.ctx = SimpleNamespace(  # type: ignore[assignment]
        podcontrol=deletes, recorder=SimpleNamespace(event=lambda *a, **k: None)
    )
    return sync, view, deletes


async def test_a_pod_slurm_lost_is_named_and_replaced_once_slurm_confirms_it() -> None:
    late = mirror.REGISTRATION_DEADLINE_S + 30
    sync, view, deletes = setup(["cpu-0"], {"cpu-0": late, "cpu-1": late, "cpu-2": 5})
    await sync.replace_unregistered(view)
    assert deletes.deleted == ["cpu-1"]  # cpu-2 may still be registering
    (cond,) = view.conditions
    assert cond[0] == REGISTERED and not cond[1] and cond[2] == "SlurmNodeNotRegistered"
    assert "cpu-1" in cond[3] and "cpu-2" not in cond[3]
    view.active["cpu-1"] = ready_pod("cpu-1", late)  # still there next pass: backoff holds
    await sync.replace_unregistered(view)
    assert deletes.deleted == ["cpu-1"]


async def test_a_nodeset_that_never_registered_is_only_told_about() -> None:
    """kwok pods, a broken image or a wrong address: replacing would never end."""
    late = mirror.REGISTRATION_DEADLINE_S + 30
    sync, view, deletes = setup([], {"cpu-0": late, "cpu-1": late})
    await sync.replace_unregistered(view)
    assert deletes.deleted == []
    assert "check the slurmd log" in view.conditions[0][3]


async def test_a_view_not_polled_since_the_deadline_decides_nothing() -> None:
    late = mirror.REGISTRATION_DEADLINE_S + 30
    sync, view, deletes = setup(["cpu-0"], {"cpu-0": late, "cpu-1": late})
    assert view.conn is not None
    view.conn.informer._last_poll_done -= 60  # the last poll predates cpu-1's deadline
    await sync.replace_unregistered(view)
    assert deletes.deleted == [] and view.conditions == []


async def test_a_pod_that_was_a_slurm_node_is_replaced_after_an_operator_restart() -> None:
    """The soak: slurmctld lost batch-0's registration in a kill -9 and the operator was
    restarted too; the new process had never seen any pod of the NodeSet registered, so
    batch-0 stayed Ready and useless for good. The mirrored Slurm state conditions on the
    pod are the evidence that survives."""
    late = mirror.REGISTRATION_DEADLINE_S + 30
    sync, view, deletes = setup([], {"batch-0": late, "batch-1": late})
    view.active["batch-0"]["status"]["conditions"].append(
        {"type": "SlurmNodeStateIdle", "status": "True", "lastTransitionTime": "x"}
    )
    await sync.replace_unregistered(view)
    assert deletes.deleted == ["batch-0"]  # batch-1 never registered: only named
    assert "slurmctld lost their registration" in view.conditions[0][3]


def test_an_hpa_that_cannot_scale_a_nodeset_up_from_zero_is_named() -> None:
    from slinky.kube.store import Store
    from slinky.operator.nodeset.sync import AUTOSCALING, BY_HPA_TARGET, hpa_target

    sync, view, _ = setup([], {})
    hpas = Store({BY_HPA_TARGET: hpa_target})

    def hpa(name: str, target: str, min_replicas: int | None) -> JSON:
        spec: JSON = {
            "scaleTargetRef": {
                "apiVersion": "slinky.slurm.net/v1alpha1", "kind": "NodeSet", "name": target
            }
        }  # fmt: skip
        if min_replicas is not None:
            spec["minReplicas"] = min_replicas
        return {"metadata": {"name": name, "namespace": "ns"}, "spec": spec}

    hpas.upsert(hpa("a", "cpu", None))  # minReplicas defaults to 1
    hpas.upsert(hpa("b", "other", 1))
    sync.hpas = hpas  # type: ignore[assignment]
    view.spec.replicas = 0
    sync.check_autoscaler(view)
    ((ctype, ok, reason, message),) = view.conditions
    assert (ctype, ok, reason) == (AUTOSCALING, False, "HPACannotScaleFromZero")
    assert "HorizontalPodAutoscaler a does not scale" in message and " b" not in message
    assert "set the HPA's minReplicas to 0" in message
    view.conditions.clear()
    hpas.upsert(hpa("a", "cpu", 0))  # scale to zero: the HPA may scale it from 0 ...
    sync.check_autoscaler(view)
    assert view.conditions == []
    # ... unless it did not scale it to 0 itself (the NodeSet was made at 0): Kubernetes
    # says ScalingDisabled.
    disabled = hpa("a", "cpu", 0)
    disabled["status"] = {"conditions": [{"type": "ScalingActive", "reason": "ScalingDisabled"}]}
    hpas.upsert(disabled)
    sync.check_autoscaler(view)
    ((_, ok, reason, message),) = view.conditions
    assert not ok and "set the NodeSet's replicas to 1 once" in message
    assert "minReplicas to 0 (feature" not in message


async def test_a_ready_pod_whose_idle_node_stopped_responding_is_replaced_once_slurm_agrees() -> (
    None
):
    """The soak: a rolling update replaced batch-0, the new pod registered, then slurmctld
    was killed -9 and restored the node record saved before (the old pod's address): it
    pings an address no one has, the node IDLE+NOT_RESPONDING for good, the pod Ready. A
    node with jobs is left to Slurm."""
    from slinky.operator.nodeset.sync import RESPONDING

    late = mirror.REGISTRATION_DEADLINE_S + 30
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=late)).strftime("%Y-%m-%dT%H:%M:%SZ")
    states = {
        "cpu-0": ["IDLE", "NOT_RESPONDING"],
        "cpu-1": ["MIXED", "NOT_RESPONDING"],
        # Soak run 6: SlurmdTimeout later, slurmctld set it DOWN; no job is on it any more.
        "cpu-2": ["DOWN", "NOT_RESPONDING"],
        # An admin's DOWN is never undone by a new pod.
        "cpu-3": ["DOWN", "NOT_RESPONDING"],
    }
    reasons = {"cpu-2": "Not responding", "cpu-3": "admin: bad PSU"}
    sync, view, deletes = setup(list(states), {n: late for n in states})
    assert view.conn is not None
    raw = {n: {"name": n, "state": s, "reason": reasons.get(n, "")} for n, s in states.items()}
    view.conn.informer.nodes = {n: Node.parse(r) for n, r in raw.items()}

    def handler(req: httpx2.Request) -> httpx2.Response:
        name = req.url.path.rstrip("/").rsplit("/", 1)[-1]
        return httpx2.Response(200, json={"nodes": [raw[name]]})

    view.conn.client.http = MockTransport(view.conn.client.url, handler)
    view.conn.client.version = "v0.0.45"
    for name in states:
        view.active[name]["status"]["conditions"].append(
            {"type": "SlurmNodeStateNotResponding", "status": "True", "lastTransitionTime": since}
        )
    sync.rescuing = {}
    await sync.replace_unreachable(view)
    assert deletes.deleted == ["cpu-0", "cpu-2"]  # cpu-1 runs a job: Slurm's to handle
    ((ctype, ok, reason, message),) = view.conditions
    assert (ctype, ok, reason) == (RESPONDING, False, "SlurmNodeNotResponding")
    assert "cpu-0" in message and "cpu-1" not in message and "cpu-3" not in message


def test_the_nodeset_looks_again_when_a_lost_pod_reaches_its_deadline() -> None:
    """Soak run 8: batch-0 registered, then a slurmctld kill -9 restored state without it.
    Nothing changes at the deadline (pod and Slurm view stay as they are), so the NodeSet
    must requeue itself for it; it waited over 4 minutes for an unrelated event before."""
    _, view, _ = setup(["cpu-0"], {"cpu-0": 500, "cpu-1": 70, "cpu-2": 100})
    recheck = mirror.recheck_in(view)
    assert recheck is not None
    assert recheck == pytest.approx(
        mirror.REGISTRATION_DEADLINE_S - 100 + mirror.DEADLINE_MARGIN_S, abs=2
    )  # cpu-2 is due first
    assert view.waits == []


def test_a_lost_pod_past_its_deadline_with_an_older_slurm_view_asks_for_a_fresh_one() -> None:
    _, view, _ = setup(["cpu-0"], {"cpu-0": 500, "cpu-1": mirror.REGISTRATION_DEADLINE_S + 5})
    assert view.conn is not None
    view.conn.informer._last_poll_done -= 30  # polled before cpu-1's deadline passed
    assert mirror.unregistered(view) == []
    assert mirror.recheck_in(view) == mirror.STALE_RECHECK_S
    assert view.waits  # fast polls asked for


def test_a_due_pod_decided_on_asks_nothing_more_and_a_registered_nodeset_none() -> None:
    _, view, _ = setup(["cpu-0"], {"cpu-0": 500, "cpu-1": mirror.REGISTRATION_DEADLINE_S + 5})
    assert [p["metadata"]["name"] for p in mirror.unregistered(view)] == ["cpu-1"]
    assert mirror.recheck_in(view) is None  # the rule acts (or its backoff says when)
    _, view, _ = setup(["cpu-0", "cpu-1"], {"cpu-0": 500, "cpu-1": 5})
    assert mirror.recheck_in(view) is None


async def test_a_replacement_held_by_its_backoff_is_looked_at_again_when_it_ends() -> None:
    late = mirror.REGISTRATION_DEADLINE_S + 30
    sync, view, deletes = setup(["cpu-0"], {"cpu-0": late, "cpu-1": late})
    assert await sync.replace_unregistered(view) == []
    assert deletes.deleted == ["cpu-1"]
    view.active["cpu-1"] = ready_pod("cpu-1", late)  # the new pod lost it too
    (again,) = await sync.replace_unregistered(view)
    assert 30 < again < 90  # the first backoff step (60 s, jittered)
    assert deletes.deleted == ["cpu-1"]


def test_a_node_not_responding_is_looked_at_again_at_its_deadline() -> None:
    _, view, _ = setup(["cpu-0"], {"cpu-0": 500})
    assert view.conn is not None
    view.conn.informer.nodes = {
        "cpu-0": Node.parse({"name": "cpu-0", "state": ["IDLE", "NOT_RESPONDING"]})
    }
    since = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%SZ")
    view.active["cpu-0"]["status"]["conditions"].append(
        {"type": "SlurmNodeStateNotResponding", "status": "True", "lastTransitionTime": since}
    )
    recheck = mirror.recheck_in(view)
    assert recheck == pytest.approx(mirror.REGISTRATION_DEADLINE_S - 30, abs=2)
