"""The chaos the soak inflicts: one table (`CHAOS`), each entry with its name, weight, what
it does and what "recovered" means, and the plan drawn from a seed.

The plan is a pure function of (seed, duration, intensity): the same seed gives the same
actions in the same order at the same planned times. It starts with one of every action in
a shuffled order (so even a short soak tries each kind), then draws by weight. What an
action picks when it runs (which pod, which node, how long to wait) comes from its own
seeded generator over a sorted list of candidates, so it is the same when the cluster looks
the same.

Actions of one `group` never overlap: the next waits until the previous one recovered
(the NodeSet actions judge convergence, which another NodeSet action would disturb).
Actions without a group (process crashes) run inline: the next action starts only after
this one recovered. A group's action recovers in the background while crashes go on.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from bench import soak_bed, soak_health
from bench.soak_bed import NAMESPACE, NODESETS, SCALED_NODESET
from bench.soak_health import UNREACHABLE
from bench.soak_state import SUPERVISED, ActionRecord, NodeFault, Soak
from slinky.kube import rest
from slinky.operator.resources import NODESETS as NODESET_RESOURCE
from slinky_testbed import nodes, procs
from slinky_testbed.bed import TestbedError

MEAN_GAP_S = 25.0  # between planned actions at intensity 1
MIN_GAP_S = 4.0
RECOVERY_POLL_S = 2.0
ROLL_ANNOTATION = "soak.slinky.slurm.net/roll"

Act = Callable[[Soak, random.Random], Awaitable[str]]
Check = Callable[[Soak, float], Awaitable[list[str]]]


class ChaosError(RuntimeError):
    """An action could not do what it meant to (the message says what failed)."""


@dataclass(frozen=True)
class Chaos:
    name: str
    weight: int
    what: str
    recovered_means: str
    act: Act
    recovered: Check  # (soak, time the action finished) -> what is still wrong
    group: str = ""
    recover_within_s: float = 240.0
    default: bool = True  # in the plan unless `--actions` names the actions


# ---------------------------------------------------------------- helpers


async def on_bed(soak: Soak, fn: Callable[..., Any], *args: Any) -> Any:
    """Run a blocking test bed call in a thread, one at a time (they rewrite state.json)."""
    async with soak.bed_lock:
        try:
            return await asyncio.to_thread(fn, *args)
        except (TestbedError, SystemExit) as e:
            raise ChaosError(f"{getattr(fn, '__name__', fn)}: {e}") from None


async def crash_and_restart(
    soak: Soak, name: str, down_s: float, *, graceful: bool = False
) -> None:
    """Stop `name` (SIGKILL, or SIGTERM when graceful), leave it down `down_s` seconds,
    start it again as the test bed (or `make dev`) starts it, and wait until it is ready."""
    soak.supervised[name] = False
    try:
        if soak.before_stop is not None:
            await soak.before_stop(name)
        if graceful:
            await on_bed(soak, soak.bed.stop_component, name)
        else:
            await on_bed(soak, soak.bed.kill_component, name)
        await asyncio.sleep(down_s)
        await start(soak, name)
    finally:
        soak.supervised[name] = True


async def start(soak: Soak, name: str) -> None:
    if name == "operator":
        await on_bed(soak, soak_bed.start_operator, soak.bed, soak.ports)
    elif name == "bridge":
        await on_bed(soak, soak_bed.start_bridge, soak.bed, soak.ports)
    else:
        await on_bed(soak, soak.bed.start_component, name)


def supervised(soak: Soak) -> list[str]:
    """The supervised processes this test bed has (MariaDB and slurmdbd only with
    accounting)."""
    pids = soak.bed.load().pids
    return [n for n in SUPERVISED if n in pids]


def alive(soak: Soak, name: str) -> bool:
    pid = soak.bed.load().pids.get(name)
    return pid is not None and procs.Proc(pid[0], pid[1]).alive()


async def slurmd_pods(soak: Soak) -> list[dict[str, Any]]:
    """Running slurmd pods not being deleted, by name."""
    pods = [
        p
        for p in await soak_health.slurmd_pods(soak)
        if not p["metadata"].get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") == "Running"
    ]
    return sorted(pods, key=lambda p: str(p["metadata"]["name"]))


async def slurm_state(soak: Soak, node: str) -> str:
    try:
        return str((await soak.slurm.get_node(node)).state)
    except UNREACHABLE as e:
        return f"unknown ({type(e).__name__})"


async def scale(soak: Soak, nodeset: str, replicas: int) -> None:
    await soak.kube.patch(
        NODESET_RESOURCE, nodeset, {"spec": {"replicas": replicas}}, NAMESPACE, subresource="scale"
    )


async def replicas(soak: Soak, nodeset: str) -> int:
    return int((await soak.kube.get(NODESET_RESOURCE, nodeset, NAMESPACE))["spec"]["replicas"])


async def wait_until_fine(
    soak: Soak,
    check: Callable[[], Awaitable[list[str]]],
    timeout: float,
    first: list[str] | None = None,
) -> list[str]:
    """Poll `check` until it finds nothing wrong (returns []) or the timeout (returns the
    last problems); `first` receives what the first check found."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            problems = await check()
        except UNREACHABLE as e:
            problems = [f"cannot check: {type(e).__name__}: {e}"]
        if first is not None and not first:
            first += problems or ["nothing"]
        if not problems or time.monotonic() > deadline:
            return problems
        await asyncio.sleep(RECOVERY_POLL_S)


# ---------------------------------------------------------------- recovery checks


async def nodesets_fine(soak: Soak, _since: float) -> list[str]:
    out: list[str] = []
    for n in NODESETS:
        out += await soak_health.nodeset_problems(soak, n)
    return out + await soak_health.slurmd_problems(soak)


async def operator_fine(soak: Soak, since: float) -> list[str]:
    return await soak_health.operator_problems(soak, since=since)


async def bridge_fine(soak: Soak, since: float) -> list[str]:
    return await soak_health.bridge_problems(soak, since=since)


async def slurm_fine(soak: Soak, since: float) -> list[str]:
    return await soak_health.slurm_problems(soak) + await soak_health.operator_problems(soak)


async def slurmctld_fine(soak: Soak, since: float) -> list[str]:
    return await soak_health.slurm_problems(soak) + await soak_health.slurmd_problems(soak)


async def apiserver_fine(soak: Soak, since: float) -> list[str]:
    return await soak_health.operator_problems(soak) + await soak_health.bridge_problems(soak)


async def accounting_fine(soak: Soak, _since: float) -> list[str]:
    try:
        if await asyncio.to_thread(soak.bed.slurmdbd_answers):
            return []
    except subprocess.SubprocessError as e:
        return [f"sacctmgr ping: {e}"]
    return ["slurmdbd does not answer sacctmgr ping UP (down, or without its database)"]


async def nodes_fine(soak: Soak, since: float) -> list[str]:
    nodes = (await soak.kube.list(rest.NODES))["items"]
    return [f"node {n['metadata']['name']} not Ready" for n in nodes if not soak_health.ready(n)]


async def nodes_and_nodesets_fine(soak: Soak, since: float) -> list[str]:
    return await nodes_fine(soak, since) + await nodesets_fine(soak, since)


async def bridge_nodes_fine(soak: Soak, _since: float) -> list[str]:
    return await soak_health.bridge_nodes_problems(soak)


# ---------------------------------------------------------------- actions


async def kill_operator(soak: Soak, rng: random.Random) -> str:
    down = round(rng.uniform(0, 5), 1)
    await crash_and_restart(soak, "operator", down)
    return f"SIGKILL, started again after {down}s"


async def kill_bridge(soak: Soak, rng: random.Random) -> str:
    down = round(rng.uniform(0, 5), 1)
    await crash_and_restart(soak, "bridge", down)
    return f"SIGKILL, started again after {down}s"


async def kill_slurmrestd(soak: Soak, rng: random.Random) -> str:
    down = round(rng.uniform(0, 5), 1)
    await crash_and_restart(soak, "slurmrestd", down)
    return f"SIGKILL, started again after {down}s"


async def kill_slurmctld(soak: Soak, rng: random.Random) -> str:
    down = round(rng.uniform(0, 3), 1)
    soak.slurmctld_kills.append(time.time())
    await crash_and_restart(soak, "slurmctld", down)
    return f"SIGKILL, started again after {down}s"


async def restart_slurmctld(soak: Soak, rng: random.Random) -> str:
    down = round(rng.uniform(0, 3), 1)
    await crash_and_restart(soak, "slurmctld", down, graceful=True)
    return f"SIGTERM (state saved), started again after {down}s"


async def kill_slurmdbd(soak: Soak, rng: random.Random) -> str:
    down = round(rng.uniform(0, 5), 1)
    await crash_and_restart(soak, "slurmdbd", down)
    return f"SIGKILL, started again after {down}s"


async def kill_mariadb(soak: Soak, rng: random.Random) -> str:
    """MariaDB under slurmdbd dies; slurmdbd stays up and must reconnect by itself (the
    supervisor starts slurmdbd again if it exits instead)."""
    down = round(rng.uniform(0, 5), 1)
    await crash_and_restart(soak, "mariadb", down)
    return f"SIGKILL, started again after {down}s"


async def kill_apiserver(soak: Soak, rng: random.Random) -> str:
    down = round(rng.uniform(0, 5), 1)
    await crash_and_restart(soak, "apiserver", down)
    return f"SIGKILL, started again after {down}s"


def up_nodes(soak: Soak) -> list[str]:
    """Real nodes whose kubelet runs (a lost node has none until its replacement)."""
    state = soak.bed.load()
    return sorted(n for n in state.real_nodes if f"kubelet-{n}" in state.pids)


async def restart_kubelet(soak: Soak, rng: random.Random) -> str:
    node = rng.choice(up_nodes(soak))
    await on_bed(soak, soak.bed.restart_kubelet, node)
    return f"kubelet of {node} stopped (SIGTERM) and started again"


async def kill_slurmd(soak: Soak, rng: random.Random) -> str:
    pods = [p for p in await slurmd_pods(soak) if container_of(p)]
    if not pods:
        return "no running slurmd pod: nothing killed"
    pod = rng.choice(pods)
    name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
    restarts = int(pod["status"]["containerStatuses"][0].get("restartCount") or 0)
    before = await slurm_state(soak, name)
    soak.slurmd_kills.append((time.time(), name))
    pid = await on_bed(soak, soak.bed.kill_in_container, node, container_of(pod), "slurmd")

    async def restarted() -> list[str]:
        now = await soak.kube.get(rest.PODS, name, NAMESPACE)
        count = int(
            ((now.get("status") or {}).get("containerStatuses") or [{}])[0].get("restartCount") or 0
        )
        return [] if count > restarts else [f"container of {name} not restarted yet"]

    left = await wait_until_fine(soak, restarted, 120)
    seen = "container restarted" if not left else left[0]
    return f"SIGKILL slurmd (pid {pid}) in pod {name} on {node}; Slurm node was {before}; {seen}"


async def pods_on(soak: Soak, node: str) -> list[dict[str, Any]]:
    """Every pod bound to `node`, any namespace."""
    pods = (await soak.kube.list(rest.PODS))["items"]
    return [p for p in pods if (p.get("spec") or {}).get("nodeName") == node]


async def slurm_nodes_on(soak: Soak, node: str) -> list[str]:
    """The Slurm nodes (slurmd pods, named alike) on `node` now."""
    pods = await soak_health.slurmd_pods(soak)
    return sorted(p["metadata"]["name"] for p in pods if p["spec"].get("nodeName") == node)


async def node_not_ready(soak: Soak, node: str) -> list[str]:
    try:
        obj = await soak.kube.get(rest.NODES, node)
    except rest.ApiError as e:
        if e.not_found:
            return []
        raise
    return [] if not soak_health.ready(obj) else [f"node {node} still Ready"]


async def delete_node(soak: Soak, node: str) -> str:
    """Delete the Node as a cloud provider's node controller does once the machine is gone
    (retried while the apiserver may be down)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            await soak.kube.delete(rest.NODES, node)
            return "deleted"
        except rest.ApiError as e:
            if e.not_found:
                return "already gone"
            if time.monotonic() > deadline:
                raise
        except UNREACHABLE:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(2)


LOST_NOT_READY_WAIT_S = 120.0  # the kcm's node-monitor-grace-period is 60 s
LOST_PODS_GONE_WAIT_S = 180.0  # the kcm's pod GC removes pods of a deleted Node


async def lose_node(soak: Soak, rng: random.Random) -> str:
    """A slurmd node's machine dies (kill -9 of everything on it); once its Node is NotReady
    and a hold has passed, the soak deletes the Node as a cloud node controller would, waits
    for its pods to go, and brings up a new machine of the same name. One slurmd node at
    least stays up, and the bridge's node is never lost."""
    candidates = [n for n in up_nodes(soak) if n != soak.bed.load().real_nodes[-1]]
    if len(candidates) < 2:
        return f"slurmd nodes up {candidates}: none lost (one at least stays)"
    node = rng.choice(candidates)
    hold = round(rng.uniform(5, 30), 1)
    fault = NodeFault(time.time(), node, await slurm_nodes_on(soak, node))
    soak.node_losses.append(fault)
    killed = await on_bed(soak, soak.bed.lose_node, node)
    t0 = time.monotonic()
    left = await wait_until_fine(soak, lambda: node_not_ready(soak, node), LOST_NOT_READY_WAIT_S)
    not_ready = f"NotReady after {time.monotonic() - t0:.0f}s" if not left else left[0]
    await asyncio.sleep(hold)
    deleted = await delete_node(soak, node)
    t1 = time.monotonic()

    async def pods_left() -> list[str]:
        return [f"pod {p['metadata']['name']} still on {node}" for p in await pods_on(soak, node)]

    left = await wait_until_fine(soak, pods_left, LOST_PODS_GONE_WAIT_S)
    gone = f"its pods gone after {time.monotonic() - t1:.0f}s" if not left else "; ".join(left)
    fault.until = time.time()
    await on_bed(soak, soak.bed.replace_node, node)
    return (
        f"{node} lost ({killed} processes killed; slurmd pods {fault.slurm_nodes}); "
        f"{not_ready}; Node {deleted} {hold}s later; {gone}; new machine {node} started"
    )


def _cut(soak: Soak, node: str) -> list[int]:
    state = soak.bed.load()
    try:
        return nodes.cut_node(
            soak.bed.names(state),
            state.real_nodes.index(node),
            state.pids[f"kubelet-{node}"][0],
        )
    except nodes.NodesError as e:
        raise ChaosError(str(e)) from None


def _restore(soak: Soak, node: str) -> None:
    state = soak.bed.load()
    nodes.restore_node(soak.bed.names(state), state.real_nodes.index(node))


async def cut_node(soak: Soak, rng: random.Random) -> str:
    """One real node (a slurmd node or the bridge's) cut off from slurmctld, the apiserver
    and the other nodes for 30-90 s, inside the test bed's network namespace only."""
    node = rng.choice(up_nodes(soak))
    hold = round(rng.uniform(30, 90), 1)
    fault = NodeFault(time.time(), node, await slurm_nodes_on(soak, node))
    soak.node_cuts.append(fault)
    try:
        ports = await on_bed(soak, _cut, soak, node)
        await asyncio.sleep(hold)
    finally:
        await on_bed(soak, _restore, soak, node)
        fault.until = time.time()
    return (
        f"{node} cut off for {hold}s (slurmd pods {fault.slurm_nodes}; the kubelet's "
        f"connections from ports {ports} and its new ones dropped)"
    )


def container_of(pod: dict[str, Any]) -> str:
    """The slurmd container's id as containerd knows it ("" when it has none)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return str(statuses[0].get("containerID") or "").partition("://")[2]


# kubectl as a person with every right who is not the operator (make dev's operator acts as
# the test bed's admin, which the busy-pod policy lets through).
AS_A_USER = ["--as=soak-user", "--as-group=system:masters"]


async def delete_slurmd_pod(soak: Soak, rng: random.Random) -> str:
    pods = await slurmd_pods(soak)
    if not pods:
        return "no running slurmd pod: nothing deleted"
    pod = rng.choice(pods)
    name = pod["metadata"]["name"]
    before = await slurm_state(soak, name)
    uid = pod["metadata"]["uid"]
    deleted = await asyncio.to_thread(
        soak.bed.kubectl, [*AS_A_USER, "delete", "pod", name, "-n", NAMESPACE, "--wait=false"]
    )
    if deleted.returncode != 0:
        said = (deleted.stderr or deleted.stdout).strip().splitlines()
        return f"delete of pod {name} (Slurm node {before}) refused: {said[-1] if said else ''}"
    t0 = time.monotonic()

    async def gone() -> list[str]:
        try:
            now = await soak.kube.get(rest.PODS, name, NAMESPACE)
        except rest.ApiError as e:
            if e.not_found:
                return []
            raise
        return [f"pod {name} still there"] if now["metadata"]["uid"] == uid else []

    left = await wait_until_fine(soak, gone, 300)
    took = f"gone after {time.monotonic() - t0:.0f}s" if not left else "still there after 300s"
    return f"deleted pod {name} (Slurm node {before}); {took}"


async def scale_batch(soak: Soak, rng: random.Random) -> str:
    target = rng.choice((0, 1, 2, 3))
    back = rng.choice((1, 2, 3))
    hold = round(rng.uniform(10, 30), 1)
    was = await replicas(soak, SCALED_NODESET)
    await scale(soak, SCALED_NODESET, target)
    if target:
        return f"NodeSet {SCALED_NODESET} {was} -> {target}"
    t0 = time.monotonic()
    left = await wait_until_fine(
        soak, lambda: soak_health.nodeset_problems(soak, SCALED_NODESET), 300
    )
    reached = f"reached 0 after {time.monotonic() - t0:.0f}s" if not left else f"not at 0: {left}"
    await asyncio.sleep(hold)
    await scale(soak, SCALED_NODESET, back)
    return f"NodeSet {SCALED_NODESET} {was} -> 0 ({reached}), {hold}s later -> {back}"


async def roll_template(soak: Soak, rng: random.Random) -> str:
    nodeset = rng.choice(NODESETS)
    value = str(rng.randrange(1 << 30))
    patch = {"spec": {"template": {"metadata": {"annotations": {ROLL_ANNOTATION: value}}}}}
    await soak.kube.patch(NODESET_RESOURCE, nodeset, patch, NAMESPACE)
    return f"NodeSet {nodeset}: template annotation {ROLL_ANNOTATION}={value} (rolling update)"


async def cordon_drain_node(soak: Soak, rng: random.Random) -> str:
    node = rng.choice(sorted(soak.bed.load().real_nodes)[:-1])  # the last is the bridge's
    hold = round(rng.uniform(5, 20), 1)
    drain = await asyncio.to_thread(
        soak.bed.kubectl,
        [
            *AS_A_USER,
            "drain",
            node,
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=45s",
        ],
        timeout=120,
    )
    said = (drain.stdout + drain.stderr).strip().splitlines()
    outcome = "drained" if drain.returncode == 0 else f"drain gave up: {said[-1] if said else ''}"
    await asyncio.sleep(hold)
    await uncordon(soak, node)
    return f"{node} cordoned and drained ({outcome}), uncordoned {hold}s later"


async def cordon_bridge_node(soak: Soak, rng: random.Random) -> str:
    state = soak.bed.load()
    node = rng.choice(sorted([state.real_nodes[-1], *state.kwok_nodes]))
    hold = round(rng.uniform(10, 30), 1)
    await soak.kube.patch(rest.NODES, node, {"spec": {"unschedulable": True}})
    await asyncio.sleep(hold)
    await uncordon(soak, node)
    return f"bridge node {node} cordoned for {hold}s"


async def uncordon(soak: Soak, node: str) -> None:
    """Uncordon, retried while the apiserver may be down (a crash action may run meanwhile)."""
    deadline = time.monotonic() + 120
    while True:
        try:
            await soak.kube.patch(rest.NODES, node, {"spec": {"unschedulable": None}})
            return
        except UNREACHABLE:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(2)


CHAOS: tuple[Chaos, ...] = (
    Chaos("scale-batch", 3, "scale NodeSet batch to 0-3 replicas (from 0 back to 1-3 after a hold)",
          "NodeSets converged, Slurm nodes match Ready pods", scale_batch, nodesets_fine,
          group="nodesets", recover_within_s=300),
    Chaos("roll-template", 2, "change a NodeSet's pod template (rolling update, drains first)",
          "NodeSets converged on the new revision", roll_template, nodesets_fine,
          group="nodesets", recover_within_s=400),
    Chaos("delete-slurmd-pod", 2, "kubectl delete a running slurmd pod, busy or not "
          "(a refused delete of a busy pod is expected)",
          "NodeSets converged", delete_slurmd_pod, nodesets_fine, group="nodesets"),
    Chaos("cordon-drain-node", 1, "kubectl drain a slurmd node (45 s, PDBs keep busy pods), "
          "uncordon after a hold", "NodeSets converged", cordon_drain_node, nodesets_fine,
          group="nodesets", recover_within_s=300),
    # Not by default: the container dies with slurmd, its jobs with it, and Slurm keeps them
    # RUNNING until their time limit (the host did not reboot, so slurmctld expects the
    # jobs' slurmstepds to have outlived slurmd); the node stays busy as long.
    Chaos("kill-slurmd", 1, "kill -9 slurmd inside a slurmd pod (Slurm's to handle: its jobs "
          "are counted apart)", "container restarted, NodeSets converged", kill_slurmd,
          nodesets_fine, group="nodesets", default=False),
    Chaos("cordon-bridge-node", 1, "cordon one of the bridge's nodes for 10-30 s",
          "no bridge drain left on an uncordoned node", cordon_bridge_node, bridge_nodes_fine,
          group="bridge-nodes"),
    Chaos("kill-operator", 2, "kill -9 slurm-operator, start it again after 0-5 s",
          "ready, healthy, Lease taken by the new process, Cluster Ready", kill_operator,
          operator_fine, recover_within_s=120),
    Chaos("kill-bridge", 2, "kill -9 slurm-bridge, start it again after 0-5 s",
          "ready, healthy, its 3 Leases taken by the new process", kill_bridge, bridge_fine,
          recover_within_s=120),
    Chaos("kill-slurmrestd", 1, "kill -9 slurmrestd, start it again after 0-5 s",
          "slurmctld answers through it, Cluster Ready", kill_slurmrestd, slurm_fine,
          recover_within_s=150),
    Chaos("kill-slurmctld", 1, "kill -9 slurmctld, start it again after 0-3 s",
          "slurmctld answers, partitions there, Slurm nodes match Ready slurmd pods",
          kill_slurmctld, slurmctld_fine),
    Chaos("restart-slurmctld", 1, "stop slurmctld (SIGTERM), start it again after 0-3 s",
          "as kill-slurmctld", restart_slurmctld, slurmctld_fine),
    Chaos("kill-slurmdbd", 1, "kill -9 slurmdbd, start it again after 0-5 s",
          "slurmdbd answers sacctmgr ping UP", kill_slurmdbd, accounting_fine,
          recover_within_s=120),
    Chaos("kill-mariadb", 1, "kill -9 MariaDB under slurmdbd, start it again after 0-5 s "
          "(slurmdbd reconnects)", "slurmdbd answers sacctmgr ping UP (it reached MariaDB)",
          kill_mariadb, accounting_fine, recover_within_s=120),
    Chaos("kill-apiserver", 1, "kill -9 kube-apiserver, start it again after 0-5 s",
          "operator and bridge ready and healthy with fresh Leases", kill_apiserver,
          apiserver_fine),
    Chaos("restart-kubelet", 1, "restart one real node's kubelet (SIGTERM, start)",
          "every node Ready", restart_kubelet, nodes_fine),
    Chaos("lose-node", 1, "kill -9 everything of one slurmd node (a dead machine: kubelet, "
          "containerd, pods), delete its Node once NotReady, start a new machine of its name "
          "(its jobs are Slurm's loss, counted apart)", "every node Ready, NodeSets converged",
          lose_node, nodes_and_nodesets_fine, group="nodesets", recover_within_s=400),
    Chaos("cut-node", 1, "drop a real node's traffic to and from slurmctld, the apiserver and "
          "the other nodes for 30-90 s (nft inside the test bed's network namespace)",
          "every node Ready, NodeSets converged", cut_node, nodes_and_nodesets_fine,
          group="nodesets", recover_within_s=300),
)  # fmt: skip
BY_NAME = {c.name: c for c in CHAOS}


# ---------------------------------------------------------------- the plan


@dataclass(frozen=True)
class Planned:
    at_s: float  # seconds after the start
    name: str
    seed: int  # seeds the action's own choices


DEFAULT_ACTIONS = tuple(c.name for c in CHAOS if c.default)


def plan(
    seed: int, duration_s: float, intensity: float, names: tuple[str, ...] = DEFAULT_ACTIONS
) -> list[Planned]:
    """Every action of the soak (of those named), in order, with its planned time."""
    rng = random.Random(f"chaos/{seed}")
    enabled = [c for c in CHAOS if c.name in names]
    first = [c.name for c in enabled]
    rng.shuffle(first)
    out: list[Planned] = []
    t = 0.0
    while True:
        t += max(MIN_GAP_S, rng.expovariate(intensity / MEAN_GAP_S))
        if t >= duration_s:
            return out
        if first:
            name = first.pop(0)
        else:
            name = rng.choices([c.name for c in enabled], weights=[c.weight for c in enabled])[0]
        out.append(Planned(round(t, 1), name, rng.randrange(1 << 31)))


# ---------------------------------------------------------------- running it


async def run_action(soak: Soak, planned: Planned) -> None:
    chaos = BY_NAME[planned.name]
    record = ActionRecord(chaos.name, planned.at_s, started_at=time.time())
    soak.actions.append(record)
    soak.log(f"chaos {chaos.name}: {chaos.what}")
    try:
        record.detail = await chaos.act(soak, random.Random(planned.seed))
    except (ChaosError, *UNREACHABLE) as e:
        record.error = f"{type(e).__name__}: {e}"
    except Exception as e:  # the soak's own error: logged, counted
        record.error = f"{type(e).__name__}: {e}"
        soak.harness_error(f"chaos {chaos.name}", e)
    record.done_at = time.time()
    soak.log(f"chaos {chaos.name}: {record.error or record.detail}")
    first: list[str] = []
    left = await wait_until_fine(
        soak, lambda: chaos.recovered(soak, record.started_at), chaos.recover_within_s, first
    )
    record.first_problems = "; ".join(first)
    if left:
        record.not_recovered = "; ".join(left)
        within = f"{chaos.recover_within_s:.0f}s"
        soak.log(f"chaos {chaos.name}: NOT recovered after {within}: {record.not_recovered}")
    else:
        record.recovered_after = time.time() - record.done_at
        after = f"{record.recovered_after:.1f}s"
        soak.log(f"chaos {chaos.name}: recovered ({chaos.recovered_means}) after {after}")


async def run_plan(soak: Soak, planned: list[Planned]) -> None:
    """Run the plan in order; returns when every action ran and recovered (or gave up)."""
    groups: dict[str, asyncio.Task[None]] = {}
    for i, p in enumerate(planned):
        delay = soak.started_at + p.at_s - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if soak.stopping.is_set():
            soak.log(f"chaos time over: {len(planned) - i} planned actions not run (delayed)")
            break
        chaos = BY_NAME[p.name]
        if chaos.group:
            if (running := groups.get(chaos.group)) is not None:
                await running
            groups[chaos.group] = asyncio.create_task(run_action(soak, p))
        else:
            await run_action(soak, p)
    await asyncio.gather(*groups.values())


async def supervise(soak: Soak) -> None:
    """Play the process supervisor a Deployment, a kubelet or systemd would be: a process of
    ours (operator, bridge) or of the test bed (apiserver, kube-controller-manager,
    kube-scheduler, slurmctld, slurmrestd, and with accounting MariaDB and slurmdbd, as
    systemd would) that exited while no action had stopped it is recorded with the last line
    of its log and started again (the operator and the bridge exit 1 by design when they
    lose their Lease)."""
    await soak.rounds("supervise", lambda: supervise_once(soak), 2)


async def supervise_once(soak: Soak) -> None:
    """One look at every supervised process (see `supervise`)."""
    for name in supervised(soak):
        if not soak.supervised[name] or alive(soak, name):
            continue
        lines = [
            ln
            for ln in (soak.bed.logs / f"{name}.log").read_text(errors="replace").splitlines()
            if ln.strip()
        ]
        last = lines[-1] if lines else ""
        soak.exits.append((time.time(), name, last))
        soak.log(f"{name} exited on its own (last log line: {last[:300]}); starting it again")
        soak.supervised[name] = False
        try:
            await start(soak, name)
        except ChaosError as e:
            soak.log(f"{name} did not start again: {e}")
        finally:
            soak.supervised[name] = True


async def restore(soak: Soak) -> None:
    """After the last action: every process up, every node uncordoned, NodeSet batch at 2
    pods at least (its queued jobs need nodes to finish, some of them two)."""
    for name in supervised(soak):
        if not alive(soak, name):
            soak.log(f"restore: {name} is not running; starting it")
            await start(soak, name)
    state = soak.bed.load()
    for index in await asyncio.to_thread(nodes.cut_nodes, soak.bed.names(state)):
        soak.log(f"restore: {state.real_nodes[index]} is still cut off; restoring")
        await on_bed(soak, _restore, soak, state.real_nodes[index])
    for node in sorted(set(state.real_nodes) - set(up_nodes(soak))):
        soak.log(f"restore: {node} is lost; starting a new machine")
        await on_bed(soak, soak.bed.replace_node, node)
    for node in sorted(await soak_health.cordoned_nodes(soak)):
        soak.log(f"restore: uncordon {node}")
        await uncordon(soak, node)
    if (now := await replicas(soak, SCALED_NODESET)) < 2:
        soak.log(f"restore: NodeSet {SCALED_NODESET} {now} -> 2")
        await scale(soak, SCALED_NODESET, 2)
