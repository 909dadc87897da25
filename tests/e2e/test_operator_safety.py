"""The operator never kills a job and never acts on a guess: NodeSet and namespace deletion,
the pods' controller address, admin drains, nodes of another namespace, availability in a
rolling update, self-healing children. Real apiserver, real Slurm, real slurmd."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest
from aiohttp import web

from slinky.kube import conditions, rest
from slinky.operator.nodeset.builder import ANNOTATION_CORDON, LABEL_PROTECT
from slinky.operator.nodeset.sync import ANNOTATION_SKIP_DRAIN
from slinky.operator.resources import CLUSTERS, NODESETS
from slinky.slurm import errors
from slinky.slurm.models import number
from slinky_testbed import procs
from slinky_testbed.waiting import wait_for
from tests.e2e.nodeset_fixtures import Env, nodeset_manifest, slurm_key_secret, wait_idle_nodes
from tests.e2e.operator_fixtures import cluster, condition, grant_secrets, secret

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]


async def completed_once(env: Env, job_id: int, timeout: float = 60) -> None:
    await env.completed_once(job_id, timeout)


async def nodeset_gone(env: Env, name: str, namespace: str | None = None) -> bool:
    try:
        await env.kube.get(NODESETS, name, namespace or env.namespace)
    except rest.ApiError as e:
        if e.not_found:
            return True
        raise
    return False


def slurmd_args(pod: JSON) -> list[str]:
    slurmd = next(c for c in pod["spec"]["containers"] if c["name"] == "slurmd")
    return [str(a) for a in slurmd.get("args") or []]


def conf_server_of(pod: JSON) -> str | None:
    args = slurmd_args(pod)
    for i, a in enumerate(args):
        if a == "--conf-server" and i + 1 < len(args):
            return args[i + 1]
        if a.startswith("--conf-server="):
            return a.partition("=")[2]
    return None


# ------------------------------------------------------------ deletion


async def test_deleting_a_nodeset_waits_for_running_jobs(env: Env) -> None:
    await env.kube.create(NODESETS, nodeset_manifest("del", 2), env.namespace)
    await wait_idle_nodes(env, "del", 2)
    job = await env.submit("del", 25)
    busy = await env.running_on(job)
    await env.kube.delete(NODESETS, "del", env.namespace)

    async def waiting_for_the_job() -> JSON | None:
        obj = await env.nodeset("del")
        cond = condition(obj, "Deleting")
        live = await env.live_pod_names("del")
        return cond if live == [busy] and str(job) in cond.get("message", "") else None

    cond = await wait_for(
        waiting_for_the_job, timeout=30, what="idle pod gone, Deleting names the job"
    )
    assert cond["status"] == "True" and busy in cond["message"]
    node = await env.slurm_node(busy)
    assert node is not None and node.state.is_drain
    assert node.reason == "slurm-operator: nodeset deleted"

    async def mirrored_drain() -> bool:
        # The Slurm mirror goes on while the NodeSet is deleted: the drain it made shows on
        # the pod, which keeps its busy label while the job runs.
        pod = await env.kube.get(rest.PODS, busy, env.namespace)
        drain = conditions.find(pod["status"].get("conditions"), "SlurmNodeStateDrain")
        labels = pod["metadata"].get("labels") or {}
        return bool(drain and drain["status"] == "True" and labels.get(LABEL_PROTECT) == "true")

    await wait_for(mirrored_drain, timeout=30, what="the pod shows its Slurm node DRAIN")
    await completed_once(env, job)
    await wait_for(lambda: nodeset_gone(env, "del"), timeout=30, what="NodeSet gone")

    async def no_pods() -> bool:
        return not await env.pods("del")

    await wait_for(no_pods, timeout=30, what="pods gone")


async def test_delete_without_drain_annotation_removes_the_nodeset_at_once(env: Env) -> None:
    # A NodeSet whose Cluster does not exist: the operator cannot ask Slurm, so a plain
    # deletion waits (fail closed); the annotation is the admin's way out.
    manifest = nodeset_manifest("stuck", 1, clusterName="nowhere")
    slurmd = manifest["spec"]["template"]["spec"]["containers"][0]
    slurmd["args"] = [*slurmd["args"], "--conf-server", env.testbed.slurmctld_addr]
    await env.kube.create(NODESETS, manifest, env.namespace)

    async def scheduled() -> bool:
        pods = await env.pods("stuck")
        return len(pods) == 1 and bool(pods[0]["spec"].get("nodeName"))

    await wait_for(scheduled, timeout=30, what="pod scheduled")
    await env.kube.delete(NODESETS, "stuck", env.namespace)

    async def waits() -> bool:
        cond = condition(await env.nodeset("stuck"), "Deleting")
        return "cannot ask Slurm" in cond.get("message", "")

    await wait_for(waits, timeout=30, what="deletion waits: Slurm cannot be asked")
    assert await env.live_pod_names("stuck") == ["stuck-0"]
    await env.kube.patch(
        NODESETS,
        "stuck",
        {"metadata": {"annotations": {ANNOTATION_SKIP_DRAIN: "true"}}},
        env.namespace,
    )
    await wait_for(lambda: nodeset_gone(env, "stuck"), timeout=30, what="NodeSet gone at once")


@contextlib.asynccontextmanager
async def other_namespace(env: Env, prefix: str) -> AsyncIterator[str]:
    """A second namespace with its own Ready Cluster on the same Slurm."""
    ns = f"{prefix}-{uuid.uuid4().hex[:6]}"
    await env.kube.create(rest.NAMESPACES, {"metadata": {"name": ns}})
    try:
        await grant_secrets(env.kube, ns)  # as an admin does for a namespace holding Clusters
        await env.kube.create(
            rest.SECRETS,
            secret("slurm-jwt", **{"jwt_hs256.key": env.testbed.jwt_key_path.read_bytes()}),
            ns,
        )
        # The slurmd pods mount the Slurm key from their own namespace (configless: nothing else).
        await env.kube.create(rest.SECRETS, slurm_key_secret(env.testbed), ns)
        host, port = env.testbed.slurmctld_addr.split(":")
        await env.kube.create(
            CLUSTERS,
            cluster(
                "slurm",
                env.testbed.slurm_rest_url,
                username="root",
                jwtKeyRef={"name": "slurm-jwt"},
                controller={"host": host, "port": int(port)},
            ),
            ns,
        )
        yield ns
    finally:
        with contextlib.suppress(rest.ApiError):
            await env.kube.delete(rest.NAMESPACES, ns)


async def test_deleting_the_namespace_lets_running_jobs_finish(env: Env) -> None:
    async with other_namespace(env, "t-nsdel") as ns:
        manifest = nodeset_manifest("nsdel", 1)
        manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 120
        await env.kube.create(NODESETS, manifest, ns)

        async def idle() -> bool:
            node = await env.slurm_node("nsdel-0")
            return node is not None and node.state.is_idle and not node.state.is_drain

        await wait_for(idle, timeout=60, what="nsdel-0 IDLE")
        job = await env.submit("nsdel", 15)
        assert await env.running_on(job) == "nsdel-0"
        await env.kube.delete(rest.NAMESPACES, ns)
        await completed_once(env, job)

        async def ns_gone() -> bool:
            try:
                await env.kube.get(rest.NAMESPACES, ns)
            except rest.ApiError as e:
                return e.not_found
            return False

        await wait_for(ns_gone, timeout=90, what="namespace gone after the job")
        await wait_for(
            lambda: _absent(env, "nsdel-0"), timeout=30, what="Slurm node record removed"
        )


async def ran_to_its_end(env: Env, ns: str, pod: str, marker: str) -> bool:
    """Whether the job's script wrote its last line (`marker`) in the slurmd container;
    fails at once when the container stopped first (slurmd let go under the job)."""
    live = await env.kube.get(rest.PODS, pod, ns)
    statuses = (live.get("status") or {}).get("containerStatuses") or []
    slurmd = next((c for c in statuses if c.get("name") == "slurmd"), {})
    assert "running" in (slurmd.get("state") or {}), (
        f"slurmd of {pod} stopped while slurmctld was down and its job ran: {slurmd}"
    )
    found = await asyncio.to_thread(
        env.testbed.kubectl, ["-n", ns, "exec", pod, "-c", "slurmd", "--", "test", "-e", marker]
    )
    return found.returncode == 0


@pytest.mark.parametrize("stop", ["namespace deleted", "kubelet ends the pod"])
async def test_a_busy_pod_stopped_while_slurmctld_is_down_lets_its_job_finish(
    env: Env, stop: str
) -> None:
    """A busy slurmd pod is stopped by a path the busy-pod policy does not see while
    slurmctld is down: its preStop cannot read the node's state, takes that for "busy" and
    waits, so the job runs to its end and ends COMPLETED once slurmctld is back. (The hook
    took the failed read for "no jobs" and let slurmd stop under the job.) "kubelet ends the
    pod": activeDeadlineSeconds set on the running pod, which the kubelet enforces the way
    it evicts under node pressure or stops pods at a graceful node shutdown: preStop, then
    SIGTERM within the grace period (node pressure and logind cannot be made here)."""
    prefix = "t-ctlddown-ns" if stop == "namespace deleted" else "t-ctlddown-kl"
    async with other_namespace(env, prefix) as ns:
        name = "ctlddown" if stop == "namespace deleted" else "ctlddl"
        manifest = nodeset_manifest(name, 1)
        manifest["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 180
        await env.kube.create(NODESETS, manifest, ns)
        pod = f"{name}-0"

        async def idle() -> bool:
            node = await env.slurm_node(pod)
            return node is not None and node.state.is_idle and not node.state.is_drain

        await wait_for(idle, timeout=60, what=f"{pod} IDLE")
        marker = f"/tmp/ended-{uuid.uuid4().hex[:6]}"
        job = await env.submit(name, 20, then=f"touch {marker}")
        assert await env.running_on(job) == pod
        await asyncio.to_thread(env.testbed.stop_component, "slurmctld")  # saves its state
        try:
            if stop == "namespace deleted":
                await env.kube.delete(rest.NAMESPACES, ns)
            else:
                await env.kube.patch(rest.PODS, pod, {"spec": {"activeDeadlineSeconds": 1}}, ns)

            async def terminating() -> bool:
                if stop == "namespace deleted":
                    live = await env.kube.get(rest.PODS, pod, ns)
                    return bool(live["metadata"].get("deletionTimestamp"))
                events = (await env.kube.list(rest.EVENTS, ns))["items"]  # the kubelet's
                return any(
                    e.get("reason") == "DeadlineExceeded"
                    and (e.get("regarding") or {}).get("name") == pod
                    for e in events
                )

            await wait_for(terminating, timeout=30, what=f"{pod} being stopped ({stop})")
            await wait_for(
                lambda: ran_to_its_end(env, ns, pod, marker),
                timeout=90,
                interval=1.0,
                what=f"job {job}'s script ran to its end in {pod}",
            )
        finally:
            await asyncio.to_thread(env.testbed.start_component, "slurmctld")
        await completed_once(env, job, timeout=90)
        if stop == "kubelet ends the pod":
            await env.kube.delete(rest.NAMESPACES, ns)


async def _absent(env: Env, name: str) -> bool:
    return await env.slurm_node(name) is None


# ------------------------------------------------------------ controller address


ENDPOINT_SLICES = rest.Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")


async def slurmctld_service(env: Env, ns: str, host: str, port: int) -> str:
    """A selector-less ClusterIP Service whose one endpoint is slurmctld; its ClusterIP."""
    svc = await env.kube.create(
        rest.SERVICES,
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "ctld"},
            "spec": {"ports": [{"name": "slurmctld", "port": port, "targetPort": port}]},
        },
        ns,
    )
    await env.kube.create(
        ENDPOINT_SLICES,
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {"name": "ctld", "labels": {"kubernetes.io/service-name": "ctld"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [host]}],
            "ports": [{"name": "slurmctld", "port": port, "protocol": "TCP"}],
        },
        ns,
    )
    return str(svc["spec"]["clusterIP"])


async def test_a_nodeset_applied_with_its_cluster_gets_conf_server_pods(env: Env) -> None:
    async with other_namespace(env, "t-confsrv") as ns:
        # The NodeSet goes in right after its Cluster, before any Slurm connection is up
        # (what `kubectl apply -f` of one file does).
        await env.kube.create(NODESETS, nodeset_manifest("conf", 2), ns)

        async def pods() -> list[JSON]:
            items = (
                await env.kube.list(
                    rest.PODS, ns, params={"labelSelector": "nodeset.slinky.slurm.net/name=conf"}
                )
            )["items"]
            return [p for p in items if not p["metadata"].get("deletionTimestamp")]

        async def created() -> list[JSON] | None:
            items = await pods()
            return items if len(items) == 2 else None

        for pod in await wait_for(created, timeout=30, what="2 pods created"):
            assert conf_server_of(pod) == env.testbed.slurmctld_addr, slurmd_args(pod)

        async def idle() -> bool:
            for n in ("conf-0", "conf-1"):
                node = await env.slurm_node(n)
                if node is None or not node.state.is_idle:
                    return False
            return True

        await wait_for(idle, timeout=60, what="both register with slurmctld")

        # Changing spec.controller rolls the pods onto the new address: a ClusterIP Service
        # (no selector; its EndpointSlice names slurmctld) is a second way to reach it.
        host, port = env.testbed.slurmctld_addr.split(":")
        new_host = await slurmctld_service(env, ns, host, int(port))
        new_addr = f"{new_host}:{port}"
        patched_at = int(time.time())
        await env.kube.patch(CLUSTERS, "slurm", {"spec": {"controller": {"host": new_host}}}, ns)

        async def rolled() -> bool:
            items = await pods()
            return len(items) == 2 and all(conf_server_of(p) == new_addr for p in items)

        await wait_for(rolled, timeout=120, what="pods rolled onto the new --conf-server")

        async def registered_anew() -> bool:
            # Configless slurmd registers only after it fetched slurm.conf from --conf-server.
            for n in ("conf-0", "conf-1"):
                node = await env.slurm_node(n)
                started = number(node.raw.get("slurmd_start_time")) if node else None
                if not (node and node.state.is_idle and started and started >= patched_at):
                    return False
            return True

        await wait_for(registered_anew, timeout=90, what="rolled slurmds registered again")
        with contextlib.suppress(rest.ApiError):
            await env.kube.delete(NODESETS, "conf", ns)

        async def conf_gone() -> bool:
            try:
                await env.kube.get(NODESETS, "conf", ns)
            except rest.ApiError as e:
                return e.not_found
            return False

        await wait_for(conf_gone, timeout=60, what="NodeSet conf deleted")


# ------------------------------------------------------------ acting on Slurm data only


async def test_an_admin_drain_made_since_the_last_poll_is_not_undone(env: Env) -> None:
    await env.kube.create(NODESETS, nodeset_manifest("adm", 1), env.namespace)
    await wait_idle_nodes(env, "adm", 1)
    await env.kube.patch(
        rest.PODS,
        "adm-0",
        {"metadata": {"annotations": {ANNOTATION_CORDON: "true"}}},
        env.namespace,
    )

    async def cordoned() -> bool:
        node = await env.slurm_node("adm-0")
        return bool(node and node.state.is_drain and node.reason.startswith("slurm-operator: "))

    await wait_for(cordoned, timeout=30, what="cordon drains the node")

    async def pod_shows_operator_drain() -> bool:
        pod = await env.kube.get(rest.PODS, "adm-0", env.namespace)
        for c in pod["status"].get("conditions") or []:
            if c["type"] == "SlurmNodeStateDrain":
                return bool(c["status"] == "True" and "slurm-operator" in c.get("message", ""))
        return False

    await wait_for(pod_shows_operator_drain, timeout=60, what="operator's cache saw its drain")
    # The admin takes the drain over, and the cordon is lifted right after: the operator's
    # cache still shows its own reason.
    await env.slurm.update_node("adm-0", state="DRAIN", reason="admin: bad DIMM")
    await env.kube.patch(
        rest.PODS, "adm-0", {"metadata": {"annotations": {ANNOTATION_CORDON: None}}}, env.namespace
    )

    async def pod_shows_admin_drain() -> bool:
        pod = await env.kube.get(rest.PODS, "adm-0", env.namespace)
        for c in pod["status"].get("conditions") or []:
            if c["type"] == "SlurmNodeStateDrain":
                return bool(c["status"] == "True" and c.get("message") == "admin: bad DIMM")
        return False

    # Once the pod mirrors the admin's reason, the operator has acted on the uncordon.
    await wait_for(pod_shows_admin_drain, timeout=90, what="operator's cache saw the admin")
    node = await env.slurm_node("adm-0")
    assert node is not None and node.state.is_drain and node.reason == "admin: bad DIMM"
    await env.slurm.update_node("adm-0", state="UNDRAIN")


async def test_a_slurm_node_of_another_namespace_is_never_touched(env: Env) -> None:
    # Slurm already has a node named like our pod, owned by a pod of another namespace.
    other = '{"namespace":"elsewhere","podName":"twin-0","nodeSet":"twin","node":"x"}'
    await env.slurm.create_node(
        "NodeName=twin-0 NodeAddr=127.0.0.1 CPUs=1 RealMemory=100 State=EXTERNAL"
    )
    try:
        await env.slurm.update_node("twin-0", comment=other)
        assert (await env.slurm.get_node("twin-0")).comment == other
        manifest = nodeset_manifest("twin", 1)
        manifest["spec"]["template"]["spec"].update(
            nodeSelector={"testbed.slinky.slurm.net/kubelet": "kwok"},
            tolerations=[{"key": "kwok.x-k8s.io/node", "operator": "Exists"}],
        )
        manifest["spec"]["template"]["metadata"]["annotations"] = {ANNOTATION_CORDON: "true"}
        await env.kube.create(NODESETS, manifest, env.namespace)

        async def running() -> bool:
            pods = await env.pods("twin")
            return len(pods) == 1 and (pods[0].get("status") or {}).get("phase") == "Running"

        await wait_for(running, timeout=30, what="twin-0 Running on a kwok node")
        await env.scale("twin", 0)

        async def condemned_and_waiting() -> bool:
            pods = await env.pods("twin")
            ann = (pods[0]["metadata"].get("annotations") or {}) if pods else {}
            return "nodeset.slinky.slurm.net/condemned" in ann

        await wait_for(condemned_and_waiting, timeout=30, what="pod condemned")
        # The operator has reconciled the cordon and the scale-in; the foreign node is as
        # its owner left it: not drained, comment unchanged, and our pod waits.
        await wait_for(lambda: _status_seen(env, "twin"), timeout=30, what="status after scale-in")
        node = await env.slurm.get_node("twin-0")
        assert not node.state.is_drain, node.state
        assert node.comment == other
        assert await env.live_pod_names("twin") == ["twin-0"], "never deleted on a guess"
    finally:
        with contextlib.suppress(rest.ApiError):
            await env.kube.patch(
                NODESETS,
                "twin",
                {"metadata": {"annotations": {ANNOTATION_SKIP_DRAIN: "true"}}},
                env.namespace,
            )
        with contextlib.suppress(errors.SlurmError):
            await env.slurm.delete_node("twin-0")


async def _status_seen(env: Env, name: str) -> bool:
    st = (await env.nodeset(name)).get("status") or {}
    return st.get("replicas") == 1 and st.get("observedGeneration") == 2


async def test_a_rolling_update_counts_a_down_slurm_node_as_unavailable(env: Env) -> None:
    await env.kube.create(
        NODESETS,
        nodeset_manifest(
            "avail",
            2,
            updateStrategy={"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
        ),
        env.namespace,
    )
    await wait_idle_nodes(env, "avail", 2)
    old = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await env.pods("avail")}
    # avail-0's Slurm node goes DOWN while its pod stays Ready: one pod is unavailable
    # already, so the update may replace only that one until its replacement is available.
    await env.slurm.update_node("avail-0", state="DOWN", reason="e2e: broken")

    async def down_seen() -> bool:
        pod = await env.kube.get(rest.PODS, "avail-0", env.namespace)
        return any(
            c["type"] == "SlurmNodeStateDown" and c["status"] == "True"
            for c in pod["status"].get("conditions") or []
        )

    await wait_for(down_seen, timeout=60, what="pod mirrors DOWN")
    patched = await env.change_template("avail")
    generation = patched["metadata"]["generation"]
    violations: list[str] = []

    async def converged() -> bool:
        pods = {p["metadata"]["name"]: p for p in await env.pods("avail")}
        one = pods.get("avail-1")
        touched = one is None or one["metadata"]["uid"] != old["avail-1"]
        touched = touched or "nodeset.slinky.slurm.net/condemned" in (
            one["metadata"].get("annotations") or {}
        )
        zero = pods.get("avail-0")
        replaced = zero is not None and zero["metadata"]["uid"] != old["avail-0"]
        if touched:
            node = await env.slurm_node("avail-0")
            if not (replaced and node is not None and node.state.is_idle):
                violations.append("avail-1 taken while avail-0 was still unavailable")
        st = (await env.nodeset("avail")).get("status") or {}
        return (
            st.get("observedGeneration") == generation  # not the status from before the change
            and st.get("updatedReplicas") == 2
            and st.get("readyReplicas") == 2
        )

    await wait_for(converged, timeout=150, interval=0.2, what="both pods updated")
    assert not violations, violations[0]
    await wait_idle_nodes(env, "avail", 2)


# ------------------------------------------------------------ self-healing


async def test_a_deleted_service_or_pdb_is_recreated_and_a_new_service_name_followed(
    env: Env,
) -> None:
    manifest = nodeset_manifest("heal", 0)
    await env.kube.create(NODESETS, manifest, env.namespace)

    async def exists(res: rest.Resource, name: str) -> bool:
        try:
            obj = await env.kube.get(res, name, env.namespace)
        except rest.ApiError as e:
            if e.not_found:
                return False
            raise
        return not obj["metadata"].get("deletionTimestamp")

    await wait_for(lambda: exists(rest.SERVICES, "heal"), timeout=30, what="Service")
    await wait_for(lambda: exists(rest.PDBS, "heal-protect"), timeout=30, what="PDB")
    old_svc = (await env.kube.get(rest.SERVICES, "heal", env.namespace))["metadata"]["uid"]
    await env.kube.delete(rest.SERVICES, "heal", env.namespace)
    await env.kube.delete(rest.PDBS, "heal-protect", env.namespace)

    async def recreated() -> bool:
        if not await exists(rest.SERVICES, "heal") or not await exists(rest.PDBS, "heal-protect"):
            return False
        svc = await env.kube.get(rest.SERVICES, "heal", env.namespace)
        return bool(svc["metadata"]["uid"] != old_svc)

    await wait_for(recreated, timeout=30, what="Service and PDB re-created")
    await env.kube.patch(NODESETS, "heal", {"spec": {"serviceName": "heal-dns"}}, env.namespace)
    await wait_for(lambda: exists(rest.SERVICES, "heal-dns"), timeout=30, what="new Service")


# ------------------------------------------------------------ only a definite answer


class SlurmProxy:
    """An HTTP proxy in front of slurmrestd that can answer a bare 404 (no Slurm error) for
    `GET .../node/<name>`, as a proxy or a data parser no longer served would."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.bare_404 = False
        self.runner: web.AppRunner | None = None
        self.url = ""
        self.http = httpx2.AsyncClient(base_url=upstream, timeout=30)

    async def start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.forward)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        port = procs.free_port()
        await web.TCPSite(self.runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"

    async def forward(self, req: web.Request) -> web.Response:
        if self.bare_404 and req.method == "GET" and re.search(r"/node/[^/]+$", req.path):
            return web.Response(status=404, text="Not Found")
        headers = {k: v for k, v in req.headers.items() if k.lower().startswith("x-slurm")}
        if req.content_type:
            headers["Content-Type"] = req.content_type
        resp = await self.http.request(
            req.method, req.path_qs, headers=headers, content=await req.read()
        )
        return web.Response(
            status=resp.status_code,
            body=resp.content,
            content_type=resp.headers.get("content-type", "application/json").split(";")[0],
        )

    async def stop(self) -> None:
        if self.runner:
            await self.runner.cleanup()
        await self.http.aclose()


async def test_a_bare_404_never_counts_as_no_such_node(env: Env) -> None:
    proxy = SlurmProxy(env.testbed.slurm_rest_url)
    await proxy.start()
    try:
        await env.kube.patch(CLUSTERS, "slurm", {"spec": {"server": proxy.url}}, env.namespace)

        async def via_proxy() -> bool:
            cond = condition(await env.kube.get(CLUSTERS, "slurm", env.namespace))
            return cond.get("reason") == "Connected" and proxy.url in cond.get("message", "")

        await wait_for(via_proxy, timeout=60, what="Cluster connected through the proxy")
        await env.kube.create(NODESETS, nodeset_manifest("proxied", 1), env.namespace)
        await wait_idle_nodes(env, "proxied", 1)
        job = await env.submit("proxied", 12)
        await env.running_on(job)
        proxy.bare_404 = True
        await env.scale("proxied", 0)

        async def job_done_pod_kept() -> bool:
            assert await env.live_pod_names("proxied") == ["proxied-0"], "pod deleted on a bare 404"
            return "COMPLETED" in await env.job_state(job)

        await wait_for(job_done_pod_kept, timeout=60, interval=0.2, what="job ends, pod kept")
        await completed_once(env, job)
        assert await env.live_pod_names("proxied") == ["proxied-0"]
        proxy.bare_404 = False

        async def pod_gone() -> bool:
            return not await env.pods("proxied")

        await wait_for(pod_gone, timeout=60, what="pod deleted once Slurm answers again")
    finally:
        proxy.bare_404 = False
        with contextlib.suppress(rest.ApiError):
            await env.kube.patch(
                CLUSTERS, "slurm", {"spec": {"server": env.testbed.slurm_rest_url}}, env.namespace
            )
        await proxy.stop()


# ------------------------------------------------------------ costs


def node_gets(env: Env) -> float:
    """GET /node/<name> requests the operator sent to slurmrestd so far."""
    total = 0.0
    for line in env.operator.metrics().splitlines():
        if (
            line.startswith("slurm_rest_requests_total{")
            and 'method="GET"' in line
            and '/node/{id}"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def test_a_busy_draining_node_is_not_read_from_slurm_until_the_cache_shows_it_drained(
    env: Env,
) -> None:
    await env.kube.create(NODESETS, nodeset_manifest("cheap", 1), env.namespace)
    (name,) = await wait_idle_nodes(env, "cheap", 1)
    job = await env.submit("cheap", 15)
    await env.running_on(job)
    await env.scale("cheap", 0)

    async def draining_seen() -> bool:
        pod = await env.kube.get(rest.PODS, name, env.namespace)
        conds = {c["type"]: c for c in pod["status"].get("conditions") or []}

        def on(kind: str) -> bool:
            return (conds.get(f"SlurmNodeState{kind}") or {}).get("status") == "True"

        return on("Drain") and (on("Allocated") or on("Mixed"))

    await wait_for(draining_seen, timeout=60, what="operator's cache shows the node busy+DRAIN")
    before = node_gets(env)
    while_running: list[float] = []

    async def job_done() -> bool:
        sample = node_gets(env)  # taken before the state check: the job still ran then
        state = await env.job_state(job)
        if state == ["RUNNING"]:
            while_running.append(sample)
        return "COMPLETED" in state

    await wait_for(job_done, timeout=60, interval=0.5, what="job completed")
    assert while_running and max(while_running) == before, (
        f"GET /node while the cache showed the node busy: {before} -> {while_running}"
    )
    await completed_once(env, job)

    async def no_pods() -> bool:
        return not await env.pods("cheap")

    await wait_for(no_pods, timeout=30, what="pod deleted once drained")
    assert node_gets(env) > before, "the deletion itself rests on Slurm's live answer"
