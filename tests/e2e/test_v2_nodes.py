"""A cgroup v2 Kubernetes node of the test bed: a QEMU guest (slinky_testbed.guests) running its
own kernel with the unified hierarchy, containerd, runc, the bridge CNI, a kubelet with its
cgroup defaults and kube-proxy, beside a real node on the host. A test bed of its own (one
host node, one v2 node), shared by this module's tests."""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from slinky.kube import rest
from slinky_testbed import guests, nodes, procs
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for
from tests.e2e.test_real_nodes import SERVER, container_pod, exit_code, finished, running
from tests.e2e.workers import worker_bed_dir

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

JSON = dict[str, Any]
NODES = rest.Resource("", "v1", "nodes", "Node", namespaced=False)
SERVICE_ACCOUNTS = rest.Resource("", "v1", "serviceaccounts", "ServiceAccount")
V2 = {guests.CGROUP_LABEL: guests.CGROUP_LABEL_VALUE}
# Everything on the guest runs ~14x slower than on the host (fork+exec ~46x).
POD_TIMEOUT = 240.0
LIMIT = 100 * 2**20

# GET each URL (retrying while the Service's rules reach kube-proxy) or connect to each
# host:port; print one line per target. Any HTTP answer counts as reached.
REACH = """
import socket, sys, time, urllib.error, urllib.request
for target in sys.argv[1:]:
    for attempt in range(120):
        try:
            if target.startswith("http"):
                try:
                    print(urllib.request.urlopen(target, timeout=3).read().decode())
                except urllib.error.HTTPError as e:
                    print(f"{target}: HTTP {e.code}")
            else:
                host, port = target.rsplit(":", 1)
                socket.create_connection((host, int(port)), timeout=3).close()
                print(f"{target}: connected")
            break
        except OSError as e:
            err = e; time.sleep(0.5)
    else:
        sys.exit(f"{target}: {err}")
"""


@pytest.fixture(scope="module")
def v2bed() -> Iterator[Testbed]:
    bed = Testbed(worker_bed_dir("SLINKY_V2_TESTBED_DIR", "v2"))
    if bed.status_lines(only_running=True):
        bed.down(log=print)
    t0 = time.monotonic()
    bed.up(real_nodes=1, v2_nodes=1, log=print)
    print(f"test bed with a v2 node up in {time.monotonic() - t0:.0f}s")
    try:
        yield bed
    finally:
        bed.down(log=print)


@pytest.fixture(scope="module")
async def kube(v2bed: Testbed) -> AsyncIterator[rest.Kube]:
    client = rest.Kube.from_kubeconfig(v2bed.kubeconfig)
    yield client
    await client.close()


@pytest.fixture
async def ns(kube: rest.Kube) -> AsyncIterator[str]:
    name = f"v2-{uuid.uuid4().hex[:8]}"
    await kube.create(
        rest.NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    )
    await wait_for(
        lambda: kube.get(SERVICE_ACCOUNTS, "default", name),
        timeout=90,
        what=f"ServiceAccount default in {name}",
        ignore=(rest.ApiError,),
    )
    yield name
    await kube.delete(rest.NAMESPACES, name)


def on_v2(pod: JSON) -> JSON:
    pod["spec"]["nodeSelector"] = V2
    return pod


async def test_the_v2_node_is_ready_on_its_own_kernel_with_its_address(
    kube: rest.Kube, v2bed: Testbed
) -> None:
    state = v2bed.load()
    assert state.v2_nodes == ["v2-0"]
    node = await kube.get(NODES, "v2-0")
    conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
    assert conditions["Ready"] == "True"
    assert node["metadata"]["labels"][guests.CGROUP_LABEL] == "v2"
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == guests.GuestNet(state.node_octet, 0).ip
    assert node["status"]["nodeInfo"]["kernelVersion"] != os.uname().release


async def test_a_pod_on_the_v2_node_gets_cgroup_v2_and_its_memory_limit_is_enforced(
    kube: rest.Kube, v2bed: Testbed, ns: str
) -> None:
    probe = on_v2(
        container_pod(
            "probe",
            "slurm",
            [
                "sh",
                "-c",
                "stat -fc %T /sys/fs/cgroup; cat /sys/fs/cgroup/cgroup.controllers; "
                "cat /sys/fs/cgroup/memory.max; exec sleep 600",
            ],
        )
    )
    probe["spec"]["containers"][0]["resources"] = {"limits": {"memory": "100Mi", "cpu": "500m"}}
    await kube.create(rest.PODS, probe, ns)
    await running(kube, "probe", ns, timeout=POD_TIMEOUT)

    def three_lines() -> list[str] | None:  # the container's output may reach its log late
        logs = v2bed.kubectl(["-n", ns, "logs", "probe"])
        assert logs.returncode == 0, logs.stderr
        lines = logs.stdout.splitlines()
        return lines if len(lines) >= 3 else None

    lines = await wait_for(three_lines, timeout=60, interval=1, what="the probe's 3 lines")
    fs_type, controllers, memory_max = lines[:3]
    assert fs_type == "cgroup2fs"
    assert "memory" in controllers.split()
    assert int(memory_max) == LIMIT
    out = v2bed.kubectl(
        ["-n", ns, "exec", "probe", "--", "sh", "-c", "hostname; cat /sys/fs/cgroup/memory.max"]
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["probe", str(LIMIT)]

    # More than its limit: the kernel's v2 memory controller kills it, the kubelet says so.
    hog = on_v2(container_pod("hog", "slinky", ["python3", "-c", "x = bytearray(300 * 2**20)"]))
    hog["spec"]["containers"][0]["resources"] = {"limits": {"memory": "100Mi"}}
    await kube.create(rest.PODS, hog, ns)
    pod = await finished(kube, "hog", ns, timeout=POD_TIMEOUT)
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (terminated["reason"], terminated["exitCode"]) == ("OOMKilled", 137)


async def test_pods_on_the_v2_node_and_on_the_host_reach_each_other_services_and_slurm(
    kube: rest.Kube, v2bed: Testbed, ns: str
) -> None:
    host_node = v2bed.load().real_nodes[0]
    servers = {"web": {"nodeName": host_node}, "web-v2": {"nodeSelector": V2}}
    for name, where in servers.items():
        server = container_pod(name, "slinky", ["python3", "-c", SERVER], **where)
        server["spec"]["containers"][0]["env"] = [
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
        ]
        await kube.create(rest.PODS, server, ns)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    await kube.create(rest.SERVICES, service, ns)
    web = await running(kube, "web", ns)
    web_v2 = await running(kube, "web-v2", ns, timeout=POD_TIMEOUT)
    assert web_v2["spec"]["nodeName"] == "v2-0"

    # From the guest: a host node's pod by address, a Service by name (DNS), Slurm on the host.
    targets = [
        f"http://{web['status']['podIP']}:8080/",
        "http://web/",
        v2bed.slurmctld_addr,
        v2bed.slurm_rest_url_for_pods + "/openapi/v3",
    ]
    client = on_v2(container_pod("from-v2", "slinky", ["python3", "-c", REACH, *targets]))
    await kube.create(rest.PODS, client, ns)
    pod = await finished(kube, "from-v2", ns, timeout=POD_TIMEOUT)
    logs = v2bed.kubectl(["-n", ns, "logs", "from-v2"]).stdout
    assert exit_code(pod) == 0, logs
    lines = logs.splitlines()
    assert lines[:2] == [f"served by web on {host_node}"] * 2, logs
    assert lines[2] == f"{v2bed.slurmctld_addr}: connected"

    # To the guest: from a host node's pod and from the host itself, by the pod's address.
    url = f"http://{web_v2['status']['podIP']}:8080/"
    back = container_pod("to-v2", "slinky", ["python3", "-c", REACH, url], nodeName=host_node)
    await kube.create(rest.PODS, back, ns)
    pod = await finished(kube, "to-v2", ns)
    logs = v2bed.kubectl(["-n", ns, "logs", "to-v2"]).stdout
    assert exit_code(pod) == 0, logs
    assert logs.strip() == "served by web-v2 on v2-0"
    assert await asyncio.to_thread(get, url) == "served by web-v2 on v2-0"


async def test_a_killed_runs_guest_is_found_by_pid_in_the_beds_cgroup(
    kube: rest.Kube, v2bed: Testbed
) -> None:
    """Last in this module: the run that started the guest is gone without `down`; the
    clean-up every `up` begins with finds QEMU by PID in the test bed's system cgroup and
    leaves nothing of the node (tap and routes go with the namespace)."""
    state = v2bed.load()
    qemu = procs.Proc(*state.pids["qemu-v2-0"])
    assert qemu.alive()
    status = Path(f"/proc/{qemu.pid}/status").read_text()
    print("QEMU of v2-0:", *(ln for ln in status.splitlines() if ln.startswith(("VmHWM", "VmRSS"))))

    async def no_pods() -> bool:  # the earlier tests' namespaces are deleted
        pods = await kube.list(rest.PODS, params={"fieldSelector": "spec.nodeName=v2-0"})
        return not pods["items"]

    await wait_for(no_pods, timeout=120, interval=1, what="no pod left on v2-0")
    nodes.cleanup(v2bed.names(state), v2bed.nodes_dir, log=print)
    assert not qemu.alive()
    assert nodes.leftovers(v2bed.names(state), v2bed.nodes_dir) == []


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())
