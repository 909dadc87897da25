"""Background loops: supervised restarts, fast-while-waiting Slurm polling, and a controller
that stops at once when cancelled (leadership lost)."""

from __future__ import annotations

import asyncio
import contextlib

import httpx2

from slinky.background import BackgroundLoop
from slinky.kube.controller import DONE, Controller, Result
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.models import expand_hostlist
from slinky.slurm.tokens import StaticToken
from slinky_testbed.waiting import wait_for
from tests.unit.fake_http import MockTransport


class Flaky(BackgroundLoop):
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.runs = 0
        self.running = asyncio.Event()

    async def run(self) -> None:
        self.runs += 1
        if self.runs <= self.failures:
            raise KeyError("unexpected payload")
        self.running.set()
        await asyncio.Event().wait()


async def test_a_loop_that_dies_is_restarted_and_unhealthy_meanwhile() -> None:
    loop = Flaky(failures=1)
    loop.start()

    async def down() -> bool:
        return not loop.healthy

    await wait_for(down, timeout=5, what="loop reported down", interval=0.01)
    assert "unexpected payload" in (loop.failure or "")
    await asyncio.wait_for(loop.running.wait(), 10)
    assert loop.healthy and loop.restarts == 1
    await loop.stop()


def test_slurm_informer_polls_fast_only_while_someone_waits() -> None:
    client = SlurmClient("http://slurm.test", StaticToken("t", user="u"))
    inf = SlurmInformer(client, poll_interval=0.5, idle_interval=30)
    assert inf.interval == 30
    inf.demand("ns/a/uid", True)
    inf.demand("ns/b/uid", True)
    assert inf.interval == 0.5
    inf.demand("ns/a/uid", False)
    assert inf.interval == 0.5, "b still waits"
    inf.demand("ns/b/uid", False)
    assert inf.interval == 30


def counting_slurm() -> tuple[SlurmClient, list[str]]:
    """A slurmrestd answering every list with nothing, recording the paths asked."""
    asked: list[str] = []

    def handler(req: httpx2.Request) -> httpx2.Response:
        if req.url.path == "/openapi/v3":
            return httpx2.Response(200, json={"paths": {"/slurm/v0.0.45/ping/": {}}})
        asked.append(req.url.path.rsplit("/", 2)[-2])
        return httpx2.Response(200, json={"nodes": [], "jobs": [], "partitions": []})

    client = SlurmClient("http://slurm.test", StaticToken("t", user="u"))
    client.http = MockTransport(client.url, handler)
    return client, asked


async def test_slurm_jobs_are_polled_only_while_someone_wants_them() -> None:
    client, asked = counting_slurm()
    inf = SlurmInformer(client, watch_jobs=True)
    await inf.poll_once()
    assert asked == ["nodes"] and not inf.jobs_synced
    inf.want_jobs("metrics", True)
    await inf.poll_once()
    assert sorted(asked[1:]) == ["jobs", "nodes"] and inf.jobs_synced
    inf.want_jobs("metrics", False)
    assert not inf.jobs_synced, "not polled any more: the job cache goes stale"
    await inf.poll_once()
    assert asked[3:] == ["nodes"]


class DeltaSlurm:
    """A slurmrestd with update times: a list is answered in full when asked without
    `update_time` or when something changed since, else 304 (jobs: an empty answer)."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.updated = {"nodes": 10, "jobs": 10, "partitions": 10}
        self.partitions = [{"name": "p", "nodes": {"configured": ""}, "partition": {}}]

    def handler(self, req: httpx2.Request) -> httpx2.Response:
        if req.url.path == "/openapi/v3":
            return httpx2.Response(200, json={"paths": {"/slurm/v0.0.45/ping/": {}}})
        kind = req.url.path.rstrip("/").rsplit("/", 1)[-1]
        self.asked.append(kind)
        since = req.url.params.get("update_time")
        last = {"set": True, "infinite": False, "number": self.updated[kind]}
        if since is not None and int(since) >= self.updated[kind]:
            if kind == "jobs":
                return httpx2.Response(200, json={"jobs": [], "last_update": {"number": 0}})
            return httpx2.Response(304)
        items = self.partitions if kind == "partitions" else []
        return httpx2.Response(200, json={kind: items, "last_update": last})

    def client(self) -> SlurmClient:
        client = SlurmClient("http://slurm.test", StaticToken("t", user="u"))
        client.http = MockTransport(client.url, self.handler)
        return client


async def test_partitions_are_read_first_then_only_when_slurm_changed_something() -> None:
    slurm = DeltaSlurm()
    inf = SlurmInformer(slurm.client(), poll_interval=0.01, idle_interval=3600)
    events: list[tuple[str, str, str]] = []
    inf.subscribe(lambda e: events.append((e.kind, e.type, e.name)))
    inf.want_partitions("nodeset", True)
    inf.start()
    try:
        await wait_for(lambda: _true(inf.partitions_synced), timeout=5, what="first read")
        assert ("partition", "ADDED", "p") in events
        asked = len(slurm.asked)
        for _ in range(3):  # nothing changed: node deltas answer 304, no partition read
            assert await inf.refresh(timeout=5)
        assert slurm.asked[asked:] == ["nodes"] * 3
        # A restart: slurmctld advances its update times and forgot the partition.
        slurm.updated = {k: v + 1 for k, v in slurm.updated.items()}
        slurm.partitions = []
        assert await inf.refresh(timeout=5)
        await wait_for(
            lambda: _true(("partition", "DELETED", "p") in events),
            timeout=5,
            what="the lost partition seen",
        )
    finally:
        await inf.stop()


async def test_jobs_asked_for_an_answer_are_polled_alone_and_reused_while_fresh() -> None:
    slurm = DeltaSlurm()
    inf = SlurmInformer(slurm.client(), poll_interval=0.01, idle_interval=3600, watch_jobs=True)
    inf.start()
    try:
        await wait_for(lambda: _true(inf.has_synced), timeout=5, what="first poll")
        asked = len(slurm.asked)
        assert await inf.refresh_jobs("hpa", max_age=60, timeout=5)
        assert slurm.asked[asked:] == ["jobs"] and inf.jobs_synced
        assert await inf.refresh_jobs("hpa", max_age=60, timeout=5)
        assert slurm.asked[asked:] == ["jobs"], "fresh enough: answered from the cache"
        assert await inf.refresh_jobs("hpa", max_age=0, timeout=5)
        assert slurm.asked[asked:] == ["jobs", "jobs"]
        inf.release_jobs("hpa")
        assert not inf.jobs_synced
    finally:
        await inf.stop()


async def test_refresh_waits_for_a_poll_made_after_it_was_asked() -> None:
    client, asked = counting_slurm()
    inf = SlurmInformer(client, poll_interval=0.05, idle_interval=3600)
    inf.start()
    await wait_for(lambda: _true(inf.has_synced), timeout=5, what="first poll", interval=0.01)
    before = len(asked)
    assert await inf.refresh(timeout=5), "a poke during the idle wait polls now"
    assert len(asked) > before
    await inf.stop()


async def _true(value: bool) -> bool:
    return value


async def test_an_unreadable_slurm_answer_marks_the_cache_stale_not_frozen() -> None:
    def handler(req: httpx2.Request) -> httpx2.Response:
        if req.url.path == "/openapi/v3":
            return httpx2.Response(200, json={"paths": {"/slurm/v0.0.45/ping/": {}}})
        return httpx2.Response(200, json={"nodes": [{"name": "x", "cpus": "not a number"}]})

    client = SlurmClient("http://slurm.test", StaticToken("t", user="u"))
    client.http = MockTransport(client.url, handler)
    inf = SlurmInformer(client, poll_interval=0.05)
    inf.start()

    async def stale_with_reason() -> bool:
        return inf.stale and "unexpected payload" in inf.last_error

    await wait_for(stale_with_reason, timeout=5, what="stale with a reason", interval=0.01)
    assert inf.healthy
    await inf.stop()


def test_hostlists_expand_to_node_names() -> None:
    assert expand_hostlist("cpu-[0-2,5],gpu-1") == ["cpu-0", "cpu-1", "cpu-2", "cpu-5", "gpu-1"]
    assert expand_hostlist("n[08-10]") == ["n08", "n09", "n10"]
    assert expand_hostlist("") == []


async def test_a_cancelled_controller_does_not_wait_for_in_flight_work() -> None:
    started = asyncio.Event()

    class Slow:
        async def reconcile(self, key: str) -> Result:
            started.set()
            await asyncio.sleep(3600)
            return DONE

    ctrl = Controller("slow", Slow())
    ctrl.enqueue("ns/a")
    task = asyncio.create_task(ctrl.run(asyncio.Event()))
    await asyncio.wait_for(started.wait(), 5)
    task.cancel()
    done, _ = await asyncio.wait([task], timeout=2)
    assert done, "cancellation must not drain in-flight reconciles"


async def test_reconciles_that_never_suspend_still_let_the_rest_of_the_process_run() -> None:
    """A controller whose keys keep coming back, each reconciled without awaiting anything
    that suspends (answers from caches), must not hold the event loop: Lease renewals,
    probes and SIGTERM run on it too. The CI wedge was such a pair of keys."""
    beats = 0
    seen_at: list[int] = []

    async def heartbeat() -> None:
        nonlocal beats
        while True:
            beats += 1
            await asyncio.sleep(0)

    class FromCaches:
        async def reconcile(self, key: str) -> Result:
            seen_at.append(beats)
            if len(seen_at) < 200:
                ctrl.enqueue(key)  # "changed" again, with nothing awaited
            return DONE

    ctrl = Controller("caches", FromCaches(), workers=1)
    beating = asyncio.create_task(heartbeat())
    task = asyncio.create_task(ctrl.run(asyncio.Event()))
    try:
        ctrl.enqueue("ns/a")
        await wait_for(lambda: len(seen_at) >= 200, timeout=10, what="200 reconciles")
    finally:
        task.cancel()
        beating.cancel()
        await asyncio.gather(task, beating, return_exceptions=True)
    assert seen_at[150] - seen_at[50] >= 50  # the heartbeat ran between the reconciles


async def test_the_full_list_after_failed_polls_is_told_to_node_list_subscribers() -> None:
    # A slurmctld kill -9 seen by a failed poll: the next poll lists every node in full, and
    # the bridge must look at its jobs at once (one came back PENDING from state saved
    # before its allocation, its pod still bound): the soak saw 55 s pass, until the
    # 60-second recheck of running jobs, because only delta lists were told.
    slurm = DeltaSlurm()
    inf = SlurmInformer(slurm.client())
    told: list[int] = []
    inf.on_node_list(lambda: told.append(inf.polls))
    await inf.poll_once()  # the first list at start: nothing was known before
    assert told == []
    inf._mark_stale("slurmrestd http://slurm.test unreachable")
    await inf.poll_once()
    assert told == [2], "the list after the outage is told"
    inf.poke(full=True)
    await inf.poll_once()  # a full list we asked for (after deleting a node): not told
    assert told == [2]
    slurm.updated["nodes"] = 20
    await inf.poll_once()  # a delta list: told, as before
    assert told == [2, 4]


async def test_a_node_a_restarted_slurmctld_forgot_leaves_the_cache_at_the_resync() -> None:
    # slurmctld restarted from state saved before a dynamic node registered: the node is
    # gone and its update time went back, so delta polls answer "nothing changed"; only a
    # full list drops the node. The operator lists in full often enough that the pod is
    # replaced within the registration deadline.
    from slinky.operator.cluster.sync import SLURM_RESYNC_S
    from slinky.operator.nodeset.mirror import REGISTRATION_DEADLINE_S

    assert SLURM_RESYNC_S <= REGISTRATION_DEADLINE_S / 2
    slurm = DeltaSlurm()
    node = {"name": "batch-0", "state": ["IDLE"]}
    slurm.handler_nodes = [node]  # type: ignore[attr-defined]
    inner = slurm.handler

    def handler(req: httpx2.Request) -> httpx2.Response:
        resp = inner(req)
        if req.url.path.endswith("/nodes/") and resp.status_code == 200:
            body = resp.json()
            body["nodes"] = slurm.handler_nodes  # type: ignore[attr-defined]
            return httpx2.Response(200, json=body)
        return resp

    slurm.handler = handler  # type: ignore[method-assign]
    inf = SlurmInformer(slurm.client(), resync_interval=SLURM_RESYNC_S)
    await inf.poll_once()
    assert "batch-0" in inf.nodes
    slurm.handler_nodes = []  # type: ignore[attr-defined]  # the restarted slurmctld forgot it
    slurm.updated["nodes"] = 5  # and its update time went back
    await inf.poll_once()
    assert "batch-0" in inf.nodes, "a delta poll cannot see it"
    inf._last_resync -= SLURM_RESYNC_S
    await inf.poll_once()
    assert "batch-0" not in inf.nodes


async def test_demand_coming_and_going_makes_no_node_poll_of_its_own() -> None:
    """A scheduler whose waiting pods come and go flips its demand at every pod: that must
    not poll nodes each time (a burst of 500 pods made 12 polls a second); someone who
    starts waiting after a long quiet gets a poll at once."""
    client, asked = counting_slurm()
    inf = SlurmInformer(client, poll_interval=5, idle_interval=30)
    task = asyncio.ensure_future(inf.run())
    try:
        await wait_for(lambda: asked.count("nodes") == 1, timeout=5, what="first poll")
        for _ in range(100):
            inf.demand("scheduler", True)
            await asyncio.sleep(0)
            inf.demand("scheduler", False)
            await asyncio.sleep(0)
        await asyncio.sleep(0.2)
        assert asked.count("nodes") == 1, "the last poll is younger than the fast interval"
        inf.poll_interval = 0.01  # now it is older: demand polls at once
        inf.demand("scheduler", True)
        await wait_for(lambda: asked.count("nodes") >= 2, timeout=5, what="a poll on demand")
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
