"""slinky.kube against the real apiserver: informers (ordering, restarts, 410), controllers
(owner enqueueing, metrics), leader election across processes, events, finalizers."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from slinky.background import Backoff
from slinky.kube import events, objects, rest
from slinky.kube.controller import DONE, Controller, Result
from slinky.kube.informer import Handler, Informer, InformerFactory
from slinky.kube.serving import ProbeServer
from slinky.kube.store import key_of
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]


def cm(name: str, **data: str) -> JSON:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


class Recorder:
    """Collects (type, key, resourceVersion, data) for every event an informer dispatches."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str, JSON]] = []

    def handler(self) -> Handler:
        return Handler(
            on_add=lambda o: self._rec("add", o),
            on_update=lambda _old, o: self._rec("update", o),
            on_delete=lambda o: self._rec("delete", o),
        )

    def _rec(self, kind: str, o: JSON) -> None:
        self.events.append((kind, key_of(o), o["metadata"]["resourceVersion"], o.get("data") or {}))

    def of(self, key: str) -> list[str]:
        return [k for k, key_, _, _ in self.events if key_ == key]


@pytest.fixture
async def informer_cms(kube: rest.Kube, namespace: str) -> AsyncIterator[tuple[Informer, Recorder]]:
    inf = Informer(
        kube, rest.CONFIGMAPS, namespace=namespace, page_size=100, backoff=Backoff(0.1, 1.0)
    )
    rec = Recorder()
    inf.add_handler(rec.handler())
    inf.start()
    await asyncio.wait_for(inf.wait_synced(), 30)
    yield inf, rec
    await inf.stop()


async def fresh_list(kube: rest.Kube, namespace: str) -> dict[str, str]:
    items = (await kube.list(rest.CONFIGMAPS, namespace))["items"]
    return {key_of(o): o["metadata"]["resourceVersion"] for o in items}


def has_all(inf: Informer, namespace: str, names: list[str]) -> bool:
    return all(f"{namespace}/{n}" in inf.store for n in names)


def store_view(inf: Informer) -> dict[str, str]:
    return {key_of(o): o["metadata"]["resourceVersion"] for o in inf.store.objects()}


async def gather_bounded(coros: list[Any], limit: int = 32) -> None:
    sem = asyncio.Semaphore(limit)

    async def one(c: Any) -> None:
        async with sem:
            await c

    await asyncio.gather(*(one(c) for c in coros))


async def test_informer_sees_1000_configmaps_in_order_and_matches_a_fresh_list(
    kube: rest.Kube, namespace: str, informer_cms: tuple[Informer, Recorder]
) -> None:
    inf, rec = informer_cms
    names = [f"cm-{i:04d}" for i in range(1000)]
    await gather_bounded([kube.create(rest.CONFIGMAPS, cm(n, v="1"), namespace) for n in names])
    await gather_bounded(
        [kube.patch(rest.CONFIGMAPS, n, {"data": {"v": "2"}}, namespace) for n in names]
    )
    await gather_bounded([kube.delete(rest.CONFIGMAPS, n, namespace) for n in names[::2]])

    async def caught_up() -> bool:
        return store_view(inf) == await fresh_list(kube, namespace)

    await wait_for(caught_up, timeout=60, interval=0.2, what="store equals a fresh list")
    for i, n in enumerate(names):
        want = ["add", "update", "delete"] if i % 2 == 0 else ["add", "update"]
        assert rec.of(f"{namespace}/{n}") == want, n
    rvs = [int(rv) for _, _, rv, _ in rec.events]
    assert rvs == sorted(rvs), "events must arrive in resourceVersion order"
    assert sum(1 for k in inf.store.keys() if "/cm-" in k) == 500


async def test_informer_reconnects_after_apiserver_restart_and_misses_nothing(
    kube: rest.Kube, testbed: Testbed, namespace: str, informer_cms: tuple[Informer, Recorder]
) -> None:
    inf, rec = informer_cms
    for n in ("keep", "change", "remove"):
        await kube.create(rest.CONFIGMAPS, cm(n, v="1"), namespace)
    await wait_for(
        lambda: has_all(inf, namespace, ["keep", "change", "remove"]), timeout=10, what="cached"
    )

    await asyncio.to_thread(testbed.restart_component, "apiserver")
    # Right after the restart, before the informer has necessarily reconnected:
    await wait_for(
        lambda: kube.create(rest.CONFIGMAPS, cm("new", v="1"), namespace),
        timeout=30,
        what="apiserver accepts writes",
        ignore=(rest.ApiError, rest.TransportError),
    )
    await kube.patch(rest.CONFIGMAPS, "change", {"data": {"v": "2"}}, namespace)
    await kube.delete(rest.CONFIGMAPS, "remove", namespace)

    async def caught_up() -> bool:
        return store_view(inf) == await fresh_list(kube, namespace)

    await wait_for(caught_up, timeout=60, interval=0.2, what="store caught up after restart")
    assert rec.of(f"{namespace}/new") == ["add"]
    assert rec.of(f"{namespace}/change")[-1] == "update"
    assert rec.of(f"{namespace}/remove")[-1] == "delete"
    assert inf.store.get(f"{namespace}/change")["data"] == {"v": "2"}  # type: ignore[index]
    assert inf.reconnects >= 1


async def etcd_compact(etcd_url: str) -> int:
    async with httpx2.AsyncClient(base_url=etcd_url, timeout=10) as http:
        head = (await http.post("/v3/kv/range", json={"key": "AA==", "limit": 1})).json()
        revision = int(head["header"]["revision"])
        resp = await http.post("/v3/kv/compaction", json={"revision": revision, "physical": True})
        resp.raise_for_status()
        return revision


async def test_informer_relists_on_410_and_emits_deletes_for_what_vanished(
    kube: rest.Kube, testbed: Testbed, namespace: str, informer_cms: tuple[Informer, Recorder]
) -> None:
    inf, rec = informer_cms
    for n in ("a", "b", "c"):
        await kube.create(rest.CONFIGMAPS, cm(n), namespace)
    await wait_for(lambda: has_all(inf, namespace, ["a", "b", "c"]), timeout=10, what="cached")
    await inf.stop()  # disconnected; it keeps its store and resourceVersion
    stale_rv = inf.resource_version
    await kube.delete(rest.CONFIGMAPS, "a", namespace)
    await kube.create(rest.CONFIGMAPS, cm("d"), namespace)
    # Push many revisions past the informer's, then compact them away.
    await gather_bounded(
        [kube.create(rest.CONFIGMAPS, cm(f"f-{i}"), namespace) for i in range(200)]
    )
    await gather_bounded([kube.delete(rest.CONFIGMAPS, f"f-{i}", namespace) for i in range(200)])
    await etcd_compact(testbed.env()["SLINKY_ETCD_URL"])
    # The apiserver's watch cache would still serve the old version from memory; a restart
    # (as in an upgrade while we were away) leaves only compacted etcd behind it.
    await asyncio.to_thread(testbed.restart_component, "apiserver")
    relists = inf.relists
    inf.start()

    async def caught_up() -> bool:
        return store_view(inf) == await fresh_list(kube, namespace)

    await wait_for(caught_up, timeout=60, interval=0.2, what="store caught up after 410")
    assert inf.relists == relists + 1, f"expected a re-list after 410 (rv {stale_rv})"
    assert rec.of(f"{namespace}/a")[-1] == "delete"
    assert rec.of(f"{namespace}/d") == ["add"]


async def test_child_pod_change_enqueues_its_owner(kube: rest.Kube, namespace: str) -> None:
    seen: list[str] = []

    class Owners:
        async def reconcile(self, key: str) -> Result:
            seen.append(key)
            return DONE

    factory = InformerFactory(kube, namespace=namespace)
    owners = factory.informer(rest.CONFIGMAPS)
    pods = factory.informer(rest.PODS)
    assert factory.informer(rest.PODS) is pods, "one informer per resource type"
    ctrl = Controller("owners", Owners())
    ctrl.watch(owners)
    ctrl.owns(pods, "ConfigMap")
    owner = await kube.create(rest.CONFIGMAPS, cm("owner"), namespace)
    factory.start()
    stop = asyncio.Event()
    task = asyncio.create_task(ctrl.run(stop))
    try:
        await wait_for(lambda: f"{namespace}/owner" in seen, timeout=10, what="owner reconciled")
        child = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "child", "ownerReferences": [objects.owner_reference(owner)]},
            "spec": {"nodeName": "nowhere", "containers": [{"name": "c", "image": "x"}]},
        }
        await kube.create(rest.PODS, child, namespace)
        # The child's creation enqueues the owner too: let that reconcile land before counting.
        await wait_for(
            lambda: len(pods.store) == 1 and seen.count(f"{namespace}/owner") >= 2,
            timeout=30,
            what="child cached and its creation reconciled the owner",
        )
        seen.clear()
        await kube.patch(rest.PODS, "child", {"metadata": {"labels": {"x": "1"}}}, namespace)
        await wait_for(
            lambda: seen == [f"{namespace}/owner"],
            timeout=30,
            what="child update enqueued the owner (once)",
        )
    finally:
        stop.set()
        await task
        await factory.stop()


async def test_metrics_and_probes_expose_runtime_names(kube: rest.Kube, namespace: str) -> None:
    class Flaky:
        calls = 0

        async def reconcile(self, key: str) -> Result:
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("first call fails")
            return DONE

    inf = Informer(kube, rest.CONFIGMAPS, namespace=namespace)
    ctrl = Controller("metrics-test", Flaky())
    ctrl.watch(inf)
    server = ProbeServer()
    server.add_ready_check("informers", lambda: inf.has_synced)
    await server.start(metrics_addr="127.0.0.1:0", probe_addr="127.0.0.1:0")
    await kube.create(rest.CONFIGMAPS, cm("m"), namespace)
    inf.start()
    stop = asyncio.Event()
    task = asyncio.create_task(ctrl.run(stop))
    try:
        await wait_for(lambda: ctrl.reconciler.calls >= 2, timeout=10, what="retry after error")  # type: ignore[attr-defined]
        async with httpx2.AsyncClient() as http:
            text = (await http.get(f"http://127.0.0.1:{server.ports['/metrics']}/metrics")).text
            ready = await http.get(f"http://127.0.0.1:{server.ports['/readyz']}/readyz")
            health = await http.get(f"http://127.0.0.1:{server.ports['/healthz']}/healthz")
        assert ready.status_code == 200 and health.status_code == 200

        def value(line_start: str) -> float:
            for line in text.splitlines():
                if line.startswith(line_start):
                    return float(line.rsplit(" ", 1)[1])
            raise AssertionError(f"{line_start} not in /metrics")

        c = 'controller="metrics-test"'
        assert value(f'controller_runtime_reconcile_total{{{c},result="success"}}') >= 1
        assert value(f"controller_runtime_reconcile_errors_total{{{c}}}") >= 1
        assert value(f"controller_runtime_reconcile_time_seconds_count{{{c}}}") >= 2
        w = 'controller="metrics-test",name="metrics-test"'
        assert value(f"workqueue_adds_total{{{w}}}") >= 2
        assert value(f"workqueue_retries_total{{{w}}}") >= 1
        assert value(f"workqueue_queue_duration_seconds_count{{{w}}}") >= 2
        assert f"workqueue_depth{{{w}}}" in text
    finally:
        stop.set()
        await task
        await inf.stop()
        await server.stop()


async def test_events_are_aggregated_and_finalizers_round_trip(
    kube: rest.Kube, namespace: str
) -> None:
    obj = await kube.create(rest.CONFIGMAPS, cm("ev"), namespace)
    rec = events.EventRecorder(kube, controller="slinky.test/recorder", instance="t-1")
    for _ in range(3):
        await rec.emit(obj, events.NORMAL, "Tested", "same note")
    evs = (await kube.list(rest.EVENTS, namespace))["items"]
    assert len(evs) == 1
    assert evs[0]["series"]["count"] == 3
    assert evs[0]["regarding"]["uid"] == obj["metadata"]["uid"]

    obj = await objects.add_finalizer(kube, rest.CONFIGMAPS, obj, "slinky.test/f")
    assert objects.has_finalizer(obj, "slinky.test/f")
    await kube.delete(rest.CONFIGMAPS, "ev", namespace)
    terminating = await kube.get(rest.CONFIGMAPS, "ev", namespace)
    assert terminating["metadata"].get("deletionTimestamp")
    await objects.remove_finalizer(kube, rest.CONFIGMAPS, terminating, "slinky.test/f")

    async def gone() -> bool:
        try:
            await kube.get(rest.CONFIGMAPS, "ev", namespace)
        except rest.ApiError as e:
            return e.not_found
        return False

    await wait_for(gone, timeout=10, what="object deleted once the finalizer is removed")


async def test_leader_election_one_reconciles_and_failover_after_kill(
    kube: rest.Kube, testbed: Testbed, namespace: str, tmp_path: Path
) -> None:
    program = Path(__file__).parent / "programs" / "leader_child.py"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    children = {
        ident: subprocess.Popen(
            [sys.executable, str(program), str(testbed.kubeconfig), namespace, ident],
            env=env,
            stdout=(tmp_path / f"{ident}.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        for ident in ("alpha", "beta")
    }
    try:

        async def holder() -> str:
            try:
                lease = await kube.get(rest.LEASES, "leader-test", namespace)
            except rest.ApiError:
                return ""
            return str((lease.get("spec") or {}).get("holderIdentity") or "")

        # Two Python processes start and elect (seconds; more on a loaded box).
        leader = await wait_for(holder, timeout=60, what="a leader")
        for i in range(10):
            await kube.create(rest.CONFIGMAPS, cm(f"w-{i}"), namespace)

        async def stamps() -> set[str] | None:
            items = (await kube.list(rest.CONFIGMAPS, namespace))["items"]
            got = [
                (o["metadata"].get("annotations") or {}).get("slinky.test/reconciled-by")
                for o in items
                if o["metadata"]["name"].startswith("w-")
            ]
            return set(got) if len(got) == 10 and all(got) else None  # type: ignore[arg-type]

        assert await wait_for(stamps, timeout=20, what="all stamped") == {leader}

        children[leader].send_signal(signal.SIGKILL)
        children[leader].wait()
        other = "beta" if leader == "alpha" else "alpha"
        # Deadline: lease duration (4 s) + retry period (1 s), plus slack for a loaded box.
        await wait_for(
            lambda: _is(holder, other),
            timeout=4 + 1 + 5,
            interval=0.05,
            what="the other process takes the lease",
        )
        for i in range(10):
            await kube.patch(
                rest.CONFIGMAPS,
                f"w-{i}",
                {
                    "data": {"again": "1"},
                    "metadata": {"annotations": {"slinky.test/reconciled-by": None}},
                },
                namespace,
            )
        assert await wait_for(stamps, timeout=20, what="re-stamped by the new leader") == {other}
    finally:
        for p in children.values():
            if p.poll() is None:
                p.terminate()
                p.wait(10)


async def _is(holder: Any, want: str) -> bool:
    return bool(await holder() == want)


async def test_silent_watch_is_reopened_without_losing_anything(
    kube: rest.Kube, namespace: str
) -> None:
    inf = Informer(kube, rest.CONFIGMAPS, namespace=namespace, silence_timeout=0.5)
    inf.start()
    try:
        await asyncio.wait_for(inf.wait_synced(), 10)
        relists = inf.relists
        await wait_for(lambda: inf.reconnects >= 3, timeout=10, what="watchdog reopened the watch")
        await kube.create(rest.CONFIGMAPS, cm("after-silence"), namespace)
        await wait_for(
            lambda: f"{namespace}/after-silence" in inf.store, timeout=10, what="event seen"
        )
        assert inf.relists == relists, "a silent stream resumes; it does not re-list"
    finally:
        await inf.stop()
