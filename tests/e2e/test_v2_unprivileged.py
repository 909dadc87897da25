"""slurmd in a user namespace of its own on a cgroup v2 node (docs/isolation.md, "What slurmd
needs on cgroup v2"): the slurm chart's `hostUsers: false` with a RuntimeClass of the v2
guests' `delegated-cgroup` handler (crun with containerd's cgroup_writable) and
`ConstrainDevices=no`. A test bed of its own (one host node, one v2 node), as
test_v2_nodes.py's, and one installation of the operator and slurm charts."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator

import pytest

from slinky.kube import rest
from slinky_testbed import guests
from slinky_testbed.bed import Testbed
from tests.e2e.test_helm import (
    CHARTS,
    FAKE_GPUS,
    HELM,
    Install,
    completed,
    ended,
    hostpath_pv,
    idle_nodes,
    image,
    submit_script,
)
from tests.e2e.test_helm import running as job_running
from tests.e2e.test_v2_nodes import (
    CPUS,
    JOB_TIMEOUT,
    POD_TIMEOUT,
    V2,
    SlurmOnV2,
    uninstall_charts,
    v2_testbed,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

RUNTIME_CLASSES = rest.Resource(
    "node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", namespaced=False
)
SLURMD_LIMITS = {"cpu": "2", "memory": "700Mi"}
# The chart's cgroup.conf but for ConstrainDevices: slurmd in a user namespace cannot load
# the eBPF program that confines devices (the chart refuses hostUsers: false without this).
CGROUP_CONF = (
    "CgroupPlugin=autodetect\nIgnoreSystemd=yes\nConstrainCores=yes\nConstrainRAMSpace=yes\n"
    "ConstrainDevices=no\n"
)


@pytest.fixture(scope="module")
def v2bed() -> Iterator[Testbed]:
    yield from v2_testbed()


@pytest.fixture(scope="module")
async def slurm(
    v2bed: Testbed, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[SlurmOnV2]:
    """A RuntimeClass of the delegated-cgroup handler, the operator and slurm charts with one
    NodeSet on the v2 node in user namespaces; all removed afterwards, whatever happened."""
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: `make testbed-build` builds it")
    kube = rest.Kube.from_kubeconfig(v2bed.kubeconfig)
    t0 = time.monotonic()
    digest = uuid.uuid4().hex[:5]
    host = v2bed.load().real_nodes[0]
    work = tmp_path_factory.mktemp("slurm-userns")
    i = Install(v2bed, kube, work, digest, f"v2u-{digest}", f"v2uop-{digest}", "", host)
    runtime_class = f"delegated-cgroup-{digest}"
    on_host = {"kubernetes.io/hostname": host}
    try:
        await kube.create(
            RUNTIME_CLASSES,
            {"metadata": {"name": runtime_class}, "handler": guests.CGROUP_WRITABLE_HANDLER},
        )
        for name in (i.slurm_ns, i.operator_ns):
            await kube.create(rest.NAMESPACES, {"metadata": {"name": name}})
        await hostpath_pv(kube, i.storage_class, work / "statesave", "ReadWriteOnce", "1Gi")
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
        values["slurmConfig"]["cgroupConf"] = CGROUP_CONF
        values["compute"] = {
            "nodesetDefaults": {"terminationGracePeriodSeconds": 30},
            "nodesets": [
                {
                    "name": "v2",
                    "replicas": 1,
                    "nodeSelector": V2,
                    "resources": {"limits": SLURMD_LIMITS},
                    "nodeConfig": "Gres=gpu:2",
                    "hostUsers": False,
                    "runtimeClassName": runtime_class,
                    "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
                }
            ],
        }
        await i.helm(
            "install", i.slurm_release, str(CHARTS / "slurm"), "-n", i.slurm_ns,
            "-f", i.values_file("slurm", values), "--wait", "--timeout", "6m",
        )  # fmt: skip
        await idle_nodes(i, "v2", 1, timeout=POD_TIMEOUT + 120)
        print(f"slurm chart on v2, user namespaces: node idle in {time.monotonic() - t0:.0f}s")
        yield SlurmOnV2(i, f"{i.nodeset('v2')}-0")
    finally:
        t1 = time.monotonic()
        await uninstall_charts(i, kube, (RUNTIME_CLASSES, runtime_class))
        await kube.close()
        print(f"slurm chart on v2, user namespaces: uninstalled in {time.monotonic() - t1:.0f}s")


async def test_slurmd_in_its_own_user_namespace_confines_memory_and_cpus_but_not_devices(
    slurm: SlurmOnV2,
) -> None:
    """No capability, root in the pod is no one on the node, the container's cgroup is the
    pod root's to manage: a --mem=64 job reading 512 MiB ends OUT_OF_MEMORY while its
    neighbour completes, slurmd never restarting; 1-CPU jobs get different CPUs; a job given
    one gpu opens both device files (ConstrainDevices=no: the price of the user namespace)."""
    i, node, t0 = slurm.install, slurm.node, time.monotonic()
    pod = await i.kube.get(rest.PODS, node, i.slurm_ns)
    assert pod["spec"]["hostUsers"] is False
    assert pod["spec"]["runtimeClassName"].startswith("delegated-cgroup-")
    slurmd = pod["spec"]["containers"][0]
    # No capability but SYS_PTRACE (job accounting reads the jobs' /proc/<pid>/io with it).
    assert slurmd["securityContext"] == {
        "seccompProfile": {"type": "RuntimeDefault"},
        "capabilities": {"add": ["SYS_PTRACE"]},
    }
    uid_map = slurm.in_slurmd("cat", "/proc/self/uid_map").split()
    print("v2 userns slurmd uid_map:", uid_map)
    assert uid_map[0] == "0" and uid_map[1] != "0" and uid_map[2] == "65536", uid_map
    # Delegated: the cgroup's own files are the pod root's, its limits the node's.
    owners = slurm.in_slurmd(
        "stat", "-c", "%n %u", "/sys/fs/cgroup/cgroup.procs", "/sys/fs/cgroup/memory.max"
    ).split()
    assert owners == ["/sys/fs/cgroup/cgroup.procs", "0", "/sys/fs/cgroup/memory.max", "65534"]
    assert "SYS_ADMIN" not in str(slurmd.get("securityContext"))

    neighbour = await submit_script(
        i, node, "neighbour",
        f"{CPUS}; dd if=/dev/zero bs=200M count=1 2>/dev/null | "
        "(while [ ! -e /tmp/hog-ended ]; do sleep 0.5; done); echo neighbour done",
        "-c1", "--mem=300", "--time=10",
    )  # fmt: skip
    await job_running(i, neighbour, timeout=JOB_TIMEOUT)
    hog = await submit_script(
        i, node, "hog", f"{CPUS}; head -c 512M /dev/zero | tail >/dev/null", "-c1", "--mem=64"
    )
    hogged = await ended(i, hog, timeout=JOB_TIMEOUT)
    assert hogged["JobState"] == "OUT_OF_MEMORY", hogged
    neighbour_cgroup = slurm.job_cgroup(slurm.in_slurmd("cat", "/tmp/neighbour.out"))
    limits = slurm.memory_max_up(neighbour_cgroup)
    print(f"v2 userns job cgroup {neighbour_cgroup}: memory.max up to the container's: {limits}")
    assert str(300 * 2**20) in limits[:-1], limits
    assert limits[-1] == str(700 * 2**20), limits
    slurm.in_slurmd("touch", "/tmp/hog-ended")
    await completed(i, neighbour, timeout=JOB_TIMEOUT)
    hog_out = slurm.in_slurmd("cat", "/tmp/hog.out").splitlines()
    neighbour_out = slurm.in_slurmd("cat", "/tmp/neighbour.out").splitlines()
    print("v2 userns hog:", hog_out, "neighbour:", neighbour_out)
    assert hog_out[0] == neighbour_out[0] == "1", (hog_out, neighbour_out)
    hog_cpu, neighbour_cpu = hog_out[1].split()[-1], neighbour_out[1].split()[-1]
    assert hog_cpu.isdigit() and neighbour_cpu.isdigit() and hog_cpu != neighbour_cpu
    assert "neighbour done" in neighbour_out, neighbour_out
    assert await slurm.restarts() == 0

    probe = "; ".join(
        f"if head -c1 {d} >/dev/null 2>&1; then echo {d} open; else echo {d} denied; fi"
        for d in FAKE_GPUS
    )
    one_gpu = await submit_script(i, node, "one-gpu", probe, "--gres=gpu:1", "--mem=64")
    await completed(i, one_gpu, timeout=JOB_TIMEOUT)
    one_gpu_out = slurm.in_slurmd("cat", "/tmp/one-gpu.out")
    print("v2 userns one gpu:", one_gpu_out.split())
    assert all(f"{d} open" in one_gpu_out for d in FAKE_GPUS), one_gpu_out
    print(f"v2 userns memory, cpus, devices: {time.monotonic() - t0:.0f}s")
