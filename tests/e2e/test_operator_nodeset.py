"""The NodeSet controller end to end: the operator process, the real apiserver and
controller manager, real slurmctld/slurmrestd, and real slurmd processes run by the process
kubelet. Jobs are real Slurm batch jobs; nothing is faked."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from slinky.kube import rest
from slinky.operator.nodeset.builder import (
    ANNOTATION_CORDON,
    ANNOTATION_NODE_CORDON_REASON,
    ANNOTATION_SLURM_FEATURES,
)
from slinky.operator.resources import NODESETS
from slinky.slurm.models import expand_hostlist
from slinky_testbed import paths
from slinky_testbed.bed import KWOK_NODE_ANNOTATION
from slinky_testbed.waiting import WaitTimeout, wait_for
from tests.e2e.nodeset_fixtures import Env, gone, nodeset_manifest, wait_idle_nodes

WIDGET = "example.com/widget"

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]


async def test_scale_out_from_zero_registers_idle_nodes_with_the_nodeset_feature(env: Env) -> None:
    await env.kube.create(NODESETS, nodeset_manifest("grow", 0), env.namespace)
    subprocess.run(
        [
            str(paths.bin_dir() / "kubectl"),
            f"--kubeconfig={env.testbed.kubeconfig}",
            "scale",
            "nodeset/grow",
            "-n",
            env.namespace,
            "--replicas=3",
        ],
        check=True,
        capture_output=True,
    )
    names = await wait_idle_nodes(env, "grow", 3)
    assert names == ["grow-0", "grow-1", "grow-2"]
    for n in names:
        assert "grow" in (await env.slurm.get_node(n)).features

    async def comments() -> bool:
        for n in names:
            raw = (await env.slurm.get_node(n)).comment
            ident = json.loads(raw) if raw else {}
            if (ident.get("podName"), ident.get("nodeSet"), ident.get("namespace")) != (
                n,
                "grow",
                env.namespace,
            ):
                return False
        return True

    await wait_for(comments, timeout=10, what="Slurm node comments hold the pod identity")

    async def counted() -> JSON | None:
        st = (await env.nodeset("grow")).get("status") or {}
        ok = (
            st.get("replicas"),
            st.get("readyReplicas"),
            st.get("slurmIdle"),
            st.get("updatedReplicas"),
        ) == (3, 3, 3, 3)
        return st if ok else None

    st = await wait_for(counted, timeout=20, what="status counts")
    assert st["selector"] == "app.kubernetes.io/instance=grow"
    # The columns the docs point at (docs/upgrading.md: UPDATED reaches REPLICAS).
    table = env.testbed.kubectl(["-n", env.namespace, "get", "nodesets", "grow"]).stdout
    header, row = table.splitlines()[:2]
    assert header.split() == [
        "NAME", "REPLICAS", "READY", "UPDATED", "IDLE", "ALLOCATED", "DOWN", "DRAIN", "AGE"
    ], header  # fmt: skip
    assert row.split()[:8] == ["grow", "3", "3", "3", "3", "0", "0", "0"], row
    assert st["observedGeneration"] == (await env.nodeset("grow"))["metadata"]["generation"]
    pod = (await env.pods("grow"))[0]
    pod_conds = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert pod_conds.get("SlurmNodeStateIdle") == "True"
    assert pod["spec"]["hostname"] == "grow-0" and pod["spec"]["subdomain"] == "grow"
    await env.kube.get(rest.SERVICES, "grow", env.namespace)
    pdb = await env.kube.get(rest.PDBS, "grow-protect", env.namespace)
    assert pdb["spec"]["maxUnavailable"] == 0
    evs = (await env.kube.list(rest.EVENTS, env.namespace))["items"]
    # The operator's own events (kubelets report "Created" for containers too).
    created = [
        ev for ev in evs if ev["reason"] == "Created" and ev["regarding"]["kind"] == "NodeSet"
    ]
    assert len(created) == 3


async def test_scale_in_drains_idle_first_and_waits_for_the_running_job(env: Env) -> None:
    await env.kube.create(NODESETS, nodeset_manifest("shrink", 3), env.namespace)
    await wait_idle_nodes(env, "shrink", 3)
    # Long enough to outlast the idle poll below (5 s) and both scale steps.
    job = await env.submit("shrink", 30)
    busy = await env.running_on(job)

    async def protected() -> bool:
        pods = {p["metadata"]["name"]: p for p in await env.pods("shrink")}
        return (pods[busy]["metadata"].get("labels") or {}).get(
            "nodeset.slinky.slurm.net/pod-protect"
        ) == "true"

    # A job starting is seen at the next idle poll (--slurm-idle-poll-interval, 5 s here).
    await wait_for(protected, timeout=30, what="busy pod labelled pod-protect")

    await env.scale("shrink", 1)

    async def only_busy_left() -> bool:
        return await env.live_pod_names("shrink") == [busy]

    await wait_for(only_busy_left, timeout=30, what="the two idle pods removed first")
    assert (await env.job_state(job)) == ["RUNNING"]

    await env.scale("shrink", 0)

    async def draining() -> bool:
        node = await env.slurm_node(busy)
        return bool(node and node.state.is_drain and node.reason == "slurm-operator: scale-in")

    await wait_for(draining, timeout=10, what="busy node DRAIN with the operator's reason")
    assert await env.live_pod_names("shrink") == [busy], "pod stays while its job runs"

    async def completed() -> bool:
        return "COMPLETED" in await env.job_state(job)

    await wait_for(completed, timeout=90, what="job completed normally")
    # Deadline: about one poll interval (2 s) to see the node drained, plus the preStop.
    await wait_for(lambda: _empty(env, "shrink"), timeout=8, what="pod deleted soon after")
    await wait_for(
        lambda: gone(lambda: env.slurm_node(busy)), timeout=5, what="Slurm node record gone"
    )
    await env.completed_once(job)


async def _empty(env: Env, name: str) -> bool:
    return not await env.pods(name)


async def test_scaling_back_up_keeps_and_undrains_a_condemned_pod(env: Env) -> None:
    await env.kube.create(NODESETS, nodeset_manifest("keep", 1), env.namespace)
    (name,) = await wait_idle_nodes(env, "keep", 1)
    uid = (await env.pods("keep"))[0]["metadata"]["uid"]
    job = await env.submit("keep", 60)
    await env.running_on(job)
    await env.scale("keep", 0)

    async def drained() -> bool:
        node = await env.slurm_node(name)
        return bool(node and node.state.is_drain)

    await wait_for(drained, timeout=10, what="condemned node drained")
    await env.scale("keep", 1)

    async def undrained() -> bool:
        node = await env.slurm_node(name)
        return bool(node and not node.state.is_drain)

    await wait_for(undrained, timeout=10, what="node undrained")
    pods = await env.pods("keep")
    assert [p["metadata"]["uid"] for p in pods] == [uid], "the same pod is kept"
    assert "nodeset.slinky.slurm.net/condemned" not in (
        pods[0]["metadata"].get("annotations") or {}
    )
    assert (await env.job_state(job)) == ["RUNNING"]
    await env.slurm.cancel_job(job)


async def test_rolling_update_one_at_a_time_without_killing_jobs(env: Env) -> None:
    await env.kube.create(
        NODESETS,
        nodeset_manifest(
            "roll",
            3,
            revisionHistoryLimit=0,
            updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        ),
        env.namespace,
    )
    await wait_idle_nodes(env, "roll", 3)
    old_rev = (await env.nodeset("roll"))["status"]["updateRevision"]
    jobs = [await env.submit("roll", 8, name=f"e2e-roll-{i}") for i in range(2)]
    for j in jobs:
        await env.running_on(j)
    await env.change_template("roll")

    worst = 0
    worst_sample: list[str] = []

    async def converged() -> bool:
        nonlocal worst, worst_sample
        pods = await env.pods("roll")
        live = {
            p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")
        }
        unavailable = 3 - len(live)
        sample = [f"{3 - len(live)} deleting or missing"]
        for p in live.values():
            ready = any(
                c["type"] == "Ready" and c["status"] == "True"
                for c in (p.get("status") or {}).get("conditions") or []
            )
            draining = "nodeset.slinky.slurm.net/condemned" in (
                p["metadata"].get("annotations") or {}
            )
            unavailable += (not ready) or draining
            sample.append(f"{p['metadata']['name']}: ready={ready} condemned={draining}")
        if unavailable > worst:
            worst, worst_sample = unavailable, sample
        st = (await env.nodeset("roll")).get("status") or {}
        return (
            st.get("updatedReplicas") == 3
            and st.get("readyReplicas") == 3
            and st.get("currentRevision") == st.get("updateRevision") != old_rev
        )

    await wait_for(converged, timeout=150, interval=0.2, what="every pod on the new revision")
    assert worst <= 1, f"{worst} pods unavailable at once: {worst_sample}"
    for j in jobs:
        await env.completed_once(j)  # not killed, not requeued
    await wait_idle_nodes(env, "roll", 3)
    new_rev = (await env.nodeset("roll"))["status"]["updateRevision"]
    seen: list[str] = []

    async def pruned() -> bool:
        revs = (
            await env.kube.list(
                rest.CONTROLLER_REVISIONS,
                env.namespace,
                params={"labelSelector": "nodeset.slinky.slurm.net/name=roll"},
            )
        )["items"]
        seen[:] = [r["metadata"]["labels"]["controller-revision-hash"] for r in revs]
        return seen == [new_rev]

    try:
        await wait_for(pruned, timeout=20, what="old ControllerRevision pruned (historyLimit 0)")
    except AssertionError as err:
        raise AssertionError(f"{err}; revisions {seen}, want [{new_rev}]") from None


async def test_a_pod_waiting_for_its_update_goes_when_the_nodeset_scales_to_zero(env: Env) -> None:
    """The soak's stuck NodeSet: a busy pod condemned for a rolling update, then the HPA
    scaled the NodeSet to 0. The scale-in left the pod to the update, the update waited for
    the scale-in, and the pod stayed Ready and drained for good. Now its job ends COMPLETED
    and the pod goes."""
    await env.kube.create(
        NODESETS,
        nodeset_manifest(
            "upzero",
            1,
            updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        ),
        env.namespace,
    )
    (name,) = await wait_idle_nodes(env, "upzero", 1)
    job = await env.submit("upzero", 12)
    await env.running_on(job)
    await env.change_template("upzero")

    async def condemned_for_update() -> bool:
        pods = await env.pods("upzero")
        notes = [(p["metadata"].get("annotations") or {}) for p in pods]
        return [n.get("nodeset.slinky.slurm.net/condemned") for n in notes] == ["update"]

    await wait_for(condemned_for_update, timeout=30, what=f"{name} condemned for the update")
    await env.scale("upzero", 0)

    async def gone() -> bool:
        status = (await env.nodeset("upzero")).get("status") or {}
        return not await env.live_pod_names("upzero") and status.get("replicas") == 0

    try:
        await wait_for(gone, timeout=60, what=f"{name} deleted once its job ended (replicas 0)")
    except WaitTimeout as e:
        try:
            seen = await env.explain("upzero", job)
        except Exception as x:  # the timeout is the failure; a failed look must not hide it
            seen = f"(could not read the state: {x!r})"
        raise WaitTimeout(f"{e}\n{seen}") from None
    await env.completed_once(job)


async def test_on_delete_strategy_waits_for_a_manual_delete(env: Env) -> None:
    await env.kube.create(
        NODESETS, nodeset_manifest("ondel", 2, updateStrategy={"type": "OnDelete"}), env.namespace
    )
    await wait_idle_nodes(env, "ondel", 2)
    old_rev = (await env.nodeset("ondel"))["status"]["updateRevision"]
    await env.change_template("ondel")

    async def new_revision() -> str | None:
        st = (await env.nodeset("ondel")).get("status") or {}
        rev = st.get("updateRevision")
        return rev if rev and rev != old_rev else None

    new_rev = await wait_for(new_revision, timeout=10, what="status.updateRevision changes")
    observe_until = time.monotonic() + 4  # bounded window: OnDelete must not replace anything
    uids = [p["metadata"]["uid"] for p in await env.pods("ondel")]
    while time.monotonic() < observe_until:
        assert [p["metadata"]["uid"] for p in await env.pods("ondel")] == uids
        await asyncio.sleep(0.5)
    await env.kube.delete(rest.PODS, "ondel-0", env.namespace)

    async def replaced() -> bool:
        pods = {
            p["metadata"]["name"]: p
            for p in await env.pods("ondel")
            if not p["metadata"].get("deletionTimestamp")
        }
        p0, p1 = pods.get("ondel-0"), pods.get("ondel-1")
        return bool(
            p0
            and p1
            and p0["metadata"]["labels"]["controller-revision-hash"] == new_rev
            and p1["metadata"]["labels"]["controller-revision-hash"] == old_rev
        )

    await wait_for(replaced, timeout=30, what="only the deleted pod comes back on the new revision")


async def test_a_node_condition_drains_that_nodes_slurm_nodes_and_clearing_it_undrains(
    env: Env,
) -> None:
    """As Node Problem Detector would: a watched condition (--drain-node-conditions) set True
    on one Kubernetes node drains the Slurm nodes of exactly the pods on it, naming the
    condition; set False again, they are undrained."""
    await env.kube.create(NODESETS, nodeset_manifest("health", 3), env.namespace)
    names = await wait_idle_nodes(env, "health", 3)
    on: dict[str, str] = {}
    for name in names:
        on[name] = (await env.kube.get(rest.PODS, name, env.namespace))["spec"]["nodeName"]
    sick = on[names[0]]
    reason = f"slurm-operator: Kubernetes node {sick} SlinkyTestProblem (TestSaysSo)"

    async def set_condition(status: str | None) -> None:
        cond: dict[str, Any] = {"type": "SlinkyTestProblem"}
        if status is None:
            cond["$patch"] = "delete"
        else:
            cond.update(status=status, reason="TestSaysSo", message="set by the e2e test")
        patch = {"status": {"conditions": [cond]}}
        await env.kube.patch(rest.NODES, sick, patch, subresource="status", kind="strategic")

    async def drained_as(expected: dict[str, bool]) -> bool:
        for name, drained in expected.items():
            node = await env.slurm_node(name)
            if node is None or node.state.is_drain != drained:
                return False
            if drained and node.reason != reason:
                return False
        return True

    want = {name: on[name] == sick for name in names}
    try:
        await set_condition("True")
        await wait_for(
            lambda: drained_as(want), timeout=15, what="the sick node's Slurm nodes drained"
        )
        await set_condition("False")
        await wait_for(
            lambda: drained_as(dict.fromkeys(names, False)),
            timeout=15,
            what="undrained once the condition is False",
        )
    finally:
        await set_condition(None)


async def test_a_slurmd_container_with_limits_registers_that_size(env: Env) -> None:
    """No CPUs=/RealMemory= in --conf: the node registers with the container's limits (less
    slurmd's memory reserve), not with the host's 2 CPUs and its memory."""
    manifest = nodeset_manifest("sized", 1)
    slurmd = manifest["spec"]["template"]["spec"]["containers"][0]
    slurmd["args"] = []
    slurmd["resources"] = {"limits": {"cpu": "1", "memory": "512Mi"}}
    await env.kube.create(NODESETS, manifest, env.namespace)
    (name,) = await wait_idle_nodes(env, "sized", 1)
    node = await env.slurm_node(name)
    assert node is not None
    assert (node.cpus, node.real_memory) == (1, 512 - 128)


async def test_an_extended_resource_becomes_a_gres_slurm_counts(env: Env) -> None:
    """The real nodes advertise 2 `example.com/widget` (as a device plugin would); a pod whose
    slurmd asks for both registers `Gres=widget:2`; of two jobs wanting both, the second
    waits for the first (Slurm counts the GRES), and both complete."""
    real = [
        n["metadata"]["name"]
        for n in (await env.kube.list(rest.NODES))["items"]
        if KWOK_NODE_ANNOTATION not in (n["metadata"].get("annotations") or {})
    ]

    async def advertise(count: str | None) -> None:
        for name in real:
            patch = {"status": {"capacity": {WIDGET: count}}}
            await env.kube.patch(rest.NODES, name, patch, subresource="status")

    await advertise("2")
    try:
        manifest = nodeset_manifest("gres", 1)
        slurmd = manifest["spec"]["template"]["spec"]["containers"][0]
        slurmd["resources"] = {"limits": {WIDGET: "2"}, "requests": {WIDGET: "2"}}
        await env.kube.create(NODESETS, manifest, env.namespace)
        (name,) = await wait_idle_nodes(env, "gres", 1, timeout=90)
        node = await env.slurm_node(name)
        assert node is not None and node.raw.get("gres") == "widget:2", node

        def wants_both() -> JSON:
            return {
                "name": "e2e-gres",
                "constraints": "gres",
                "minimum_nodes": 1,
                "maximum_nodes": 1,
                "tasks": 1,
                "tres_per_node": "gres/widget:2",
                "current_working_directory": "/tmp",
                "environment": ["PATH=/usr/bin:/bin"],
                "time_limit": {"set": True, "number": 5},
            }

        first = await env.slurm.submit_job(wants_both(), script="#!/bin/sh\nsleep 8\n")
        await env.running_on(first)
        second = await env.slurm.submit_job(wants_both(), script="#!/bin/sh\nsleep 1\n")

        async def waiting_for_the_gres() -> bool:
            # Both in one look: the second waits while the first holds the GRES.
            held, waits = await env.slurm.get_job(first), await env.slurm.get_job(second)
            return held.is_running and waits.is_pending and waits.state_reason == "Resources"

        await wait_for(waiting_for_the_gres, timeout=15, what="second job waits for the GRES")
        await env.completed_once(first)
        await env.completed_once(second)
    finally:
        for ns_obj in (await env.kube.list(NODESETS, env.namespace))["items"]:
            await env.kube.delete(NODESETS, ns_obj["metadata"]["name"], env.namespace)
        await wait_for(
            lambda: gone(lambda: env.slurm_node("gres-0")), timeout=60, what="gres-0 gone"
        )
        await advertise(None)


async def test_node_labels_place_slurm_nodes_in_racks_and_give_features(env: Env) -> None:
    """Three pods spread over the two real nodes (2 + 1); the test labels the lone pod's node
    rack r1 and the other r2 (zone z1), and gives both a feature label. The operator sets each
    Slurm node's features and its place in the test bed's tree `racks`; in a partition with
    Topology=racks, a 2-node job with --switches=1 waits while a blocker holds one of r2's
    nodes (the free pair spans two racks), then runs on r2's two nodes and completes."""
    manifest = nodeset_manifest(
        "racked", 3, partition={"enabled": True, "config": "Topology=racks MaxTime=10"}
    )
    manifest["spec"]["template"]["spec"]["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "nodeTaintsPolicy": "Honor",  # kwok nodes (tainted) are no domain
            "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "racked"}},
        }
    ]
    await env.kube.create(NODESETS, manifest, env.namespace)
    names = await wait_idle_nodes(env, "racked", 3, timeout=90)
    on = {n: (await env.kube.get(rest.PODS, n, env.namespace))["spec"]["nodeName"] for n in names}
    counts = {k: list(on.values()).count(k) for k in set(on.values())}
    assert sorted(counts.values()) == [1, 2], on
    lone = next(k for k, c in counts.items() if c == 1)
    rack = {k: "r1" if k == lone else "r2" for k in counts}

    async def label(node: str, labels: dict[str, str | None]) -> None:
        await env.kube.patch(rest.NODES, node, {"metadata": {"labels": labels}})

    try:
        for node, r in rack.items():
            await label(
                node,
                {
                    "slinky.test/zone": "z1",
                    "slinky.test/rack": r,
                    "features.slinky.test/fast": "true",
                    "features.slinky.test/g2": "true",
                    "features.slinky.test/family": "6",  # under a prefix: no feature
                },
            )

        async def placed() -> bool:
            for name in names:
                node = await env.slurm_node(name)
                want = f"racks:root:z1:z1.{rack[on[name]]}"
                if node is None or node.topology != want:
                    return False
                if not {"racked", "fast", "g2"} <= set(node.features) or "6" in node.features:
                    return False  # the NodeSet's own feature stays
            return True

        await wait_for(placed, timeout=20, what="Slurm nodes placed and given features")
        pod = await env.kube.get(rest.PODS, names[0], env.namespace)
        assert pod["metadata"]["annotations"][ANNOTATION_SLURM_FEATURES] == "fast,g2"

        r2 = sorted(n for n in names if rack[on[n]] == "r2")

        def job(nodes: int, **extra: Any) -> JSON:
            return {
                "name": "e2e-racks",
                "partition": "racked",
                "minimum_nodes": nodes,
                "maximum_nodes": nodes,
                "tasks": nodes,
                "current_working_directory": "/tmp",
                "environment": ["PATH=/usr/bin:/bin"],
                "time_limit": {"set": True, "number": 5},
                **extra,
            }

        blocker = await env.slurm.submit_job(
            job(1, required_nodes=[r2[0]], cpus_per_task=2),  # the whole node
            script="#!/bin/sh\nsleep 8\n",
        )
        await env.running_on(blocker)
        pair = await env.slurm.submit_job(
            job(2, required_switches={"set": True, "number": 1}, wait_for_switch=600),
            script="#!/bin/sh\nsleep 1\n",
        )

        async def pair_waits_for_one_rack() -> bool:
            # One look: the free pods are the lone r1 and one of r2; the pair may not span.
            held, waits = await env.slurm.get_job(blocker), await env.slurm.get_job(pair)
            return held.is_running and waits.is_pending and waits.state_reason != "None"

        await wait_for(pair_waits_for_one_rack, timeout=15, what="the pair waits for one rack")
        await env.completed_once(blocker)
        done = await env.completed_once(pair)
        assert sorted(expand_hostlist(done.nodes)) == r2, done.nodes
        # Labels gone: the features the operator added go too, the NodeSet's stays.
        for node in rack:
            await label(node, {"features.slinky.test/fast": None, "features.slinky.test/g2": None})

        async def unfeatured() -> bool:
            for name in names:
                node = await env.slurm_node(name)
                if node is None or {"fast", "g2"} & set(node.features):
                    return False
                if "racked" not in node.features:
                    return False
            return True

        await wait_for(unfeatured, timeout=20, what="label features removed")
    finally:
        for node in rack:
            await label(
                node,
                {
                    "slinky.test/zone": None,
                    "slinky.test/rack": None,
                    "features.slinky.test/fast": None,
                    "features.slinky.test/g2": None,
                    "features.slinky.test/family": None,
                },
            )


async def test_a_node_record_restored_with_an_earlier_pods_address_is_pointed_at_the_pod(
    env: Env,
) -> None:
    """Soak run 6: a new pod's slurmd registered, then slurmctld was killed and came back
    from state saved before that, with the node record of the pod before it (its IP, no
    slurmd start time). slurmctld pinged an address no one had: the node stopped
    responding, and a job slurmctld believed running there never finished completing. The
    operator points the record at the pod's IP; the pod is not replaced."""
    await env.kube.create(NODESETS, nodeset_manifest("readdr", 1), env.namespace)
    (name,) = await wait_idle_nodes(env, "readdr", 1)
    first = await env.kube.get(rest.PODS, name, env.namespace)
    node = await env.slurm_node(name)
    assert node is not None and node.address == first["status"]["podIP"]
    state = env.testbed.root / "var" / "spool" / "slurmctld" / "node_state"

    def saved() -> bool:  # a save after the registration (whole seconds: one more)
        return state.exists() and state.stat().st_mtime > node.slurmd_start_time + 1

    await wait_for(saved, timeout=60, interval=0.5, what="node state saved")
    old_state = state.read_bytes()

    await env.kube.delete(rest.PODS, name, env.namespace)

    async def replaced() -> JSON | None:
        pod = (await env.kube.list(rest.PODS, env.namespace))["items"]
        new = [p for p in pod if p["metadata"]["name"] == name]
        if not new or new[0]["metadata"]["uid"] == first["metadata"]["uid"]:
            return None
        got = await env.slurm_node(name)
        ip = new[0]["status"].get("podIP")
        return new[0] if got is not None and ip and got.address == ip else None

    second = await wait_for(replaced, timeout=90, interval=0.5, what="new pod registered")
    await wait_idle_nodes(env, "readdr", 1)
    ip = second["status"]["podIP"]

    # slurmctld comes back from the state saved before the new pod registered.
    env.testbed.kill_component("slurmctld")
    state.write_bytes(old_state)
    env.testbed.start_component("slurmctld")
    restored = await wait_for(
        lambda: env.slurm_node(name), timeout=60, interval=0.5, what="slurmctld answers"
    )
    # The operator may point the record at the pod before this read (it waits for slurmctld
    # too; a CI run on three workers read it only after that): its event names the old address.
    if restored.address != ip:
        assert (restored.address, restored.slurmd_start_time) == (first["status"]["podIP"], 0)

    async def readdressed() -> bool:
        got = await env.slurm_node(name)
        return got is not None and got.address == ip

    await wait_for(readdressed, timeout=30, interval=0.5, what="the record points at the pod")
    # slurmctld reaches the slurmd there: a job runs and completes, never requeued.
    job = await env.submit("readdr", 1)
    await env.completed_once(job, timeout=150)
    pod = await env.kube.get(rest.PODS, name, env.namespace)
    assert pod["metadata"]["uid"] == second["metadata"]["uid"], "the pod was replaced"
    events = (await env.kube.list(rest.EVENTS, env.namespace))["items"]
    told = [e for e in events if e.get("reason") == "SlurmNodeReaddressed"]
    assert any(f"({first['status']['podIP']};" in str(e.get("note")) for e in told), told


async def test_cordons_drain_and_uncordon_undrains_but_admin_drain_survives(env: Env) -> None:
    await env.kube.create(NODESETS, nodeset_manifest("cord", 3), env.namespace)
    a, b, c = await wait_idle_nodes(env, "cord", 3)

    async def node_state(name: str, drained: bool, reason: str | None = None) -> bool:
        node = await env.slurm_node(name)
        if node is None or node.state.is_drain != drained:
            return False
        return reason is None or node.reason == reason

    await env.kube.patch(
        rest.PODS, a, {"metadata": {"annotations": {ANNOTATION_CORDON: "true"}}}, env.namespace
    )
    await wait_for(
        lambda: node_state(a, True, "slurm-operator: pod cordoned"),
        timeout=10,
        what="pod-cordon drains",
    )
    await env.kube.patch(
        rest.PODS, a, {"metadata": {"annotations": {ANNOTATION_CORDON: None}}}, env.namespace
    )
    await wait_for(lambda: node_state(a, False), timeout=10, what="un-cordon undrains")

    pod_b = await env.kube.get(rest.PODS, b, env.namespace)
    k8s_node = pod_b["spec"]["nodeName"]
    try:
        await env.kube.patch(
            rest.NODES,
            k8s_node,
            {
                "metadata": {"annotations": {ANNOTATION_NODE_CORDON_REASON: "kernel upgrade"}},
                "spec": {"unschedulable": True},
            },
        )
        await wait_for(
            lambda: node_state(b, True, "slurm-operator: kernel upgrade"),
            timeout=10,
            what="Kubernetes node cordon drains its Slurm nodes",
        )
    finally:
        await env.kube.patch(
            rest.NODES,
            k8s_node,
            {
                "metadata": {"annotations": {ANNOTATION_NODE_CORDON_REASON: None}},
                "spec": {"unschedulable": None},
            },
        )
    await wait_for(lambda: node_state(b, False), timeout=10, what="uncordon undrains")

    out = await asyncio.to_thread(
        env.testbed.slurm,
        ["scontrol", "update", f"nodename={c}", "state=drain", "reason=admin: broken DIMM"],
    )
    assert out.returncode == 0

    async def mirrored() -> bool:
        pod = await env.kube.get(rest.PODS, c, env.namespace)
        conds = {x["type"]: x for x in pod["status"].get("conditions") or []}
        drain = conds.get("SlurmNodeStateDrain") or {}
        return drain.get("status") == "True" and drain.get("message") == "admin: broken DIMM"

    # An admin's change is seen at the next idle poll (--slurm-idle-poll-interval, 5 s here).
    await wait_for(mirrored, timeout=30, what="operator saw the admin drain (pod condition)")
    # Cordon and uncordon the pod: the operator reconciles it twice more.
    await env.kube.patch(
        rest.PODS, c, {"metadata": {"annotations": {ANNOTATION_CORDON: "true"}}}, env.namespace
    )
    await env.kube.patch(
        rest.PODS, c, {"metadata": {"annotations": {ANNOTATION_CORDON: None}}}, env.namespace
    )
    await wait_for(lambda: _no_annotation(env, c), timeout=5, what="annotation removed")
    deadline = time.monotonic() + 3 * 2.0
    while time.monotonic() < deadline:  # bounded observation window: the drain must hold
        assert await node_state(c, True, "admin: broken DIMM"), "an admin drain was undone"
        await asyncio.sleep(0.5)


async def _no_annotation(env: Env, pod: str) -> bool:
    got = await env.kube.get(rest.PODS, pod, env.namespace)
    return ANNOTATION_CORDON not in (got["metadata"].get("annotations") or {})


async def test_no_pod_is_deleted_while_slurmrestd_is_down(env: Env) -> None:
    await env.kube.create(NODESETS, nodeset_manifest("outage", 1), env.namespace)
    (name,) = await wait_idle_nodes(env, "outage", 1)
    job = await env.submit("outage", 6)
    await env.running_on(job)
    await env.scale("outage", 0)

    async def drained() -> bool:
        node = await env.slurm_node(name)
        return bool(node and node.state.is_drain)

    await wait_for(drained, timeout=10, what="node draining")
    await asyncio.to_thread(env.testbed.stop_component, "slurmrestd")
    try:
        # The job ends while slurmrestd is down; the operator cannot confirm it, so the pod
        # must stay for the whole outage (well past the job's end).
        outage_end = time.monotonic() + 12
        while time.monotonic() < outage_end:
            assert await env.live_pod_names("outage") == [name], "pod deleted without Slurm's word"
            await asyncio.sleep(0.5)
    finally:
        await asyncio.to_thread(env.testbed.start_component, "slurmrestd")
    await wait_for(
        lambda: _empty(env, "outage"), timeout=40, what="pod deleted after slurmrestd returned"
    )
    await env.completed_once(job)


async def test_operator_killed_mid_scale_in_converges_after_restart(env: Env) -> None:
    await env.kube.create(NODESETS, nodeset_manifest("crash", 2), env.namespace)
    await wait_idle_nodes(env, "crash", 2)
    job = await env.submit("crash", 10)
    busy = await env.running_on(job)
    await env.scale("crash", 0)

    async def only_busy_draining() -> bool:
        node = await env.slurm_node(busy)
        return await env.live_pod_names("crash") == [busy] and bool(node and node.state.is_drain)

    await wait_for(only_busy_draining, timeout=30, what="idle pod gone, busy one draining")
    env.operator.kill()
    await wait_for(
        lambda: _job_done(env, job), timeout=30, what="job completes while the operator is down"
    )
    assert await env.live_pod_names("crash") == [busy], "nothing acts while the operator is down"
    await env.operator.restart()
    await wait_for(lambda: _empty(env, "crash"), timeout=60, what="converged after restart")
    assert await env.slurm_node(busy) is None
    await env.completed_once(job)

    async def status_zero() -> bool:
        st = (await env.nodeset("crash")).get("status") or {}
        return st.get("replicas") == 0

    await wait_for(status_zero, timeout=20, what="status replicas 0")


async def _job_done(env: Env, job: int) -> bool:
    return "COMPLETED" in await env.job_state(job)


async def test_a_failed_pod_is_replaced(env: Env) -> None:
    manifest = nodeset_manifest("fail", 1)
    manifest["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    await env.kube.create(NODESETS, manifest, env.namespace)
    await wait_idle_nodes(env, "fail", 1)
    (first,) = await env.pods("fail")
    # slurmd dies; restartPolicy Never makes the pod Failed.
    await asyncio.to_thread(
        env.testbed.kubectl,
        ["-n", env.namespace, "exec", first["metadata"]["name"], "--", "sh", "-c", KILL_SLURMD],
    )

    async def replaced() -> bool:
        pods = [p for p in await env.pods("fail") if not p["metadata"].get("deletionTimestamp")]
        return len(pods) == 1 and pods[0]["metadata"]["uid"] != first["metadata"]["uid"]

    await wait_for(replaced, timeout=30, what="a new pod replaces the Failed one")
    await wait_idle_nodes(env, "fail", 1)
    evs = (await env.kube.list(rest.EVENTS, env.namespace))["items"]
    assert any(ev["reason"] == "PodFinished" for ev in evs)


KILL_SLURMD = (
    "for d in /proc/[0-9]*; do "
    '[ "$(cat $d/comm 2>/dev/null)" = slurmd ] && kill -KILL ${d#/proc/}; done'
)


async def test_volume_claims_follow_the_retention_policy(env: Env) -> None:
    claim = {
        "metadata": {"name": "scratch"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    for name, policy in (
        ("keepvol", {}),
        ("dropvol", {"whenScaled": "Delete", "whenDeleted": "Delete"}),
    ):
        await env.kube.create(
            NODESETS,
            nodeset_manifest(
                name, 1, volumeClaimTemplates=[claim], persistentVolumeClaimRetentionPolicy=policy
            ),
            env.namespace,
        )

    async def pvcs() -> set[str]:
        items = (await env.kube.list(rest.PVCS, env.namespace))["items"]
        return {p["metadata"]["name"] for p in items if not p["metadata"].get("deletionTimestamp")}

    await wait_for(
        lambda: _has(pvcs, {"scratch-keepvol-0", "scratch-dropvol-0"}),
        timeout=20,
        what="one PVC per pod",
    )
    # Each pod's claims are created just before the pod itself.
    pod = await wait_for(
        lambda: env.kube.get(rest.PODS, "dropvol-0", env.namespace),
        timeout=20,
        what="pod dropvol-0",
        ignore=(rest.ApiError,),
    )
    assert {"name": "scratch", "persistentVolumeClaim": {"claimName": "scratch-dropvol-0"}} in pod[
        "spec"
    ]["volumes"]
    # No storage provisioner here: the pods stay unscheduled, so scale-in removes them at once.
    await env.scale("keepvol", 0)
    await env.scale("dropvol", 0)
    await wait_for(lambda: _empty(env, "dropvol"), timeout=20, what="dropvol pod gone")
    await wait_for(lambda: _empty(env, "keepvol"), timeout=20, what="keepvol pod gone")
    await wait_for(lambda: _lacks(pvcs, "scratch-dropvol-0"), timeout=20, what="whenScaled: Delete")
    assert "scratch-keepvol-0" in await pvcs(), "whenScaled: Retain keeps the claim"


async def _has(get: Callable[[], Awaitable[set[str]]], want: set[str]) -> bool:
    return want <= await get()


async def _lacks(get: Callable[[], Awaitable[set[str]]], name: str) -> bool:
    return name not in await get()


async def test_a_slurm_node_its_pod_could_not_delete_is_deleted_by_the_nodeset(env: Env) -> None:
    """The soak: a slurmd pod went while slurmctld was down, so its preStop could not delete
    its Slurm node; slurmctld came back from state that still had it, and the node stayed
    (DOWN, NOT_RESPONDING) with no pod for good. The NodeSet deletes it, with an event."""
    await env.kube.create(NODESETS, nodeset_manifest("left", 2), env.namespace)
    kept, left = await wait_idle_nodes(env, "left", 2)
    await asyncio.to_thread(env.testbed.stop_component, "slurmctld")  # saves its state
    try:
        await env.scale("left", 1)  # the operator waits for Slurm to drain: nothing happens
        await env.kube.delete(rest.PODS, left, env.namespace)  # idle: allowed

        async def pod_gone() -> bool:
            return left not in [p["metadata"]["name"] for p in await env.pods("left")]

        await wait_for(pod_gone, timeout=150, what=f"pod {left} gone, its preStop failing")
    finally:
        await asyncio.to_thread(env.testbed.start_component, "slurmctld")

    async def deleted() -> bool:
        return await env.slurm_node(left) is None

    try:
        await wait_for(deleted, timeout=150, interval=0.5, what=f"Slurm node {left} deleted")
    except WaitTimeout as e:
        node = await env.slurm_node(left)
        raise AssertionError(
            f"{e}: {node.state if node else None}, {node and node.comment}"
        ) from None
    events = (await env.kube.list(rest.EVENTS, env.namespace))["items"]
    told = [e for e in events if e.get("reason") == "SlurmNodeDeleted"]
    assert told and left in told[0]["note"], told  # Slurm had it back: the operator deleted it
    node = await env.slurm_node(kept)
    assert node is not None and not node.state.is_drain  # the pod that stays keeps its node
    assert await env.live_pod_names("left") == [kept]
