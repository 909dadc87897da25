"""The bridge's node controller against the real apiserver and real Slurm: EXTERNAL node
registration, removal that waits for running placeholder jobs, the managed-node taint and
node health (cordon, NotReady, a watched condition) <-> drain."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import time
import uuid
from typing import Any

import pytest

from slinky.bridge.labels import (
    EXTERNAL_NODE,
    EXTERNAL_NODE_PARTITIONS,
    MANAGED_NODE_TAINT,
    SLURM_NODENAME,
)
from slinky.bridge.nodes.registration import owner_comment, registered_for
from slinky.kube import rest
from slinky.slurm.models import Node
from slinky_testbed.waiting import wait_for
from tests.e2e.bridge_fixtures import SCHEDULER, TEST_CONDITION, BridgeEnv, wait_slurm_node

pytestmark = pytest.mark.e2e

EXTERNAL = {EXTERNAL_NODE: "true"}
TAINT = f"{SCHEDULER}:NoExecute"


async def registered(env: BridgeEnv, name: str) -> Node:
    node = await wait_slurm_node(
        env,
        name,
        lambda n: n is not None and registered_for(n) == name,
        f"slurm node {name} registered by the bridge",
    )
    assert node is not None
    return node


async def tainted(env: BridgeEnv, name: str, want: list[str], timeout: float = 30) -> None:
    async def check() -> bool:
        return await env.taint_values(name) == want

    await wait_for(check, timeout=timeout, what=f"node {name} managed-node taints == {want}")


async def job_state(env: BridgeEnv, job: int) -> list[str]:
    return (await env.slurm.get_job(job)).state


async def occupy(env: BridgeEnv, name: str) -> int:
    job = await env.submit_placeholder(name)

    async def running() -> bool:
        return "RUNNING" in await job_state(env, job)

    await wait_for(running, timeout=30, what=f"placeholder job {job} running on {name}")
    return job


async def drained_but_kept(env: BridgeEnv, name: str, job: int) -> None:
    """The bridge drains the busy node and then waits: the node stays, the job runs on."""
    node = await wait_slurm_node(
        env,
        name,
        lambda n: n is not None and n.state.is_drain,
        f"slurm node {name} drained",
    )
    assert node is not None and node.reason.startswith("slurm-bridge: "), node
    # The bridge re-checks a drained busy node on every Slurm change and every few seconds;
    # watch over several of those chances to do the wrong thing (a bounded window).
    observe_until = time.monotonic() + 3
    while time.monotonic() < observe_until:
        assert await env.slurm_node(name) is not None, "slurm node removed under a running job"
        assert await job_state(env, job) == ["RUNNING"], "the bridge ended the placeholder job"
        await asyncio.sleep(0.3)


async def test_labelling_a_node_registers_it_in_slurm_as_external(bridge: BridgeEnv) -> None:
    env = bridge
    name = await env.create_node(
        labels=EXTERNAL,
        annotations={EXTERNAL_NODE_PARTITIONS: "slurm-bridge"},
        cpu="6",
        memory="12Gi",
    )
    node = await registered(env, name)
    assert node.state.has("EXTERNAL"), node.state
    assert node.cpus == 6
    assert node.real_memory == 12 * 1024
    assert node.features == ["slurm-bridge"]
    assert "slurm-bridge" in node.partitions
    assert node.address == "127.0.0.1"
    await tainted(env, name, [TAINT])
    assert await env.events_for(name, "Registered")


async def test_a_missing_partition_gives_an_event_and_registers_nothing(
    bridge: BridgeEnv,
) -> None:
    env = bridge
    name = await env.create_node(
        labels=EXTERNAL, annotations={EXTERNAL_NODE_PARTITIONS: "slurm-bridge,no-such-partition"}
    )

    async def warned() -> bool:
        return any(
            "no-such-partition" in e.get("note", "") and e.get("type") == "Warning"
            for e in await env.events_for(name, "PartitionNotFound")
        )

    await wait_for(warned, timeout=30, what="PartitionNotFound event naming the partition")
    assert await env.slurm_node(name) is None
    assert await env.taint_values(name) == []


async def test_capacity_and_partition_changes_are_applied(bridge: BridgeEnv) -> None:
    env = bridge
    name = await env.create_node(labels=EXTERNAL, cpu="4", memory="8Gi")
    await registered(env, name)
    await env.set_allocatable(name, cpu="2", memory="4Gi", address="127.0.0.1")
    await wait_slurm_node(
        env,
        name,
        lambda n: (
            n is not None
            and n.cpus == 2
            and n.real_memory == 4096
            and not n.state.is_drain
            and registered_for(n) == name
        ),
        f"slurm node {name} registered again with 2 CPUs and 4096 MiB",
    )
    await env.kube.patch(
        rest.NODES,
        name,
        {"metadata": {"annotations": {EXTERNAL_NODE_PARTITIONS: "slurm-bridge,all"}}},
    )
    await wait_slurm_node(
        env,
        name,
        lambda n: (
            n is not None
            and sorted(n.features) == ["all", "slurm-bridge"]
            and registered_for(n) == name
        ),
        f"slurm node {name} registered again with features slurm-bridge,all",
    )


async def test_unlabelling_drains_then_removes_once_the_placeholder_job_ends(
    bridge: BridgeEnv,
) -> None:
    env = bridge
    name = await env.create_node(labels=EXTERNAL)
    await registered(env, name)
    await tainted(env, name, [TAINT])
    job = await occupy(env, name)

    await env.kube.patch(rest.NODES, name, {"metadata": {"labels": {EXTERNAL_NODE: None}}})
    await drained_but_kept(env, name, job)

    await env.slurm.cancel_job(job)  # the placeholder's owner ends it
    await wait_slurm_node(env, name, lambda n: n is None, f"slurm node {name} deleted")
    await tainted(env, name, [])
    assert "CANCELLED" in await job_state(env, job)


async def test_deleting_the_node_drains_then_removes_once_the_placeholder_job_ends(
    bridge: BridgeEnv,
) -> None:
    env = bridge
    name = await env.create_node(labels=EXTERNAL)
    await registered(env, name)
    job = await occupy(env, name)

    await env.kube.delete(rest.NODES, name)
    await drained_but_kept(env, name, job)

    await env.slurm.cancel_job(job)
    await wait_slurm_node(env, name, lambda n: n is None, f"slurm node {name} deleted")


async def test_a_node_deleted_while_the_bridge_is_down_is_removed_at_start(
    bridge: BridgeEnv,
) -> None:
    env = bridge
    name = await env.create_node(labels=EXTERNAL)
    await registered(env, name)
    assert env.bridge.stop() == 0
    try:
        await env.kube.delete(rest.NODES, name)

        async def node_gone() -> bool:
            try:
                await env.node(name)
            except rest.ApiError as e:
                return e.not_found
            return False

        await wait_for(node_gone, timeout=30, what=f"Node {name} deleted")
        assert await env.slurm_node(name) is not None
    finally:
        await env.bridge.restart()
    await wait_slurm_node(env, name, lambda n: n is None, f"slurm node {name} deleted after start")


async def test_a_slurm_node_another_bridge_registered_is_never_removed(bridge: BridgeEnv) -> None:
    """Two bridges (two Kubernetes clusters) on one Slurm cluster: a Slurm node marked as
    registered for a Kubernetes node that is not here is removed only when the mark carries
    this bridge's cluster id; the other bridge's node is left alone."""
    env = bridge
    ours = str((await env.kube.get(rest.NAMESPACES, "kube-system"))["metadata"]["uid"])
    tag = uuid.uuid4().hex[:6]
    marks = {f"mine-{tag}": ours, f"theirs-{tag}": "another-kubernetes-cluster"}
    for slurm_name, cluster in marks.items():
        await env.slurm.create_node(
            f"NodeName={slurm_name} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=EXTERNAL"
        )
        await env.slurm.update_node(
            slurm_name, comment=owner_comment(f"gone-{slurm_name}", cluster)
        )
    mine, theirs = marks
    try:
        await wait_slurm_node(env, mine, lambda n: n is None, f"our {mine} removed", 60)
        node = await env.slurm_node(theirs)
        assert node is not None and not node.state.is_drain, "another bridge's node was touched"
    finally:
        with contextlib.suppress(Exception):
            await env.slurm.delete_node(theirs)


async def test_a_new_slurm_nodename_replaces_the_registered_slurm_node(bridge: BridgeEnv) -> None:
    """Relabelling slurm-nodename drains and removes the Slurm node registered under the old
    name (it would otherwise stay in Slurm for ever), then registers the new name."""
    env = bridge
    first, second = (f"renamed-{uuid.uuid4().hex[:6]}" for _ in range(2))
    name = await env.create_node(labels={**EXTERNAL, SLURM_NODENAME: first})
    await wait_slurm_node(
        env, first, lambda n: n is not None and registered_for(n) == name, f"{first} registered"
    )
    await env.kube.patch(rest.NODES, name, {"metadata": {"labels": {SLURM_NODENAME: second}}})
    try:
        await wait_slurm_node(env, first, lambda n: n is None, f"{first} removed after relabel")
        await wait_slurm_node(
            env,
            second,
            lambda n: n is not None and registered_for(n) == name,
            f"{second} registered after relabel",
        )
    finally:
        with contextlib.suppress(rest.ApiError):
            await env.kube.delete(rest.NODES, name)
        await wait_slurm_node(
            env, second, lambda n: n is None, f"{second} removed after its Node", timeout=60
        )


async def test_taint_follows_whether_slurm_knows_the_node(bridge: BridgeEnv) -> None:
    """A node Slurm knows (here an admin created it) is managed and tainted; when Slurm
    forgets it, the taint goes. The Slurm name may differ from the Node's name."""
    env = bridge
    slurm_name = f"admin-made-{uuid.uuid4().hex[:6]}"
    name = await env.create_node(labels={SLURM_NODENAME: slurm_name})
    await tainted(env, name, [])
    await env.slurm.create_node(
        f"NodeName={slurm_name} NodeAddr=127.0.0.1 CPUs=2 RealMemory=1000 State=EXTERNAL"
    )
    try:
        await tainted(env, name, [TAINT])
    finally:
        await env.slurm.delete_node(slurm_name)
    # slurmctld does not advance its node update time for a deletion: seen at the bridge's
    # next full node list (every 30 s).
    await tainted(env, name, [], timeout=60)


async def test_cordon_drains_and_uncordon_undrains(bridge: BridgeEnv) -> None:
    env = bridge
    name = await env.create_node(labels=EXTERNAL)
    await registered(env, name)
    await env.kube.patch(rest.NODES, name, {"spec": {"unschedulable": True}})
    node = await wait_slurm_node(
        env, name, lambda n: n is not None and n.state.is_drain, f"slurm node {name} drained"
    )
    assert node is not None
    assert node.reason == f"slurm-bridge: Kubernetes node {name} is unschedulable (cordoned)"
    await env.kube.patch(rest.NODES, name, {"spec": {"unschedulable": False}})
    await wait_slurm_node(
        env, name, lambda n: n is not None and not n.state.is_drain, f"slurm node {name} undrained"
    )


async def set_condition(env: BridgeEnv, name: str, kind: str, status: str | None) -> None:
    """Set (None: remove) a Node condition as a kubelet or Node Problem Detector would."""
    cond: dict[str, Any] = {"type": kind}
    if status is None:
        cond["$patch"] = "delete"
    else:
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        cond.update(
            status=status, reason="TestSaysSo", message="set by the e2e test",
            lastHeartbeatTime=now, lastTransitionTime=now,
        )  # fmt: skip
    patch = {"status": {"conditions": [cond]}}
    await env.kube.patch(rest.NODES, name, patch, subresource="status", kind="strategic")


@pytest.mark.parametrize(
    ("kind", "bad", "good", "says"),
    [
        (TEST_CONDITION, "True", "False", f"{TEST_CONDITION} (TestSaysSo)"),
        ("Ready", "False", "True", "NotReady (TestSaysSo)"),
    ],
)
async def test_a_node_problem_drains_and_its_end_undrains(
    bridge: BridgeEnv, kind: str, bad: str, good: str, says: str
) -> None:
    """A watched condition True (nodeHealth.conditions) or Ready False drains the Slurm node
    the bridge registered for the Node, naming it; back to healthy, it is undrained."""
    env = bridge
    name = await env.create_node(labels=EXTERNAL)
    await registered(env, name)
    await set_condition(env, name, kind, bad)
    node = await wait_slurm_node(
        env, name, lambda n: n is not None and n.state.is_drain, f"slurm node {name} drained"
    )
    assert node is not None
    assert node.reason == f"slurm-bridge: Kubernetes node {name} {says}"
    await set_condition(env, name, kind, good)
    await wait_slurm_node(
        env, name, lambda n: n is not None and not n.state.is_drain, f"slurm node {name} undrained"
    )


async def test_an_admin_drain_survives_cordon_and_uncordon(bridge: BridgeEnv) -> None:
    env = bridge
    name = await env.create_node(labels=EXTERNAL)
    await registered(env, name)
    await env.slurm.drain_node(name, "admin: disk replacement")
    await env.kube.patch(rest.NODES, name, {"spec": {"unschedulable": True}})

    async def cordon_seen() -> bool:
        return bool((await env.node(name)).get("spec", {}).get("unschedulable"))

    await wait_for(cordon_seen, timeout=10, what="cordon stored")
    await tainted(env, name, [TAINT])
    await env.kube.patch(rest.NODES, name, {"spec": {"unschedulable": False}})
    # Proof that the bridge acted on the uncordon: remove its taint afterwards. The reconcile
    # that puts the taint back reads a Node at least as new as the uncordon, and decides on
    # undraining (the cordon step) before the taint step.
    current = await env.node(name)
    others = [t for t in current["spec"]["taints"] if t["key"] != MANAGED_NODE_TAINT]
    await env.kube.patch(rest.NODES, name, {"spec": {"taints": others}})
    await tainted(env, name, [TAINT])
    node = await env.slurm_node(name)
    assert node is not None and node.state.is_drain
    assert node.reason == "admin: disk replacement"
    with contextlib.suppress(Exception):
        await env.slurm.undrain_node(name)


async def test_nodes_slurm_does_not_know_are_never_looked_up_one_by_one(
    bridge: BridgeEnv,
) -> None:
    env = bridge
    reconciles = "controller_runtime_reconcile_total"
    lookups = env.bridge.metric_sum("slurm_rest_requests_total", 'method="GET"', "/node/{id}")
    before = env.bridge.metric_sum(reconciles, 'controller="bridge-node"')
    name = await env.create_node()

    async def reconciled() -> bool:
        return env.bridge.metric_sum(reconciles, 'controller="bridge-node"') >= before + 2

    await wait_for(reconciled, timeout=30, what=f"the bridge reconciled node {name}")
    assert await env.taint_values(name) == []
    after = env.bridge.metric_sum("slurm_rest_requests_total", 'method="GET"', "/node/{id}")
    assert after == lookups, "the bridge asked Slurm about a node it has no reason to know"
