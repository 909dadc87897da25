"""Condemnation bookkeeping: when a pod was condemned and when its node's jobs end at the
latest by their time limits (one job list per removal step), and the gauges built on them."""

from __future__ import annotations

import asyncio
import datetime as dt

import httpx2

from slinky.operator.autoscale.metrics import ObjectGauges, condemned_notes, drain_times
from slinky.operator.nodeset import scalein
from slinky.operator.nodeset.builder import (
    ANNOTATION_CONDEMNED,
    ANNOTATION_CONDEMNED_AT,
    ANNOTATION_DRAIN_DEADLINE,
)
from tests.unit.test_nodeset_drained import connection

NOW = dt.datetime(2026, 11, 26, 12, 0, tzinfo=dt.UTC)
T0 = int(NOW.timestamp())


def job(job_id: int, state: list[str], nodes: str, end: int) -> dict[str, object]:
    return {"job_id": job_id, "job_state": state, "nodes": nodes, "end_time": end}


JOBS = [
    job(1, ["RUNNING"], "cpu-[0-1]", T0 + 600),
    job(2, ["RUNNING"], "cpu-0", T0 + 3600),
    job(3, ["PENDING"], "", T0 + 9000),
    job(4, ["COMPLETED"], "cpu-2", T0 - 60),  # ended: holds nothing
    job(5, ["COMPLETED", "COMPLETING"], "cpu-3", T0 - 30),  # still holds its node
]


def at(ts: int) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


async def test_the_latest_end_of_each_nodes_jobs_from_one_job_list() -> None:
    conn, calls = connection(lambda req: httpx2.Response(200, json={"jobs": JOBS}))
    ends = scalein.JobEnds(conn)
    got = await asyncio.gather(
        *(ends.deadline(n, NOW) for n in ("cpu-0", "cpu-1", "cpu-2", "cpu-3", "cpu-9"))
    )
    assert got == [at(T0 + 3600), at(T0 + 600), NOW, at(T0 - 30), NOW]
    assert [c for c in calls if c.endswith("/jobs/")] == ["/slurm/v0.0.45/jobs/"]


async def test_jobs_are_read_fresh_even_while_the_informer_polls_them() -> None:
    # The cache may predate a job that started just before the drain: Slurm is asked.
    conn, calls = connection(lambda req: httpx2.Response(200, json={"jobs": JOBS}))
    conn.informer.jobs = {}
    conn.informer.jobs_synced = True
    assert await scalein.JobEnds(conn).deadline("cpu-0", NOW) == at(T0 + 3600)
    assert [c for c in calls if c.endswith("/jobs/")] == ["/slurm/v0.0.45/jobs/"]


async def test_no_job_list_no_deadline() -> None:
    conn, _ = connection(lambda req: httpx2.Response(500, json={}))
    assert await scalein.JobEnds(conn).deadline("cpu-0", NOW) is None
    assert await scalein.JobEnds(None).deadline("cpu-0", NOW) is None


def pod(**notes: str) -> dict[str, object]:
    return {"metadata": {"name": "cpu-0", "annotations": notes}}


def test_condemnation_writes_why_since_when_and_the_deadline_once() -> None:
    first = scalein.condemnation(pod(), "scale-in", NOW)
    assert first[ANNOTATION_CONDEMNED] == "scale-in"
    assert first[ANNOTATION_DRAIN_DEADLINE] == "2026-11-26T12:00:00Z"
    assert ANNOTATION_CONDEMNED_AT in first
    written = pod(**{k: str(v) for k, v in first.items()})
    assert scalein.condemnation(written, "scale-in", at(T0 + 99)) == {}
    # The NodeSet deleted while the scale-in waits: the reason changes, not since when.
    assert scalein.condemnation(written, "nodeset deleted", None) == {
        ANNOTATION_CONDEMNED: "nodeset deleted"
    }
    # Jobs could not be read at condemnation: the deadline comes with a later pass.
    no_deadline = pod(**{ANNOTATION_CONDEMNED: "update", ANNOTATION_CONDEMNED_AT: "x"})
    assert scalein.condemnation(no_deadline, "update", None) == {}
    assert scalein.condemnation(no_deadline, "update", NOW) == {
        ANNOTATION_DRAIN_DEADLINE: "2026-11-26T12:00:00Z"
    }


def test_drain_seconds_from_condemnation_to_now() -> None:
    since = pod(**{ANNOTATION_CONDEMNED_AT: "2026-11-26T11:58:30Z"})
    assert scalein.drain_seconds(since, NOW) == 90.0
    assert scalein.drain_seconds(pod(), NOW) == 0.0  # drained at the first check
    assert scalein.drain_seconds(pod(**{ANNOTATION_CONDEMNED_AT: "garbage"}), NOW) == 0.0


def test_drain_gauges_take_the_earliest_condemned_pod_and_vanish_without_one() -> None:
    nodeset = {"metadata": {"name": "compute", "namespace": "ns", "uid": "u1"}, "spec": {}}
    condemned = [
        pod(
            **{
                ANNOTATION_CONDEMNED: "scale-in",
                ANNOTATION_CONDEMNED_AT: "2026-11-26T11:00:00Z",
                ANNOTATION_DRAIN_DEADLINE: "2026-11-26T14:00:00Z",
            }
        ),
        pod(
            **{
                ANNOTATION_CONDEMNED: "scale-in",
                ANNOTATION_CONDEMNED_AT: "2026-11-26T11:30:00Z",
                ANNOTATION_DRAIN_DEADLINE: "2026-11-26T13:00:00Z",
            }
        ),
        # Kept again (un-condemned) but not yet cleaned: not counted.
        pod(**{ANNOTATION_CONDEMNED_AT: "2026-11-26T10:00:00Z"}),
    ]
    assert drain_times(condemned_notes(nodeset, lambda uid: condemned)) == (T0 - 3600, T0 + 3600)
    pods = {"u1": condemned}
    fams = {f.name: f for f in ObjectGauges(lambda: [nodeset], list, pods.__getitem__).collect()}
    (started,) = fams["slinky_nodeset_drain_started_timestamp_seconds"].samples
    (deadline,) = fams["slinky_nodeset_drain_deadline_timestamp_seconds"].samples
    assert (started.labels, started.value) == ({"namespace": "ns", "nodeset": "compute"}, T0 - 3600)
    assert deadline.value == T0 + 3600
    pods["u1"] = [pod()]
    fams = {f.name: f for f in ObjectGauges(lambda: [nodeset], list, pods.__getitem__).collect()}
    assert fams["slinky_nodeset_drain_started_timestamp_seconds"].samples == []
    assert fams["slinky_nodeset_drain_deadline_timestamp_seconds"].samples == []


async def test_a_busy_pod_is_condemned_with_its_deadline_and_its_drain_timed_at_deletion() -> None:
    """Through the removal step: the busy node's pod gets why, since when and the deadline
    from one job list; once Slurm says drained, the deletion observes the drain duration."""
    from types import SimpleNamespace
    from typing import Any

    from prometheus_client import REGISTRY

    from slinky.api.schema import parse
    from slinky.api.v1alpha1.nodeset import NodeSetSpec
    from slinky.operator.nodeset.view import View
    from slinky.slurm.models import Node

    slurm_says = {"state": ["MIXED", "DRAIN"]}

    def handler(req: httpx2.Request) -> httpx2.Response:
        if req.url.path.endswith("/jobs/"):
            return httpx2.Response(200, json={"jobs": JOBS})
        if "/node/" in req.url.path:  # the drain (POST) and the drained check (GET)
            return httpx2.Response(200, json={"nodes": [{"name": "cpu-0", **slurm_says}]})
        return httpx2.Response(404, json={})

    conn, calls = connection(handler)
    conn.informer.nodes["cpu-0"] = Node.parse({"name": "cpu-0", "state": ["MIXED", "DRAIN"]})

    class Control:
        def __init__(self) -> None:
            self.patches: list[dict[str, Any]] = []
            self.deleted: list[str] = []

        async def patch_metadata(self, pod: Any, *, annotations: dict[str, Any]) -> None:
            self.patches.append(annotations)
            pod["metadata"]["annotations"].update(annotations)

        async def delete_pod(self, _exp: str, pod: Any) -> bool:
            self.deleted.append(pod["metadata"]["name"])
            return True

    control = Control()
    ctx: Any = SimpleNamespace(
        podcontrol=control,
        recorder=SimpleNamespace(event=lambda *a, **k: None),
        partitions=None,
    )
    the_pod = {
        "metadata": {"name": "cpu-0", "namespace": "ns", "uid": "p0", "annotations": {}},
        "spec": {"nodeName": "k1"},
    }
    obj = {"metadata": {"name": "ddl", "namespace": "ns", "uid": "nsuid"}, "spec": {}}
    spec = parse(NodeSetSpec, {"clusterName": "slurm", "selector": {}, "template": {}}, "spec")

    def view() -> View:
        return View(obj, spec, "ns/ddl", "ns/ddl/nsuid", "r", None, conn, {"cpu-0": the_pod}, {})

    waiting = await scalein.remove_all(ctx, view(), [the_pod], "scale-in", "slurm-operator: x")
    assert list(waiting) == ["cpu-0"]
    (patch,) = control.patches
    assert patch[ANNOTATION_CONDEMNED] == "scale-in"
    assert patch[ANNOTATION_DRAIN_DEADLINE] == at(T0 + 3600).strftime("%Y-%m-%dT%H:%M:%SZ")
    await scalein.remove_all(ctx, view(), [the_pod], "scale-in", "slurm-operator: x")
    assert len(control.patches) == 1  # nothing new to write
    assert sum(c.endswith("/jobs/") for c in calls) == 1

    labels = {"namespace": "ns", "nodeset": "ddl", "reason": "scale-in"}
    count = "slinky_nodeset_drain_duration_seconds_count"
    before = REGISTRY.get_sample_value(count, labels) or 0.0
    slurm_says["state"] = ["IDLE", "DRAIN"]
    conn.informer.nodes["cpu-0"] = Node.parse({"name": "cpu-0", "state": ["IDLE", "DRAIN"]})
    assert await scalein.remove_all(ctx, view(), [the_pod], "scale-in", "slurm-operator: x") == {}
    assert control.deleted == ["cpu-0"]
    assert REGISTRY.get_sample_value(count, labels) == before + 1


async def test_no_deadline_is_read_while_slurm_cannot_be_asked() -> None:
    """A stale view (slurmctld down): the pod is condemned, the job list is not asked for
    (the pass is not slowed by a request bound to fail)."""
    from types import SimpleNamespace
    from typing import Any

    from slinky.api.schema import parse
    from slinky.api.v1alpha1.nodeset import NodeSetSpec
    from slinky.operator.nodeset.view import View

    conn, calls = connection(lambda req: httpx2.Response(200, json={"jobs": JOBS}), stale=True)
    patches: list[dict[str, Any]] = []

    async def patch_metadata(pod: Any, *, annotations: dict[str, Any]) -> None:
        patches.append(annotations)

    ctx: Any = SimpleNamespace(
        podcontrol=SimpleNamespace(patch_metadata=patch_metadata),
        recorder=SimpleNamespace(event=lambda *a, **k: None),
        partitions=None,
    )
    the_pod = {
        "metadata": {"name": "cpu-0", "namespace": "ns", "uid": "p0", "annotations": {}},
        "spec": {"nodeName": "k1"},
    }
    obj = {"metadata": {"name": "ddl", "namespace": "ns", "uid": "nsuid"}, "spec": {}}
    spec = parse(NodeSetSpec, {"clusterName": "slurm", "selector": {}, "template": {}}, "spec")
    view = View(obj, spec, "ns/ddl", "ns/ddl/nsuid", "r", None, conn, {"cpu-0": the_pod}, {})
    waiting = await scalein.remove_all(ctx, view, [the_pod], "scale-in", "slurm-operator: x")
    assert waiting == {"cpu-0": scalein.Drained.UNKNOWN}
    (patch,) = patches
    assert patch[ANNOTATION_CONDEMNED] == "scale-in" and ANNOTATION_DRAIN_DEADLINE not in patch
    assert calls == []
