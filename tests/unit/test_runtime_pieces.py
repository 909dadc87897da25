"""Store indexes, conditions, expectations, owner mapping: pure logic of slinky.kube; and what
happens when a background loop dies."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from slinky.background import BackgroundLoop
from slinky.kube import conditions, controller, events, informer, rest, store
from slinky.kube.expectations import Expectations


def obj(name: str, ns: str | None = "n", **extra: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "resourceVersion": "1", **extra}
    if ns:
        meta["namespace"] = ns
    return {"metadata": meta, "spec": {}}


def test_store_indexes_follow_updates_and_deletes() -> None:
    s = store.Store({store.BY_NODE_NAME: store.index_node_name, "app": store.index_label("app")})
    p = obj("p", labels={"app": "x"}, ownerReferences=[{"uid": "u1"}])
    p["spec"]["nodeName"] = "n1"
    s.upsert(p)
    assert [store.key_of(o) for o in s.by_index(store.BY_OWNER_UID, "u1")] == ["n/p"]
    assert s.by_index(store.BY_NODE_NAME, "n1") == [p]
    moved = obj("p", labels={"app": "y"})
    moved["spec"]["nodeName"] = "n2"
    s.upsert(moved)
    assert s.by_index(store.BY_NODE_NAME, "n1") == []
    assert s.by_index("app", "y") == [moved]
    assert s.by_index(store.BY_OWNER_UID, "u1") == []
    s.delete("n/p")
    assert s.by_index("app", "y") == [] and len(s) == 0


def test_added_indexer_covers_existing_objects() -> None:
    s = store.Store()
    s.upsert(obj("a", labels={"k": "v"}))
    s.add_indexer("k", store.index_label("k"))
    assert len(s.by_index("k", "v")) == 1


def test_keys_for_namespaced_and_cluster_objects() -> None:
    assert store.key_of(obj("a")) == "n/a"
    assert store.key_of(obj("node", ns=None)) == "node"
    assert store.split_key("n/a") == ("n", "a")
    assert store.split_key("node") == (None, "node")


def test_condition_transition_time_changes_only_on_status_change() -> None:
    conds, changed = conditions.set_condition(None, "Ready", False, reason="A", now="t1")
    assert changed and conds[0]["lastTransitionTime"] == "t1"
    conds, changed = conditions.set_condition(
        conds, "Ready", False, reason="B", message="m", now="t2"
    )
    assert changed and conds[0]["lastTransitionTime"] == "t1" and conds[0]["reason"] == "B"
    conds, changed = conditions.set_condition(
        conds, "Ready", False, reason="B", message="m", now="t3"
    )
    assert not changed
    conds, changed = conditions.set_condition(conds, "Ready", True, reason="Ok", now="t4")
    assert changed and conds[0]["lastTransitionTime"] == "t4"
    assert conditions.is_true(conds, "Ready")


def test_expectations_wait_for_observations_and_expire(caplog: pytest.LogCaptureFixture) -> None:
    e = Expectations(ttl=0.05)
    e.expect_creations("k", 2)
    e.expect_deletions("k", ["u1"])
    assert not e.satisfied("k")
    e.creation_observed("k")
    e.creation_observed("k")
    assert not e.satisfied("k")
    e.deletion_observed("k", "u1")
    assert e.satisfied("k")
    e.expect_creations("k", 1)
    time.sleep(0.06)
    assert e.satisfied("k"), "an expectation never observed expires"
    assert "k: expectations expired after 0s: 1 creations" in caplog.text  # and says so
    assert e.satisfied("k") and caplog.text.count("expired") == 1  # once


def test_owner_mapper_maps_controlled_children_only() -> None:
    m = controller.owner_mapper("NodeSet")
    child = obj(
        "c", ownerReferences=[{"kind": "NodeSet", "name": "ns1", "uid": "u", "controller": True}]
    )
    other = obj("d", ownerReferences=[{"kind": "NodeSet", "name": "ns1", "uid": "u"}])
    assert m(child) == ["n/ns1"]
    assert m(other) == []


class _Broken(BackgroundLoop):
    async def run(self) -> None:
        raise KeyError("unexpected field")


async def test_a_background_loop_that_dies_is_logged_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = _Broken()
    loop.start()
    for _ in range(3):  # the task runs and fails; the supervisor logs before its backoff
        await asyncio.sleep(0)
    assert any(
        r.levelno == logging.ERROR and r.exc_info and "unexpected field" in str(r.exc_info[1])
        for r in caplog.records
    )
    assert not loop.healthy
    await loop.stop()


def test_a_change_of_status_only_does_not_enqueue_the_object_again() -> None:
    old = obj("a", generation=1)
    old["status"] = {"readyReplicas": 1}
    status_only = {**old, "metadata": {**old["metadata"], "resourceVersion": "2"}, "status": {}}
    assert controller.beyond_status(None, old), "an add always counts"
    assert not controller.beyond_status(old, status_only)
    annotated = {**old, "metadata": {**old["metadata"], "annotations": {"x": "y"}}}
    assert controller.beyond_status(old, annotated)
    assert controller.beyond_status(old, {**old, "spec": {"replicas": 2}})


class CountingKube:
    def __init__(self) -> None:
        self.created = 0

    async def create(self, *_: Any) -> dict[str, Any]:
        self.created += 1
        return {}


async def test_an_object_gets_a_burst_of_events_then_one_per_refill() -> None:
    kube = CountingKube()
    recorder = events.EventRecorder(kube, controller="c", instance="i")  # type: ignore[arg-type]
    nodeset = obj("ns", uid="u1")
    for i in range(events.SPAM_BURST + 10):
        recorder.event(nodeset, events.NORMAL, "Created", f"created pod ns-{i}")
    recorder.event(obj("other", uid="u2"), events.NORMAL, "Created", "created pod other-0")
    await recorder.flush()
    assert kube.created == events.SPAM_BURST + 1, "each object has its own budget"


def test_an_informer_transform_applies_to_listed_and_watched_objects() -> None:
    def keep_name(o: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {k: o["metadata"][k] for k in ("name", "namespace", "resourceVersion")}}

    inf = informer.Informer(None, rest.PODS, transform=keep_name)  # type: ignore[arg-type]
    inf._on_event({"type": "ADDED", "object": obj("p", managedFields=[{"big": 1}])})
    cached = inf.store.get("n/p")
    assert cached == {"metadata": {"name": "p", "namespace": "n", "resourceVersion": "1"}}
