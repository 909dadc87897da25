"""Pure logic of autoscaling: the partition config a NodeSet may set, which pending jobs
count as demand, and the label selectors the external metrics API accepts."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, cast

import pytest

from slinky.operator.autoscale.extapi import SelectorError, parse_selector
from slinky.operator.autoscale.metrics import (
    Ceiling,
    ClusterStats,
    SlurmMetrics,
    compute,
    counts,
    demand,
    hpa_ceiling,
    never_fits,
    nodeset_of,
    nodeset_value,
)
from slinky.operator.nodeset.partition import PartitionConfigError, minutes, parse_config
from slinky.slurm.informer import SlurmInformer
from slinky.slurm.models import Job, Node, Partition


def test_partition_config_becomes_partition_info_fields() -> None:
    body = parse_config("MaxTime=1-00:00:00 Default=YES OverSubscribe=FORCE:2 State=DRAIN")
    assert body["maximums"]["time"] == {"set": True, "infinite": False, "number": 1440}
    assert body["flags"] == ["DEFAULT"]
    assert body["maximums"]["oversubscribe"] == {"jobs": 2, "flags": ["force"]}
    assert body["partition"]["state"] == ["DRAIN"]
    assert parse_config("maxtime=UNLIMITED hidden=no")["maximums"]["time"]["infinite"] is True
    assert parse_config("") == {}
    assert parse_config("Topology=racks") == {"topology": "racks"}


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ("MaxTime=60 Bogus=1", "Bogus"),
        ("Nodes=a,b", "Nodes"),
        ("PartitionName=x", "PartitionName"),
        ("MaxTime=soon", "MaxTime"),
        ("Default=maybe", "Default"),
        ("OverSubscribe=SOMETIMES", "OverSubscribe"),
        ("MaxTime", "MaxTime"),
        ("Topology=a:b", "Topology"),
    ],
)
def test_bad_partition_config_names_the_key(config: str, names: str) -> None:
    with pytest.raises(PartitionConfigError, match=names):
        parse_config(config)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("90", 90),
        ("1:30", 2),
        ("2:00:00", 120),
        ("1-2", 1560),
        ("1-0:30", 1470),
        ("INFINITE", None),
    ],
)
def test_slurm_time_formats_in_minutes(text: str, want: int | None) -> None:
    assert minutes("MaxTime", text) == want


def job(job_id: int, state: str, reason: str = "", partition: str = "p", nodes: int = 1) -> Job:
    return Job.parse(
        {
            "job_id": job_id,
            "job_state": [state],
            "state_reason": reason,
            "partition": partition,
            "node_count": {"set": True, "number": nodes},
        }
    )


def node(name: str, state: list[str], partitions: str, ns: str = "", pod: str = "") -> Node:
    comment = json.dumps({"namespace": ns, "podName": pod}) if ns else ""
    return Node.parse(
        {
            "name": name,
            "state": state,
            "partitions": partitions.split(","),
            "features": [pod.rsplit("-", 1)[0]] if pod else [],
            "comment": comment,
        }
    )


@pytest.mark.parametrize(
    ("state", "reason", "counted"),
    [
        ("PENDING", "PartitionConfig", True),  # no nodes yet: the scale-from-zero case
        ("PENDING", "Resources", True),
        ("PENDING", "Priority", True),
        ("PENDING", "JobHeldUser", False),
        ("PENDING", "JobHeldAdmin", False),
        ("PENDING", "Dependency", False),
        ("PENDING", "BeginTime", False),
        ("RUNNING", "None", False),
    ],
)
def test_which_pending_jobs_are_demand(state: str, reason: str, counted: bool) -> None:
    assert counts(job(1, state, reason)) is counted


def test_stats_per_partition_and_nodeset_from_the_cache() -> None:
    informer: Any = SlurmInformer.__new__(SlurmInformer)
    informer.polls = 7
    informer.jobs_synced = True
    informer.partitions = {"p": Partition("p", "", "UP"), "empty": Partition("empty", "", "UP")}
    informer.jobs = {
        1: job(1, "PENDING", "PartitionConfig", "p", nodes=3),
        2: job(2, "PENDING", "Resources", "p,q"),
        3: job(3, "PENDING", "JobHeldUser", "p"),
        4: job(4, "RUNNING", "None", "p"),
    }
    informer.nodes = {
        "cpu-0": node("cpu-0", ["IDLE"], "p", "ns", "cpu-0"),
        "cpu-1": node("cpu-1", ["IDLE", "DRAIN"], "p", "ns", "cpu-1"),
        "cpu-2": node("cpu-2", ["ALLOCATED"], "p", "ns", "cpu-2"),
        "other": node("other", ["IDLE"], "q"),
    }
    stats = compute(informer)
    assert (stats.partitions["p"].jobs_pending, stats.partitions["p"].jobs_pending_nodes) == (2, 4)
    assert stats.partitions["p"].nodes_idle == 1
    assert stats.partitions["q"].jobs_pending == 1 and stats.partitions["q"].nodes_idle == 1
    assert stats.partitions["empty"].jobs_pending == 0  # known, so answered with 0, not 404
    assert stats.nodeset_idle == {("ns", "cpu"): 1}


def test_without_polled_jobs_only_idle_nodes_are_known() -> None:
    informer: Any = SlurmInformer.__new__(SlurmInformer)
    informer.polls = 7
    informer.jobs_synced = False  # nobody asked for jobs: the job cache is not current
    informer.partitions = {"p": Partition("p", "", "UP")}
    informer.jobs = {1: job(1, "PENDING", "PartitionConfig", "p", nodes=3)}
    informer.nodes = {"cpu-0": node("cpu-0", ["IDLE"], "p", "ns", "cpu-0")}
    stats = compute(informer)
    assert not stats.jobs_known
    assert stats.partitions["p"].jobs_pending == 0 and stats.partitions["p"].nodes_idle == 1
    assert stats.nodeset_idle == {("ns", "cpu"): 1}


def test_nodeset_of_a_node_needs_our_identity_and_its_feature() -> None:
    assert nodeset_of(node("gpu-3", ["IDLE"], "p", "ns", "gpu-3")) == ("ns", "gpu")
    assert nodeset_of(node("x", ["IDLE"], "p")) is None


def test_label_selectors_are_equality_terms() -> None:
    assert parse_selector("partition=debug") == {"partition": "debug"}
    assert parse_selector("partition==debug,cluster=slurm") == {
        "partition": "debug",
        "cluster": "slurm",
    }
    assert parse_selector("") == {}
    for bad in ("partition!=debug", "partition in (a,b)", "partition"):
        with pytest.raises(SelectorError):
            parse_selector(bad)


def test_a_nodeset_gauge_reads_the_partition_the_nodeset_has_not_one_named_like_it() -> None:
    # The slurm chart names NodeSets <release>-compute-<name> and their partitions <name>:
    # the NodeSet gauges read 0 there while jobs queued in its partition.
    from slinky.operator.autoscale.metrics import (
        PartitionStats,
        SlurmMetrics,
        nodeset_value,
    )

    queued = [job(1, "PENDING", nodes=1), job(2, "PENDING", nodes=2), job(3, "PENDING", nodes=2)]
    stats = ClusterStats(
        polls=1,
        jobs_known=True,
        partitions={
            "gpu": PartitionStats(jobs_pending=3, jobs_pending_nodes=5),
            "slurm-compute-gpu": PartitionStats(),
        },
        pending={"gpu": queued},
    )
    metrics: Any = SlurmMetrics(cast(Any, None))

    def nodeset(name: str, spec_name: str | None, claimed: str | None) -> dict[str, object]:
        ann = {"nodeset.slinky.slurm.net/partition": claimed} if claimed else {}
        spec = {"partition": {"enabled": True, **({"name": spec_name} if spec_name else {})}}
        return {"metadata": {"name": name, "namespace": "ns", "annotations": ann}, "spec": spec}

    for obj in (
        nodeset("slurm-compute-gpu", "gpu", None),
        nodeset("slurm-compute-gpu", "gpu", "gpu"),
        nodeset("gpu", None, None),
    ):
        assert nodeset_value(metrics, stats, obj, "slurm_nodeset_jobs_pending") == 3
        assert nodeset_value(metrics, stats, obj, "slurm_nodeset_jobs_pending_nodes") == 5


async def test_a_job_metric_whose_poll_failed_answers_503_not_an_old_queue() -> None:
    # The HPA keeps the current scale on a 503; an answer from a queue polled minutes ago
    # (slurmrestd down since) would scale on what no longer is.
    from types import SimpleNamespace
    from typing import Any, cast

    from slinky.operator.autoscale.extapi import MetricsAPI
    from slinky.operator.autoscale.metrics import PartitionStats

    class Informer:
        def __init__(self, ok: bool) -> None:
            self.ok = ok

        def want_partitions(self, key: str, on: bool) -> None:
            pass

        async def refresh_jobs(self, key: str, *, max_age: float, timeout: float) -> bool:
            return self.ok

    stats = ClusterStats(polls=1, jobs_known=True, partitions={"compute": PartitionStats(2, 2)})
    nodeset = {"metadata": {"name": "compute", "namespace": "ns"}, "spec": {"clusterName": "c"}}

    def api(ok: bool) -> MetricsAPI:
        conn = SimpleNamespace(informer=Informer(ok))
        clients = SimpleNamespace(get=lambda k: conn, keys=lambda: ["ns/c"])
        none = cast(Any, None)
        metrics: Any = SlurmMetrics(cast(Any, clients))
        metrics.cluster = lambda k: stats
        return MetricsAPI(
            kube=none,
            clients=cast(Any, clients),
            metrics=metrics,
            nodeset_get=lambda k: nodeset,
            leading=lambda: True,
            tls=none,
            allowed_names=[],
        )

    sel = {"partition": "compute"}
    assert (await api(True)._partition("ns", "slurm_partition_jobs_pending", sel)).status == 200
    assert (await api(False)._partition("ns", "slurm_partition_jobs_pending", sel)).status == 503
    sel = {"nodeset": "compute"}
    assert (await api(True)._nodeset("ns", "slurm_nodeset_jobs_pending", sel)).status == 200
    assert (await api(False)._nodeset("ns", "slurm_nodeset_jobs_pending", sel)).status == 503


def test_nodeset_replicas_by_state_count_condemned_pods_and_clusters_report_ready() -> None:
    from slinky.operator.autoscale.metrics import ObjectGauges

    nodeset = {
        "metadata": {"name": "compute", "namespace": "ns", "uid": "u1"},
        "spec": {"replicas": 3},
        "status": {"replicas": 3, "readyReplicas": 2, "slurmAllocated": 1, "slurmIdle": 1},
    }
    condemned = {"metadata": {"annotations": {"nodeset.slinky.slurm.net/condemned": "scale-in"}}}
    pods = {"u1": [condemned, {"metadata": {}}]}
    cluster = {
        "metadata": {"name": "slurm", "namespace": "ns"},
        "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Unauthorized"}]},
    }
    fams = {
        f.name: f
        for f in ObjectGauges(lambda: [nodeset], lambda: [cluster], lambda u: pods[u]).collect()
    }
    got = {s.labels["state"]: s.value for s in fams["slinky_nodeset_replicas"].samples}
    assert got == {
        "desired": 3, "current": 3, "ready": 2, "updated": 0, "condemned": 1,
        "slurm_idle": 1, "slurm_allocated": 1, "slurm_down": 0, "slurm_drain": 0,
    }  # fmt: skip
    (ready,) = fams["slinky_cluster_ready"].samples
    assert (ready.labels["reason"], ready.value) == ("Unauthorized", 0.0)


def sized(job_id: int, nodes: int = 1, **raw: Any) -> Job:
    """A pending job asking for `nodes` nodes and, in `raw`, cpus/cpus_per_task/memory."""
    return Job.parse(
        {
            "job_id": job_id,
            "job_state": ["PENDING"],
            "state_reason": "Resources",
            "partition": "p",
            "node_count": {"set": True, "number": nodes},
            **raw,
        }
    )


def test_a_job_larger_than_the_nodeset_at_its_largest_never_fits_naming_both() -> None:
    # sbatch -N 5 against an HPA maxReplicas of 4 was counted: the HPA scaled to 4 for it
    # and kept 4 idle pods for as long as it pended.
    top = Ceiling(nodes=4, cpus=8, memory_mb=16000, source="HPA cpu maxReplicas")
    assert never_fits(sized(1, nodes=5), top) == (
        "asks for 5 nodes, the NodeSet has at most 4 (HPA cpu maxReplicas)"
    )
    assert never_fits(sized(2, nodes=4), top) is None
    assert never_fits(sized(3, cpus=33), top) == (
        "asks for 33 CPUs, the NodeSet's 4 nodes at most (HPA cpu maxReplicas) have 32"
    )
    assert never_fits(sized(4, cpus=32), top) is None
    per_task = sized(5, cpus=12, cpus_per_task={"set": True, "number": 12})
    assert never_fits(per_task, top) == "asks for 12 CPUs per task, a node of the NodeSet has 8"
    memory = sized(6, memory_per_node={"set": True, "infinite": False, "number": 20000})
    assert never_fits(memory, top) == (
        "asks for 20000 MB of memory per node, a node of the NodeSet has 16000 MB"
    )
    assert never_fits(sized(7, memory_per_node={"set": True, "number": 16000}), top) is None


def test_without_an_hpa_or_nodes_nothing_is_left_out() -> None:
    # No HPA: nothing bounds the node count; no Slurm node yet (scale from zero): their size
    # is unknown, so no CPU or memory rule applies.
    assert never_fits(sized(1, nodes=500, cpus=10000), Ceiling()) is None
    assert never_fits(sized(2, nodes=3, cpus=10000), Ceiling(nodes=4, source="x")) is None


def test_demand_counts_what_may_fit_and_lists_what_never_does() -> None:
    top = Ceiling(nodes=4, source="HPA a maxReplicas")
    found = demand([sized(1, nodes=5), sized(2, nodes=2), sized(3, nodes=1)], top)
    assert (found.jobs_pending, found.jobs_pending_nodes) == (2, 3)
    assert found.never == [(1, "asks for 5 nodes, the NodeSet has at most 4 (HPA a maxReplicas)")]


def test_the_ceiling_is_the_largest_maxreplicas_of_the_hpas_scaling_the_nodeset() -> None:
    hpas = [
        {"metadata": {"name": "a"}, "spec": {"maxReplicas": 4}},
        {"metadata": {"name": "b"}, "spec": {"maxReplicas": 6}},
    ]
    assert hpa_ceiling(hpas) == (6, "HPA b maxReplicas")
    assert hpa_ceiling([]) == (None, "")


def test_a_nodeset_gauge_leaves_out_a_job_larger_than_its_hpa_maximum() -> None:
    """The whole path: compute() over the cache, the NodeSet's HPA from the informer and its
    Slurm nodes' size, the gauge value."""
    informer: Any = SlurmInformer.__new__(SlurmInformer)
    informer.polls = 1
    informer.jobs_synced = True
    informer.partitions = {"cpu": Partition("cpu", "", "UP")}
    informer.jobs = {
        1: job(1, "PENDING", "Resources", "cpu", nodes=5),
        2: job(2, "PENDING", "Resources", "cpu", nodes=2),
        3: job(3, "PENDING", "Resources", "cpu", nodes=1),
    }
    small = dataclasses.replace(
        node("cpu-0", ["IDLE"], "cpu", "ns", "cpu-0"), cpus=4, real_memory=8000
    )
    informer.nodes = {"cpu-0": small}
    stats = compute(informer)
    hpa = {"metadata": {"name": "cpu"}, "spec": {"maxReplicas": 4}}
    metrics: Any = SlurmMetrics(
        cast(Any, None), hpas_of=lambda key: [hpa] if key == "ns/cpu" else []
    )
    obj = {"metadata": {"name": "cpu", "namespace": "ns"}, "spec": {}}
    assert nodeset_value(metrics, stats, obj, "slurm_nodeset_jobs_pending") == 2
    assert nodeset_value(metrics, stats, obj, "slurm_nodeset_jobs_pending_nodes") == 3
    assert metrics.ceiling(stats, obj) == Ceiling(4, 4, 8000, "HPA cpu maxReplicas")
    assert [j for j, _ in metrics.nodeset_demand(stats, obj).never] == [1]
    # The partition gauge keeps Slurm's meaning: every pending job of the partition.
    assert stats.partitions["cpu"].jobs_pending == 3


def test_a_job_left_out_is_told_once_on_the_nodeset_while_it_stays_so() -> None:
    from slinky.operator.autoscale.extapi import NEVER_FITS_REASON, MetricsAPI

    said: list[tuple[str, str, str]] = []
    recorder: Any = type(
        "R",
        (),
        {"event": lambda self, obj, t, reason, note, action: said.append((t, reason, note))},
    )()
    api: Any = MetricsAPI.__new__(MetricsAPI)
    api.recorder, api._told = recorder, {}
    obj = {"metadata": {"name": "cpu", "namespace": "ns", "uid": "u"}}
    why = "asks for 5 nodes, the NodeSet has at most 4 (HPA cpu maxReplicas)"
    api.tell_never_fits(obj, [(7, why)])
    api.tell_never_fits(obj, [(7, why)])
    assert len(said) == 1 and said[0][:2] == ("Warning", NEVER_FITS_REASON)
    assert said[0][2].startswith(f"job 7 {why}: it can never run here"), said
    api.tell_never_fits(obj, [])  # it ran, was cancelled or changed
    api.tell_never_fits(obj, [(7, why)])
    assert len(said) == 2
