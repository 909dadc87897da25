"""The fail-closed drained check: every answer Slurm (or the network) can give, through the
real client over a scripted transport. Only DRAIN with no job, or a definite "no such node",
lets a pod go."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx2
import pytest

from slinky.operator.clients import Connection
from slinky.operator.nodeset.scalein import Drained, check_drained
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.models import Node
from slinky.slurm.tokens import StaticToken
from slinky.transport import TransportError
from tests.unit.fake_http import MockTransport

OPENAPI = {"paths": {"/slurm/v0.0.45/ping/": {}, "/slurm/v0.0.44/ping/": {}}}
Handler = Callable[[httpx2.Request], httpx2.Response]


def node_json(*states: str, comment: str = "") -> dict[str, object]:
    return {"name": "cpu-0", "state": list(states), "comment": comment}


def connection(
    handler: Handler, *, cached: list[str] | None = None, synced: bool = True, stale: bool = False
) -> tuple[Connection, list[str]]:
    calls: list[str] = []

    def record(req: httpx2.Request) -> httpx2.Response:
        calls.append(req.url.path)
        if req.url.path == "/openapi/v3":
            return httpx2.Response(200, json=OPENAPI)
        return handler(req)

    client = SlurmClient("http://slurm.test", StaticToken("t", user="u"), retries=1)
    client.http = MockTransport(client.url, record)
    informer = SlurmInformer(client)
    if synced:
        informer._synced.set()
    informer.stale = stale
    if cached is not None:
        informer.nodes["cpu-0"] = Node.parse(node_json(*cached))
    conn = Connection("ns/slurm", "uid", client.url, client, informer, "fp")
    return conn, calls


def answer(status: int, body: object) -> Handler:
    return lambda req: httpx2.Response(status, json=body)


async def verdict(conn: Connection) -> Drained:
    return await check_drained(conn, "cpu-0", namespace="ns")


async def test_no_such_node_answered_200_is_absent() -> None:
    conn, _ = connection(answer(200, {"nodes": []}))
    assert await verdict(conn) is Drained.ABSENT


async def test_slurms_invalid_node_error_is_absent() -> None:
    body = {"errors": [{"error_number": 2018, "error": "Invalid node name specified"}]}
    conn, _ = connection(answer(500, body))
    assert await verdict(conn) is Drained.ABSENT


async def test_drain_and_idle_is_drained() -> None:
    conn, _ = connection(answer(200, {"nodes": [node_json("IDLE", "DRAIN")]}), cached=None)
    assert (await verdict(conn)).safe


@pytest.mark.parametrize(
    "states", [["ALLOCATED", "DRAIN"], ["MIXED", "DRAIN"], ["IDLE", "DRAIN", "COMPLETING"]]
)
async def test_drain_with_jobs_is_busy_live(states: list[str]) -> None:
    # The cache still says drained; Slurm's live answer says a job runs.
    conn, _ = connection(answer(200, {"nodes": [node_json(*states)]}), cached=["IDLE", "DRAIN"])
    assert await verdict(conn) is Drained.BUSY


@pytest.mark.parametrize(
    "states", [["ALLOCATED", "DRAIN"], ["MIXED", "DRAIN"], ["IDLE", "DRAIN", "COMPLETING"]]
)
async def test_a_cache_showing_jobs_says_wait_without_asking(states: list[str]) -> None:
    conn, calls = connection(answer(500, {}), cached=states)
    assert await verdict(conn) is Drained.BUSY
    assert calls == [], "the authoritative GET is only for nodes the cache shows drained"


async def test_not_drained_at_all_is_not_safe() -> None:
    conn, _ = connection(answer(200, {"nodes": [node_json("IDLE")]}))
    assert await verdict(conn) is Drained.NOT_DRAIN


async def test_a_bare_404_is_an_error_and_renegotiates_the_data_parser() -> None:
    conn, calls = connection(answer(404, {}))
    assert await verdict(conn) is Drained.UNKNOWN
    assert conn.client.version is None, "a path that is not served means: ask again"
    assert await verdict(conn) is Drained.UNKNOWN
    assert calls.count("/openapi/v3") == 2


async def test_a_server_error_is_unknown() -> None:
    conn, _ = connection(answer(503, {"errors": [{"error_number": 1, "error": "busy"}]}))
    assert await verdict(conn) is Drained.UNKNOWN
    conn, _ = connection(lambda req: httpx2.Response(502, text="<html>bad gateway</html>"))
    assert await verdict(conn) is Drained.UNKNOWN


async def test_a_refused_token_is_unknown() -> None:
    conn, _ = connection(lambda req: httpx2.Response(401, text="Authentication failure"))
    assert await verdict(conn) is Drained.UNKNOWN


async def test_a_connection_error_is_unknown() -> None:
    def refuse(req: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("refused", request=req)

    conn, _ = connection(refuse)
    assert await verdict(conn) is Drained.UNKNOWN


async def test_an_informer_not_synced_or_stale_is_unknown_without_asking() -> None:
    for synced, stale in ((False, True), (False, False), (True, True)):
        conn, calls = connection(answer(200, {"nodes": []}), synced=synced, stale=stale)
        assert await verdict(conn) is Drained.UNKNOWN
        assert calls == []
    assert await check_drained(None, "cpu-0", namespace="ns") is Drained.UNKNOWN


async def test_a_node_claimed_by_another_pod_is_never_drained_for_us() -> None:
    other = json.dumps({"namespace": "other", "podName": "cpu-0", "nodeSet": "cpu", "node": ""})
    conn, _ = connection(answer(200, {"nodes": [node_json("IDLE", "DRAIN", comment=other)]}))
    assert await verdict(conn) is Drained.FOREIGN
    assert not Drained.FOREIGN.safe


async def test_a_full_list_fetched_for_many_pods_answers_without_per_node_reads() -> None:
    conn, calls = connection(answer(500, {}))
    drained = Node.parse(node_json("IDLE", "DRAIN"))
    assert await check_drained(conn, "cpu-0", namespace="ns", snapshot={}) is Drained.ABSENT
    snap = {"cpu-0": drained}
    assert await check_drained(conn, "cpu-0", namespace="ns", snapshot=snap) is Drained.DRAINED
    busy = {"cpu-0": Node.parse(node_json("MIXED", "DRAIN"))}
    assert await check_drained(conn, "cpu-0", namespace="ns", snapshot=busy) is Drained.BUSY
    assert calls == []


async def test_a_written_condemned_annotation_is_seen_before_the_cache_shows_it() -> None:
    # The next pass must not take a pod it just condemned for one that is not: it would
    # pick a second victim (two pods unavailable where maxUnavailable allows one).
    from typing import Any

    from slinky.kube.expectations import Expectations
    from slinky.operator.nodeset import pods
    from slinky.operator.nodeset.builder import ANNOTATION_CONDEMNED
    from slinky.operator.nodeset.podcontrol import PodControl

    class Kube:
        async def patch(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            return {}

    control = PodControl(Kube(), Expectations())  # type: ignore[arg-type]
    stale = pods.CachedPod({"metadata": {"name": "cpu-0", "namespace": "ns", "uid": "u1"}})
    assert control.as_written(stale) is stale
    await control.patch_metadata(stale, annotations={ANNOTATION_CONDEMNED: "rolling update"})
    assert pods.condemned(control.as_written(stale)) == "rolling update"
    caught_up = pods.CachedPod(
        {"metadata": {**stale["metadata"], "annotations": {ANNOTATION_CONDEMNED: "rolling update"}}}
    )
    assert control.as_written(caught_up) is caught_up
    assert control.as_written(stale) is stale  # forgotten once the cache showed it
    await control.patch_metadata(caught_up, annotations={ANNOTATION_CONDEMNED: None})
    assert pods.condemned(control.as_written(caught_up)) is None


async def test_a_delete_without_an_answer_is_not_waited_for() -> None:
    """Soak run 8: the apiserver died under a pod deletion (ConnectError); the deletion
    stayed expected and the NodeSet did nothing for 5 minutes (the expectation's expiry)."""
    from typing import Any

    from slinky.kube.expectations import Expectations
    from slinky.operator.nodeset.podcontrol import PodControl

    class Kube:
        async def delete(self, *args: Any, **kwargs: Any) -> None:
            raise TransportError("ClientConnectorError: connection refused", sent=False)

        async def create(self, *args: Any, **kwargs: Any) -> None:
            raise TransportError("ServerDisconnectedError: Server disconnected", sent=True)

    expectations = Expectations()
    control = PodControl(Kube(), expectations)  # type: ignore[arg-type]
    pod = {"metadata": {"name": "cpu-0", "namespace": "ns", "uid": "u1"}}
    with pytest.raises(TransportError):
        await control.delete_pod("ns/cpu", pod)
    assert expectations.satisfied("ns/cpu")
    with pytest.raises(TransportError):
        await control.create_pod("ns/cpu", pod)
    assert expectations.satisfied("ns/cpu")
