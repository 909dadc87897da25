"""A cgroup v2 Kubernetes node of the test bed: a QEMU guest (slinky_testbed.guests) running its
own kernel with the unified hierarchy, containerd, runc, the bridge CNI, a kubelet with its
cgroup defaults and kube-proxy, beside a real node on the host. A test bed of its own (one
host node, one v2 node), shared by this module's tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from slinky.kube import rest
from slinky_testbed import guests, nodes, procs
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for
from tests.e2e.test_helm import (
    CHARTS,
    FAKE_GPUS,
    HELM,
    PVS,
    Install,
    completed,
    ended,
    hostpath_pv,
    idle_nodes,
    image,
    submit_script,
)
from tests.e2e.test_helm import (
    running as job_running,
)
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


def v2_testbed() -> Iterator[Testbed]:
    """A test bed of one host node and one v2 node, up for the caller's module."""
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
def v2bed() -> Iterator[Testbed]:
    yield from v2_testbed()


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


# ---------------------------------------------------------------- the slurm chart on the v2 node
# Isolation of Slurm jobs inside a slurmd pod on cgroup v2, with the chart's defaults
# (slurmConfig.jobIsolation: cgroup, slurmd given CAP_SYS_ADMIN, not privileged): one
# installation of the operator and slurm charts, slurmctld on the host node, one NodeSet pinned
# to the v2 node with two fake GRES gpu (test_helm's device files) and Guaranteed limits.
# Slurm's own node is the pod's size: CPUs=2, RealMemory= the limit less 128 MiB.
SLURMD_LIMITS = {"cpu": "2", "memory": "700Mi"}
SLURMD_MEMORY_MAX = 700 * 2**20
# On the guest a job takes seconds to start and end.
JOB_TIMEOUT = 300.0
CPUS = "nproc; grep Cpus_allowed_list /proc/self/status; cat /proc/self/cgroup"
# Forks sleeping children until a fork is refused (or 5000 run), then ends them all.
FORK_BOMB = r"""perl -e '
my @kids;
while (@kids < 5000) {
    my $pid = fork;
    if (!defined $pid) { print "fork refused after ", scalar(@kids), ": $!\n"; last }
    if ($pid == 0) { sleep 600; exit 0 }
    push @kids, $pid;
}
print "children ", scalar(@kids), "\n";
kill "KILL", @kids;
waitpid($_, 0) for @kids;
'"""


@dataclass
class SlurmOnV2:
    install: Install
    node: str  # the Slurm node (the NodeSet's pod) on v2-0

    def in_slurmd(self, *argv: str) -> str:
        return self.install.kubectl(
            "-n", self.install.slurm_ns, "exec", self.node, "-c", "slurmd", "--", *argv
        )

    async def restarts(self) -> int:
        pod = await self.install.kube.get(rest.PODS, self.node, self.install.slurm_ns)
        return int(pod["status"]["containerStatuses"][0]["restartCount"])

    def job_cgroup(self, out: str | list[str]) -> str:
        """The job's cgroup from its `cat /proc/self/cgroup` line (cgroup v2: one `0::` line,
        a path below the container's cgroup namespace root)."""
        out_lines = out.splitlines() if isinstance(out, str) else out
        lines = [ln for ln in out_lines if ln.startswith("0::")]
        assert len(lines) == 1, out_lines
        return lines[0].removeprefix("0::")

    def memory_max_up(self, cgroup: str) -> list[str]:
        """memory.max of the job's cgroup and each of its ancestors up to the container's."""
        parts = cgroup.strip("/").split("/")
        paths = ["/sys/fs/cgroup/" + "/".join(parts[:n]) for n in range(len(parts), -1, -1)]
        script = "for d in " + " ".join(paths) + "; do cat $d/memory.max; done"
        return self.in_slurmd("sh", "-c", script).split()


def pod_memory_bytes(bed: Testbed, namespace: str, pod: str) -> int:
    """The pod's memory working set as the kubelet's stats summary (its cgroup v2 accounting)
    says."""
    out = bed.kubectl(["get", "--raw", "/api/v1/nodes/v2-0/proxy/stats/summary"])
    assert out.returncode == 0, out.stderr
    for entry in json.loads(out.stdout)["pods"]:
        if (entry["podRef"]["namespace"], entry["podRef"]["name"]) == (namespace, pod):
            return int(entry["memory"]["workingSetBytes"])
    raise AssertionError(f"no stats of pod {namespace}/{pod} on v2-0")


@pytest.fixture(scope="class")
async def slurm(
    kube: rest.Kube, v2bed: Testbed, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[SlurmOnV2]:
    """CRDs, operator and slurm charts installed, the NodeSet's one node idle; all removed
    afterwards, whatever happened."""
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: `make testbed-build` builds it")
    t0 = time.monotonic()
    digest = uuid.uuid4().hex[:5]
    host = v2bed.load().real_nodes[0]
    work = tmp_path_factory.mktemp("slurm-v2")
    i = Install(v2bed, kube, work, digest, f"v2s-{digest}", f"v2op-{digest}", "", host)
    for name in (i.slurm_ns, i.operator_ns):
        await kube.create(rest.NAMESPACES, {"metadata": {"name": name}})
    await hostpath_pv(kube, i.storage_class, work / "statesave", "ReadWriteOnce", "1Gi")
    on_host = {"kubernetes.io/hostname": host}
    try:
        await i.helm(
            "install", i.crds_release, str(CHARTS / "slurm-operator-crds"),
            "-n", i.operator_ns, "--wait",
        )  # fmt: skip
        operator_values = {
            "operator": {"image": image("slinky"), "nodeSelector": on_host},
            "metricsApi": {"enabled": False},
        }
        await i.helm(
            "install", i.operator_release, str(CHARTS / "slurm-operator"),
            "-n", i.operator_ns, "-f", i.values_file("operator", operator_values),
            "--wait", "--timeout", "4m",
        )  # fmt: skip
        values = i.slurm_values(extra=False)
        values["controller"]["nodeSelector"] = on_host
        values["restapi"] = {"nodeSelector": on_host}
        node_names = f"{i.nodeset('v2')}-[0-9]"
        values["slurmConfig"]["gresConf"] = "".join(
            f"NodeName={node_names} Name=gpu File={device}\n" for device in FAKE_GPUS
        )
        values["compute"] = {
            "nodesetDefaults": {"terminationGracePeriodSeconds": 30},
            "nodesets": [
                {
                    "name": "v2",
                    "replicas": 1,
                    "nodeSelector": V2,
                    "resources": {"limits": SLURMD_LIMITS},
                    "nodeConfig": "Gres=gpu:2",
                }
            ],
        }
        await i.helm(
            "install", i.slurm_release, str(CHARTS / "slurm"), "-n", i.slurm_ns,
            "-f", i.values_file("slurm", values), "--wait", "--timeout", "6m",
        )  # fmt: skip
        await idle_nodes(i, "v2", 1, timeout=POD_TIMEOUT + 120)
        print(f"slurm chart on v2: installed, node idle in {time.monotonic() - t0:.0f}s")
        yield SlurmOnV2(i, f"{i.nodeset('v2')}-0")
    finally:
        t1 = time.monotonic()
        await uninstall_charts(i, kube)
        print(f"slurm chart on v2: uninstalled in {time.monotonic() - t1:.0f}s")


async def uninstall_charts(i: Install, kube: rest.Kube, *more: tuple[Any, str]) -> None:
    """Take an installation's releases, namespaces and volume off the v2 bed, and the
    cluster-wide objects `more` ((resource, name)); what is already gone is no error."""
    for release, namespace in (
        (i.slurm_release, i.slurm_ns),
        (i.operator_release, i.operator_ns),
        (i.crds_release, i.operator_ns),
    ):
        with contextlib.suppress(AssertionError, TimeoutError):
            await i.helm("uninstall", release, "-n", namespace, "--ignore-not-found",
                         "--wait", timeout=600)  # fmt: skip
    for name in (i.slurm_ns, i.operator_ns):
        with contextlib.suppress(rest.ApiError):
            await kube.delete(rest.NAMESPACES, name)
    for resource, name in ((PVS, i.storage_class), *more):
        with contextlib.suppress(rest.ApiError):
            await kube.delete(resource, name)


def kubelet_config(bed: Testbed) -> JSON:
    """The v2 node's kubelet configuration as it runs (configz)."""
    out = bed.kubectl(["get", "--raw", "/api/v1/nodes/v2-0/proxy/configz"])
    assert out.returncode == 0, out.stderr
    return dict(json.loads(out.stdout)["kubeletconfig"])


class TestSlurmChartOnV2:
    """Share `slurm`, one installation (class-scoped: it is gone before the module's last
    test)."""

    async def test_cgroup_v2_memory_and_cpus_kept_apart_within_the_pods_limits(
        self, slurm: SlurmOnV2, v2bed: Testbed
    ) -> None:
        """autodetect runs cgroup/v2; a --mem=64 job reading 512 MiB ends OUT_OF_MEMORY while
        its neighbour (holding 200 MiB) completes, slurmd never restarting; each 1-CPU job sees
        one CPU, not the other's; the jobs' cgroups are below the container's, whose limits
        are the pod's, and the kubelet's accounting of the pod counts the jobs' memory."""
        i, node, t0 = slurm.install, slurm.node, time.monotonic()
        slurmd = (await i.kube.get(rest.PODS, node, i.slurm_ns))["spec"]["containers"][0]
        assert slurmd["securityContext"]["capabilities"]["add"] == ["SYS_PTRACE", "SYS_ADMIN"]
        assert not slurmd["securityContext"].get("privileged")
        slurmd_log = i.kubectl("-n", i.slurm_ns, "logs", node, "-c", "slurmd")
        assert "cgroup/v1" not in slurmd_log, slurmd_log[-3000:]
        assert slurm.in_slurmd("stat", "-fc", "%T", "/sys/fs/cgroup").strip() == "cgroup2fs"
        assert int(slurm.in_slurmd("cat", "/sys/fs/cgroup/memory.max")) == SLURMD_MEMORY_MAX
        assert slurm.in_slurmd("cat", "/sys/fs/cgroup/cpu.max").split() == ["200000", "100000"]
        # The neighbour holds 200 MiB (dd's buffer, blocked on a pipe nobody reads) until the
        # test has seen the hog's end and made /tmp/hog-ended.
        neighbour = await submit_script(
            i, node, "neighbour",
            f"{CPUS}; dd if=/dev/zero bs=200M count=1 2>/dev/null | "
            "(while [ ! -e /tmp/hog-ended ]; do sleep 0.5; done); echo neighbour done",
            "-c1", "--mem=300", "--time=10",
        )  # fmt: skip
        await job_running(i, neighbour, timeout=JOB_TIMEOUT)

        def neighbour_holds() -> int | None:
            used = pod_memory_bytes(v2bed, i.slurm_ns, node)
            return used if used >= 200 * 2**20 else None

        used = await wait_for(neighbour_holds, timeout=JOB_TIMEOUT, interval=2,
                              what="the pod's working set (kubelet) >= 200 MiB")  # fmt: skip
        # The running neighbour's cgroup is below the container's: its memory.max is its
        # --mem, the container's the pod's limit.
        neighbour_cgroup = slurm.job_cgroup(slurm.in_slurmd("cat", "/tmp/neighbour.out"))
        limits = slurm.memory_max_up(neighbour_cgroup)
        print(f"v2 job cgroup {neighbour_cgroup}: memory.max up to the container's: {limits}")
        assert str(300 * 2**20) in limits[:-1], limits
        assert limits[-1] == str(SLURMD_MEMORY_MAX), limits
        hog = await submit_script(
            i, node, "hog", f"{CPUS}; head -c 512M /dev/zero | tail >/dev/null", "-c1", "--mem=64"
        )
        hogged = await ended(i, hog, timeout=JOB_TIMEOUT)
        assert hogged["JobState"] == "OUT_OF_MEMORY", hogged
        container_memory = int(slurm.in_slurmd("cat", "/sys/fs/cgroup/memory.current"))
        slurm.in_slurmd("touch", "/tmp/hog-ended")
        await completed(i, neighbour, timeout=JOB_TIMEOUT)
        hog_out = slurm.in_slurmd("cat", "/tmp/hog.out").splitlines()
        neighbour_out = slurm.in_slurmd("cat", "/tmp/neighbour.out").splitlines()
        print("v2 hog:", hog_out, "neighbour:", neighbour_out)
        print(f"v2 pod working set (kubelet) {used / 2**20:.0f} MiB with the neighbour's 200; "
              f"container memory.current {container_memory / 2**20:.0f} MiB")  # fmt: skip
        assert hog_out[0] == neighbour_out[0] == "1", (hog_out, neighbour_out)
        hog_cpu, neighbour_cpu = hog_out[1].split()[-1], neighbour_out[1].split()[-1]
        assert hog_cpu.isdigit() and neighbour_cpu.isdigit() and hog_cpu != neighbour_cpu
        assert "neighbour done" in neighbour_out, neighbour_out
        assert await slurm.restarts() == 0
        # Each job's cgroup is its own (Slurm 26.05 names them opaquely).
        assert slurm.job_cgroup(hog_out) != neighbour_cgroup
        print(f"v2 memory and cpus: {time.monotonic() - t0:.0f}s")

    async def test_gres_devices_confined_per_job_by_ebpf(self, slurm: SlurmOnV2) -> None:
        """A job given one of the node's two gpus opens that device only; one given none opens
        neither (cgroup v2 has no devices files: Slurm attaches an eBPF program)."""
        i, node, t0 = slurm.install, slurm.node, time.monotonic()
        probe = "; ".join(
            f"if head -c1 {d} >/dev/null 2>&1; then echo {d} open; else echo {d} denied; fi"
            for d in FAKE_GPUS
        )
        probe += '; echo "visible=${CUDA_VISIBLE_DEVICES:-}"'
        one_gpu = await submit_script(i, node, "one-gpu", probe, "--gres=gpu:1", "--mem=64")
        no_gpu = await submit_script(i, node, "no-gpu", probe, "--mem=64")
        await completed(i, one_gpu, timeout=JOB_TIMEOUT)
        await completed(i, no_gpu, timeout=JOB_TIMEOUT)
        one_gpu_out = slurm.in_slurmd("cat", "/tmp/one-gpu.out")
        no_gpu_out = slurm.in_slurmd("cat", "/tmp/no-gpu.out")
        print("v2 one gpu:", one_gpu_out.split(), "none:", no_gpu_out.split())
        assert [d for d in FAKE_GPUS if f"{d} open" in one_gpu_out] in ([d] for d in FAKE_GPUS)
        assert "visible=\n" not in one_gpu_out, one_gpu_out
        assert all(f"{d} denied" in no_gpu_out for d in FAKE_GPUS), no_gpu_out
        # Both devices open to slurmd itself: the denial is the job's cgroup's.
        # (Bytes thrown away: one from /dev/random is not text half the time.)
        slurm.in_slurmd("sh", "-c", f"head -c1 {' '.join(FAKE_GPUS)} >/dev/null")
        print(f"v2 devices: {time.monotonic() - t0:.0f}s")

    async def test_the_pods_pids_limit_bounds_a_fork_bomb_job(self, slurm: SlurmOnV2) -> None:
        """Slurm 26.05 has no per-job pids limit (cgroup.conf has no such key): the pod's
        (the kubelet's podPidsLimit) binds slurmd and all its jobs. A job forking without end
        is refused a fork below that limit and ends; slurmd goes on and runs the next job."""
        i, node, t0 = slurm.install, slurm.node, time.monotonic()
        # The container's pids.max is "max": the limit is on the pod's cgroup, its parent.
        assert kubelet_config(slurm.install.testbed)["podPidsLimit"] == guests.POD_PIDS_LIMIT
        bomb = await submit_script(i, node, "bomb", FORK_BOMB, "--mem=200")
        await completed(i, bomb, timeout=JOB_TIMEOUT)
        out = slurm.in_slurmd("cat", "/tmp/bomb.out")
        print("v2 fork bomb:", out.strip().splitlines())
        refused = re.search(r"fork refused after (\d+)", out)
        assert refused and int(refused.group(1)) < guests.POD_PIDS_LIMIT, out
        after = await submit_script(i, node, "after", "echo after", "--mem=64")
        await completed(i, after, timeout=JOB_TIMEOUT)
        assert await slurm.restarts() == 0
        print(f"v2 pids: {time.monotonic() - t0:.0f}s")


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
