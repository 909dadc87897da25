"""Real nodes of the test bed: kubelet + containerd + runc per node, kube-proxy (nftables) and
CoreDNS once, pods from images built here. Everything goes through the real apiserver and
kubectl, as on any cluster."""

from __future__ import annotations

import base64
import contextlib
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from slinky.kube import rest
from slinky.slurm import errors
from slinky.slurm.client import SlurmClient
from slinky.slurm.tokens import MintedToken
from slinky_testbed import nodes, paths
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for
from tests.e2e.workers import worker_bed_dir

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
JSON = dict[str, Any]
ROLES = rest.Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLE_BINDINGS = rest.Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
SERVICE_ACCOUNTS = rest.Resource("", "v1", "serviceaccounts", "ServiceAccount")


def container_pod(name: str, image: str, args: list[str], **spec: Any) -> JSON:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": nodes.image_ref(image),
                    "imagePullPolicy": "IfNotPresent",
                    "args": args,
                }
            ],
            **spec,
        },
    }


async def phase(kube: rest.Kube, name: str, namespace: str, *want: str) -> JSON | None:
    got = await kube.get(rest.PODS, name, namespace)
    return got if (got.get("status") or {}).get("phase") in want else None


async def finished(kube: rest.Kube, name: str, namespace: str, timeout: float = 120) -> JSON:
    async def done() -> JSON | None:
        return await phase(kube, name, namespace, "Succeeded", "Failed")

    return await wait_for(done, timeout=timeout, interval=0.5, what=f"pod {name} finished")


async def running(kube: rest.Kube, name: str, namespace: str, timeout: float = 120) -> JSON:
    async def up() -> JSON | None:
        got = await phase(kube, name, namespace, "Running")
        statuses = ((got or {}).get("status") or {}).get("containerStatuses") or []
        return got if statuses and all(s.get("ready") for s in statuses) else None

    return await wait_for(up, timeout=timeout, interval=0.5, what=f"pod {name} Running")


def exit_code(pod: JSON) -> int:
    return int(pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"])


async def test_every_real_node_is_ready_with_its_bridge_address(
    kube: rest.Kube, testbed: Testbed
) -> None:
    state = testbed.load()
    names = testbed.names(state)
    for i, name in enumerate(state.real_nodes):
        node = await kube.get(rest.Resource("", "v1", "nodes", "Node", namespaced=False), name)
        addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
        assert addresses["InternalIP"] == names.node_ip(i)
        assert node["metadata"]["labels"]["testbed.slinky.slurm.net/kubelet"] == "real"


async def test_pod_from_a_local_image_shows_logs_and_exit_code_in_kubectl(
    kube: rest.Kube, testbed: Testbed, namespace: str
) -> None:
    await kube.create(
        rest.PODS,
        container_pod("exit3", "slurm", ["sh", "-c", "echo hello from $(hostname); exit 3"]),
        namespace,
    )
    pod = await finished(kube, "exit3", namespace)
    assert pod["status"]["phase"] == "Failed"
    assert exit_code(pod) == 3
    assert pod["spec"]["nodeName"] in testbed.load().real_nodes
    logs = testbed.kubectl(["-n", namespace, "logs", "exit3"])
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.strip() == "hello from exit3"


async def test_kubectl_exec_runs_inside_the_container(
    kube: rest.Kube, testbed: Testbed, namespace: str
) -> None:
    await kube.create(rest.PODS, container_pod("sleeper", "slurm", ["sleep", "600"]), namespace)
    await running(kube, "sleeper", namespace)
    out = testbed.kubectl(
        ["-n", namespace, "exec", "sleeper", "--", "sh", "-c", "hostname; id -u; echo $$"]
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["sleeper", "0", out.stdout.split()[2]]
    assert int(out.stdout.split()[2]) > 1  # a new process beside the container's PID 1


async def test_cluster_ip_service_and_dns_name_reach_a_pod_on_another_node(
    kube: rest.Kube, testbed: Testbed, namespace: str
) -> None:
    server_node, client_node = testbed.load().real_nodes[:2]
    server = container_pod(
        "web",
        "slinky",
        ["python3", "-c", SERVER],
        nodeName=server_node,
        restartPolicy="Always",
    )
    server["spec"]["containers"][0]["env"] = [
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    ]
    await kube.create(rest.PODS, server, namespace)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    created = await kube.create(rest.SERVICES, service, namespace)
    await running(kube, "web", namespace)
    cluster_ip = created["spec"]["clusterIP"]
    for name, url in (
        ("by-ip", f"http://{cluster_ip}/"),
        ("by-name", f"http://web.{namespace}.svc.cluster.local/"),
        ("by-short-name", "http://web/"),
    ):
        client = container_pod("get-" + name, "slinky", ["python3", "-c", CLIENT, url])
        client["spec"]["nodeName"] = client_node
        await kube.create(rest.PODS, client, namespace)
        pod = await finished(kube, "get-" + name, namespace)
        logs = testbed.kubectl(["-n", namespace, "logs", "get-" + name]).stdout
        assert exit_code(pod) == 0, logs
        assert logs.strip() == f"served by web on {server_node}"


SERVER = """
import http.server, os
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = f"served by {os.uname().nodename} on {os.environ['NODE']}".encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
http.server.HTTPServer(("", 8080), H).serve_forever()
"""
CLIENT = """
import sys, time, urllib.request
for attempt in range(60):  # the Service's rules may still be on their way to kube-proxy
    try:
        print(urllib.request.urlopen(sys.argv[1], timeout=2).read().decode()); break
    except OSError as e:
        err = e; time.sleep(0.5)
else:
    sys.exit(f"{sys.argv[1]}: {err}")
"""


async def test_in_cluster_config_gets_what_its_role_allows_and_is_refused_the_rest(
    kube: rest.Kube, testbed: Testbed, namespace: str
) -> None:
    await kube.create(
        SERVICE_ACCOUNTS,
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "reader"}},
        namespace,
    )
    await kube.create(
        ROLES,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
        namespace,
    )
    await kube.create(
        ROLE_BINDINGS,
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": "reader"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "pod-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
        namespace,
    )
    pod = container_pod("incluster", "slinky", ["python3", "-c", IN_CLUSTER, namespace])
    pod["spec"]["serviceAccountName"] = "reader"
    await kube.create(rest.PODS, pod, namespace)
    done = await finished(kube, "incluster", namespace)
    logs = testbed.kubectl(["-n", namespace, "logs", "incluster"]).stdout.split("\n")
    assert exit_code(done) == 0, logs
    assert logs[0] == "pods: incluster"
    assert logs[1] == "secrets: 403"
    assert logs[2] == "delete pod: 403"


IN_CLUSTER = """
import asyncio, os, sys
from slinky.kube import rest
async def main(ns):
    assert not os.environ.get("KUBECONFIG")
    kube = rest.Kube.from_kubeconfig()  # no file: the pod's ServiceAccount
    pods = await kube.list(rest.PODS, ns)
    print("pods:", " ".join(p["metadata"]["name"] for p in pods["items"]))
    for what, call in (("secrets", kube.list(rest.SECRETS, ns)),
                       ("delete pod", kube.delete(rest.PODS, "incluster", ns))):
        try:
            await call
            print(what + ": allowed")
        except rest.ApiError as e:
            print(what + ":", e.code)
    await kube.close()
asyncio.run(main(sys.argv[1]))
"""


async def test_slurmd_in_a_container_registers_configless_and_runs_a_batch_job(
    kube: rest.Kube, testbed: Testbed, namespace: str
) -> None:
    """Nothing of Slurm's configuration is mounted but the key: slurmd fetches the rest from
    slurmctld, at the address pods reach."""
    key = (testbed.root / "etc" / "slurm" / "slurm.key").read_bytes()
    await kube.create(
        rest.SECRETS,
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "slurm-key"},
            "data": {"slurm.key": base64.b64encode(key).decode()},
        },
        namespace,
    )
    feature = f"f{namespace[-6:]}"
    name = f"c-{namespace[-6:]}"
    pod = container_pod(
        name,
        "slurm",
        [
            "slurmd",
            "-D",
            "-Z",
            "--conf-server",
            testbed.slurmctld_addr,
            "--conf",
            f"CPUs=1 RealMemory=500 Features={feature}",
        ],
        restartPolicy="Always",
        volumes=[{"name": "key", "secret": {"secretName": "slurm-key", "defaultMode": 0o600}}],
    )
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": "key", "mountPath": "/etc/slurm/slurm.key", "subPath": "slurm.key"}
    ]
    await kube.create(rest.PODS, pod, namespace)
    slurm = SlurmClient(
        testbed.slurm_rest_url, MintedToken.from_file(testbed.jwt_key_path, user="root")
    )
    try:

        async def idle() -> bool:
            with contextlib.suppress(errors.SlurmNotFound):
                return bool((await slurm.get_node(name)).state.is_idle)
            return False

        await wait_for(idle, timeout=120, interval=0.5, what=f"Slurm node {name} IDLE")
        job_id = await slurm.submit_job(
            {
                "name": "e2e-real-node",
                "constraints": feature,
                "minimum_nodes": 1,
                "tasks": 1,
                "current_working_directory": "/tmp",
                "environment": ["PATH=/usr/bin:/bin"],
                "time_limit": {"set": True, "number": 5},
            },
            script="#!/bin/sh\nhostname\n",
        )

        async def completed() -> list[str] | None:
            job = await slurm.get_job(job_id)
            # COMPLETING stays beside COMPLETED until the node has cleaned up.
            return job.state if job.is_finished and "COMPLETING" not in job.state else None

        assert await wait_for(completed, timeout=120, what=f"job {job_id} finished") == [
            "COMPLETED"
        ]
        await kube.delete(rest.PODS, name, namespace)

        async def gone() -> bool:
            try:
                await kube.get(rest.PODS, name, namespace)
            except rest.ApiError as e:
                return e.not_found
            return False

        await wait_for(gone, timeout=60, what=f"pod {name} deleted")
        await slurm.delete_node(name)
    finally:
        await slurm.close()


async def test_teardown_leaves_nothing_and_a_killed_test_bed_is_recovered_by_up(
    testbed: Testbed,
) -> None:
    """A second test bed beside the session's picks its own names and subnets; SIGKILL of all
    its processes (a crashed run) is cleaned up by the next `up`; `down` leaves nothing."""
    bed = Testbed(worker_bed_dir("SLINKY_E2E_SECOND_DIR", "e2e-2"))
    if bed.status_lines(only_running=True):
        bed.down(log=print)
    bed.up(real_nodes=1, log=print)
    try:
        mine, theirs = bed.names(), testbed.names()
        assert mine.tag != theirs.tag and mine.octet != theirs.octet
        await _run_a_pod(bed)
        # A crashed run: every process gone at once, no cleanup.
        for _, proc in bed.tracked_processes(bed.load()):
            proc.signal(signal.SIGKILL, group=True)
        # A process in uninterruptible sleep (I/O on a loaded machine) dies when it leaves it.
        await wait_for(
            lambda: not bed.status_lines(only_running=True),
            timeout=30,
            what="every killed process of the second test bed gone",
        )
        assert nodes.leftovers(bed.names(), bed.nodes_dir)  # shims, netns, mounts, cgroups
        bed.up(real_nodes=1, log=print)
        await _run_a_pod(bed)
    finally:
        bed.down(log=print)
    assert nodes.leftovers(bed.names(), bed.nodes_dir) == []
    assert not bed.status_lines(only_running=True)


async def _run_a_pod(bed: Testbed) -> None:
    kube = rest.Kube.from_kubeconfig(bed.kubeconfig)
    try:
        await wait_for(
            lambda: kube.get(SERVICE_ACCOUNTS, "default", "default"),
            timeout=60,
            what="default ServiceAccount",
            ignore=(rest.ApiError,),
        )
        await kube.create(rest.PODS, container_pod("sleeper", "slurm", ["sleep", "600"]), "default")
        await running(kube, "sleeper", "default")
    finally:
        await kube.close()


async def test_the_quickstart_image_import_line_imports_both_images(testbed: Testbed) -> None:
    """docs/quickstart.md's one-line import, run as written against a real node's containerd
    (into a namespace of its own, so what it imports is seen alone): both archives, not only
    the first (`ctr` takes one archive per call)."""
    doc = (REPO / "docs/quickstart.md").read_text()
    (line,) = [ln.strip("`") for ln in doc.splitlines() if "images import" in ln and "ctr " in ln]
    node = testbed.load().real_nodes[0]
    sock = testbed.nodes_dir / node / "containerd" / "containerd.sock"
    ctr = f"{paths.bin_dir() / 'ctr'} --address {sock}"
    ns = "quickstart-e2e"
    script = line.replace("~/.cache/slinky", str(paths.cache_dir())).replace(
        "-n k8s.io", f"-n {ns}"
    )
    out = subprocess.run(
        ["bash", "-c", f'ctr() {{ {ctr} "$@"; }}; {script}'],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    try:
        listed = subprocess.run(
            ["bash", "-c", f"{ctr} -n {ns} images ls -q"],
            capture_output=True, text=True, timeout=60, check=True,
        ).stdout.split()  # fmt: skip
        for image in ("slurm", "slinky"):
            assert nodes.image_ref(image) in listed, (image, listed)
    finally:
        subprocess.run(
            ["bash", "-c", f"{ctr} -n {ns} images ls -q | xargs -r {ctr} -n {ns} images rm"],
            capture_output=True, timeout=60, check=False,
        )  # fmt: skip
