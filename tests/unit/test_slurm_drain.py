"""The one drain/undrain rule both halves use (`slinky.slurm.drain`), through the real client
over a scripted transport: decided on the live node, our reason prefix, an admin's drain kept,
nothing written on a guess."""

from __future__ import annotations

import json
from dataclasses import dataclass

import httpx2
import pytest

from slinky.bridge.connection import SlurmConnection
from slinky.bridge.nodes import slurmcontrol as bridge_control
from slinky.operator.clients import Connection
from slinky.operator.nodeset import slurmcontrol as operator_control
from slinky.slurm import drain
from slinky.slurm.client import SlurmClient
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.models import Node
from slinky.slurm.tokens import StaticToken
from tests.unit.fake_http import MockTransport

OPENAPI: dict[str, object] = {"paths": {"/slurm/v0.0.45/ping/": {}, "/slurm/v0.0.44/ping/": {}}}
OURS = "slurm-operator: "


def node_json(*states: str, reason: str = "", comment: str = "") -> dict[str, object]:
    return {"name": "n0", "state": list(states), "reason": reason, "comment": comment}


@dataclass
class Bed:
    """A client whose slurmctld answers GET /node/n0 with `live` (None: refuses to answer)."""

    client: SlurmClient
    informer: SlurmInformer
    writes: list[dict[str, object]]
    reads: list[str]


def bed(*, cached: dict[str, object] | None, live: dict[str, object] | None) -> Bed:
    writes: list[dict[str, object]] = []
    reads: list[str] = []

    def handle(req: httpx2.Request) -> httpx2.Response:
        if req.url.path == "/openapi/v3":
            return httpx2.Response(200, json=OPENAPI)
        if req.method == "POST":
            writes.append(json.loads(req.content))
            return httpx2.Response(200, json={})
        reads.append(req.url.path)
        if live is None:
            return httpx2.Response(503, json={"errors": [{"error_number": 1, "error": "down"}]})
        return httpx2.Response(200, json={"nodes": [live]})

    client = SlurmClient("http://slurm.test", StaticToken("t", user="u"), retries=1)
    client.http = MockTransport(client.url, handle)
    informer = SlurmInformer(client)
    informer._synced.set()
    if cached is not None:
        informer.nodes["n0"] = Node.parse(cached)
    return Bed(client, informer, writes, reads)


async def test_drain_writes_our_reason_after_a_live_read() -> None:
    b = bed(cached=node_json("IDLE"), live=node_json("IDLE"))
    assert await drain.drain(b, "n0", f"{OURS}scale-in")
    assert b.reads and b.writes == [{"state": ["DRAIN"], "reason": f"{OURS}scale-in"}]


@pytest.mark.parametrize(
    ("cached", "live"),
    [
        (None, node_json("IDLE")),  # unknown to the cache: comes back once it registers
        (node_json("IDLE", "DRAIN", reason="admin: disk"), node_json("IDLE")),  # cache: done
        (node_json("IDLE"), node_json("IDLE", "DRAIN", reason="admin: disk")),  # admin since
    ],
)
async def test_drain_keeps_whoever_drained_first_and_skips_unknown_nodes(
    cached: dict[str, object] | None, live: dict[str, object]
) -> None:
    b = bed(cached=cached, live=live)
    assert not await drain.drain(b, "n0", f"{OURS}scale-in")
    assert b.writes == []


async def test_a_failed_live_read_writes_nothing() -> None:
    b = bed(cached=node_json("IDLE"), live=None)
    with pytest.raises(drain.CannotRead):
        await drain.drain(b, "n0", f"{OURS}scale-in")
    b2 = bed(cached=node_json("IDLE", "DRAIN", reason=f"{OURS}x"), live=None)
    with pytest.raises(drain.CannotRead):
        await drain.undrain(b2, "n0", prefix=OURS)
    assert b.writes == b2.writes == []


async def test_undrain_only_undoes_a_drain_with_our_prefix_on_the_live_node() -> None:
    ours = node_json("IDLE", "DRAIN", reason=f"{OURS}scale-in")
    admin = node_json("IDLE", "DRAIN", reason="admin: disk")
    b = bed(cached=ours, live=ours)
    assert await drain.undrain(b, "n0", prefix=OURS)
    assert b.writes == [{"state": ["UNDRAIN"]}]
    for cached, live in ((ours, admin), (admin, ours), (ours, node_json("IDLE")), (None, ours)):
        b = bed(cached=cached, live=live)
        assert not await drain.undrain(b, "n0", prefix=OURS)
        assert b.writes == []
    other_half = node_json("IDLE", "DRAIN", reason="slurm-bridge: cordoned")
    b = bed(cached=other_half, live=other_half)
    assert not await drain.undrain(b, "n0", prefix=OURS)


async def test_a_node_that_is_not_ours_is_never_written() -> None:
    b = bed(cached=node_json("IDLE"), live=node_json("IDLE"))
    assert not await drain.drain(b, "n0", f"{OURS}x", ours=lambda n: False)
    ours = node_json("IDLE", "DRAIN", reason=f"{OURS}x")
    b2 = bed(cached=ours, live=ours)
    assert not await drain.undrain(b2, "n0", prefix=OURS, ours=lambda n: False)
    assert b.writes == b2.writes == []


async def test_both_halves_use_the_rule_with_their_own_prefix() -> None:
    # The operator: a node claimed by another NodeSet's pod is not ours; a failed read is
    # "not now". The bridge: its prefix; a failed read fails the reconcile (retried).
    other = json.dumps({"namespace": "other", "podName": "n0", "nodeSet": "x", "node": ""})
    b = bed(cached=node_json("IDLE"), live=node_json("IDLE", comment=other))
    conn = Connection("ns/slurm", "uid", b.client.url, b.client, b.informer, "fp")
    assert not await operator_control.drain(conn, "n0", f"{OURS}x", namespace="ns")
    b = bed(cached=node_json("IDLE"), live=None)
    conn = Connection("ns/slurm", "uid", b.client.url, b.client, b.informer, "fp")
    assert not await operator_control.drain(conn, "n0", f"{OURS}x", namespace="ns")
    bridge_drain = node_json("IDLE", "DRAIN", reason="slurm-bridge: cordoned")
    b = bed(cached=bridge_drain, live=bridge_drain)
    assert await bridge_control.undrain(SlurmConnection(b.client, b.informer), "n0")
    b = bed(cached=node_json("IDLE"), live=None)
    with pytest.raises(drain.CannotRead):
        await bridge_control.drain(SlurmConnection(b.client, b.informer), "n0", "slurm-bridge: x")
