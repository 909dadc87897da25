"""The Helm charts installed for real on the test bed's real nodes, as a user installs them:
`helm install` of the CRDs, the operator, a Slurm cluster and the bridge from helm/, with the
images `make images` built. A job runs on NodeSet pods, a pod of a managed namespace is
scheduled by Slurm, `helm upgrade` rolls the slurmd pods around a running job without
re-keying anything (the keys hook keeps every key Secret), `kubectl delete pod` of a busy
slurmd pod is refused, and `helm uninstall` drains before it deletes and leaves nothing
behind but the key Secrets the hook made (not the release's).

The session's operator process is stopped meanwhile (it watches every namespace), as in
test_operator_in_pod. The chart's external metrics API stays off: the session's operator
owns the cluster's one `v1beta1.external.metrics.k8s.io` APIService (the template branches
are unit-tested). The bridge gets its own scheduler name, so the session's bridge (if any)
never touches these pods."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from slinky.bridge.labels import FINALIZER as BRIDGE_FINALIZER
from slinky.bridge.labels import SLURM_JOBID
from slinky.kube import rest
from slinky.operator.nodeset.builder import LABEL_PROTECT
from slinky.operator.resources import CLUSTERS, NODESETS
from slinky_testbed import nodes, paths, site
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for
from tests.e2e.operator_fixtures import OperatorProcess, condition
from tests.e2e.pod_events import pod_events

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
CHARTS = REPO / "helm"
HELM = paths.bin_dir() / "helm"
STATEFULSETS = rest.Resource("apps", "v1", "statefulsets", "StatefulSet")
PVS = rest.Resource("", "v1", "persistentvolumes", "PersistentVolume", namespaced=False)
SERVICE_ACCOUNTS = rest.Resource("", "v1", "serviceaccounts", "ServiceAccount")
JOBS = rest.Resource("batch", "v1", "jobs", "Job")
ROLES = rest.Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLE_BINDINGS = rest.Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
CLUSTER_ROLES = rest.Resource(
    "rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", namespaced=False
)
ADMISSION_POLICIES = rest.Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicies",
    "ValidatingAdmissionPolicy",
    namespaced=False,
)
ADMISSION_POLICY_BINDINGS = rest.Resource(
    "admissionregistration.k8s.io",
    "v1",
    "validatingadmissionpolicybindings",
    "ValidatingAdmissionPolicyBinding",
    namespaced=False,
)
SLURM_NODENAME = "slinky.slurm.net/slurm-nodename"
NODE_CONFIG = site.NODE_CONFIG
HEALTH_MARKER = "/tmp/slinky-unhealthy"
FAKE_GPUS = ("/dev/full", "/dev/random")
HEALTH_CHECK = f"""#!/bin/sh
if [ -e {HEALTH_MARKER} ]; then
  scontrol update nodename="$(hostname)" state=drain reason="health: marker file"
fi
"""


image = site.image


@dataclass
class Install:
    """One run of the three charts: releases, namespaces, and what was measured."""

    testbed: Testbed
    kube: rest.Kube
    work: Path
    digest: str
    slurm_ns: str
    operator_ns: str
    jobs_ns: str
    bridge_node: str
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def operator_release(self) -> str:
        return f"op-{self.digest}"

    @property
    def slurm_release(self) -> str:
        return f"s{self.digest}"

    @property
    def bridge_release(self) -> str:
        return f"br-{self.digest}"

    @property
    def crds_release(self) -> str:
        return f"crds-{self.digest}"

    @property
    def ctld_pod(self) -> str:
        return f"{self.slurm_release}-controller-0"

    @property
    def storage_class(self) -> str:
        return f"slurm-e2e-{self.digest}"

    def nodeset(self, name: str) -> str:
        return f"{self.slurm_release}-compute-{name}"

    async def helm(self, *args: str, timeout: float = 300) -> str:
        proc = await asyncio.create_subprocess_exec(
            str(HELM),
            f"--kubeconfig={self.testbed.kubeconfig}",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(
                f"helm {' '.join(args)} still running after {timeout:.0f}s\n" + self.diagnose()
            ) from None
        if proc.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} exited {proc.returncode}:\n{err.decode()}\n"
                + self.diagnose()
            )
        return out.decode()

    def kubectl(self, *args: str) -> str:
        out = self.testbed.kubectl(list(args), timeout=60)
        if out.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed:\n{out.stderr}")
        return out.stdout

    def ctld(self, *argv: str) -> str:
        """A Slurm command run in the slurmctld pod, as users of the chart do."""
        return self.kubectl(
            "-n", self.slurm_ns, "exec", self.ctld_pod, "-c", "slurmctld", "--", *argv
        )

    def job_fields(self, job_id: int) -> dict[str, str]:
        text = self.ctld("scontrol", "-o", "show", "job", str(job_id))
        return dict(re.findall(r"(\w+)=(\S*)", text))

    def diagnose(self) -> str:
        """Pods, events, what NodeSets say (a deletion's message names what it waits for)
        and the operator's log: what a failed or stuck helm command left behind."""
        out = []
        for args in (
            ["get", "pods", "-A", "-o", "wide"],
            ["get", "events", "-A", "--sort-by=.lastTimestamp"],
            ["get", "nodesets", "-A", "-o", "yaml"],
            [
                "logs",
                "-n",
                self.operator_ns,
                "-l",
                f"app.kubernetes.io/instance={self.operator_release}",
                "--tail=200",
            ],
        ):
            got = self.testbed.kubectl(args, timeout=30)
            out.append(got.stdout[-6000:] + got.stderr[-2000:])
        return "\n".join(out)

    def values_file(self, name: str, values: JSON) -> str:
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(values))
        return str(path)

    def slurm_values(
        self, *, batch_labels: dict[str, str] | None = None, extra: bool = True
    ) -> JSON:
        """The slurm chart's values for the test bed: slurmctld state on the test's hostPath
        PV, one NodeSet for batch jobs, one pinned to the bridge's node (its Slurm partition
        is the bridge's), and (`extra`) one more that an upgrade removes."""
        # `extra` has two GRES gpu whose device files are /dev/full and /dev/random (any
        # character device the container has will do for the cgroup device controller).
        extra_nodesets: list[JSON] = (
            [{"name": "extra", "replicas": 1, "nodeConfig": f"{NODE_CONFIG} Gres=gpu:2"}]
            if extra
            else []
        )
        extra_nodes = f"{self.nodeset('extra')}-[0-9]"
        return {
            "image": {**image("slurm"), "pullPolicy": "IfNotPresent"},
            "operator": {
                "namespace": self.operator_ns,
                "serviceAccountName": f"{self.operator_release}-slurm-operator",
            },
            "controller": {
                "persistence": {
                    "storageClassName": self.storage_class,
                    "size": "1Gi",
                    "whenDeleted": "Delete",
                },
                "terminationGracePeriodSeconds": 10,
            },
            "cleanup": {"image": image("slinky")},
            "slurmConfig": {
                "gresConf": "".join(
                    f"NodeName={extra_nodes} Name=gpu File={device}\n" for device in FAKE_GPUS
                )
            },
            "compute": {
                # A site health check that drains its node while a marker file exists.
                "healthCheck": {"script": HEALTH_CHECK, "interval": 5},
                "nodesetDefaults": {
                    "nodeConfig": NODE_CONFIG,
                    "terminationGracePeriodSeconds": 30,
                },
                "nodesets": [
                    {"name": "batch", "replicas": 1, "podLabels": batch_labels or {}},
                    {
                        "name": "bridge",
                        "replicas": 1,
                        "nodeSelector": {"kubernetes.io/hostname": self.bridge_node},
                        "partition": {"name": "slurm-bridge"},
                    },
                    *extra_nodesets,
                ],
            },
        }

    async def pods(self, namespace: str, selector: str) -> list[JSON]:
        got = await self.kube.list(rest.PODS, namespace, params={"labelSelector": selector})
        return list(got["items"])

    async def memory_mib(self, namespace: str, selector: str) -> float:
        """Resident memory of the processes in the pod's container (no metrics-server here,
        and the container sees the host's cgroup tree)."""
        pod = (await self.pods(namespace, selector))[0]["metadata"]["name"]
        script = (
            "import os\n"
            "total = 0\n"
            "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
            "    for line in open(f'/proc/{pid}/status'):\n"
            "        if line.startswith('VmRSS:'):\n"
            "            total += int(line.split()[1])\n"
            "print(total)\n"
        )
        kib = self.kubectl("-n", namespace, "exec", pod, "--", "python3", "-c", script)
        return int(kib.strip()) / 1024

    async def secret_data(self, namespace: str, name: str) -> JSON:
        return dict((await self.kube.get(rest.SECRETS, name, namespace))["data"])

    async def leftovers(self, namespace: str, release: str) -> list[str]:
        """Objects of a release (by Helm's instance label) still in a namespace."""
        left = []
        selector = f"app.kubernetes.io/instance={release}"
        for res in (
            rest.PODS, rest.SERVICES, rest.SECRETS, rest.CONFIGMAPS, rest.PVCS, STATEFULSETS,
            rest.DEPLOYMENTS, JOBS, NODESETS, CLUSTERS, ROLES, ROLE_BINDINGS, SERVICE_ACCOUNTS,
        ):  # fmt: skip
            items = (await self.kube.list(res, namespace, params={"labelSelector": selector}))[
                "items"
            ]
            left += [f"{res.kind}/{i['metadata']['name']}" for i in items]
        return left


def bridge_chart_values(i: Install) -> JSON:
    """The bridge chart's values for the test bed: its own scheduler name, the slurm
    release's slurmrestd and JWT key, the jobs namespace managed, partition slurm-bridge."""
    return site.bridge_values(
        scheduler_name=f"{i.bridge_release}-scheduler",
        restapi_url=f"http://{i.slurm_release}-restapi.{i.slurm_ns}:6820",
        jwt_key_secret=f"{i.slurm_release}-jwt-key",
        managed_namespaces=[i.jobs_ns],
        # Slurm's node here is a slurmd pod, not the bridge's EXTERNAL registration:
        # tainting the real node would evict the test bed's other pods.
        taint_nodes=False,
    )


def hello_pod() -> JSON:
    """A pod that prints its hostname and ends."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "hello"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "main",
                    "image": nodes.image_ref("slurm"),
                    "imagePullPolicy": "IfNotPresent",
                    "args": ["sh", "-c", "echo hello from $(hostname)"],
                    "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}},
                }
            ],
        },
    }


async def submit(install: Install, partition: str, seconds: int, *options: str) -> int:
    out = install.ctld(
        "sbatch",
        "--parsable",
        "-p",
        partition,
        "-N1",
        "-o",
        "/dev/null",
        *options,
        "--wrap",
        f"sleep {seconds}",
    )
    return int(out.strip().split(";")[0])


def host_cgroup2_controllers() -> list[str]:
    """The controllers of the host's cgroup2 hierarchy (unified, or the hybrid layout's)."""
    for path in ("/sys/fs/cgroup/cgroup.controllers", "/sys/fs/cgroup/unified/cgroup.controllers"):
        with contextlib.suppress(OSError):
            return Path(path).read_text().split()
    return []


async def submit_script(install: Install, node: str, name: str, script: str, *options: str) -> int:
    """A batch job on `node` writing to /tmp/<name>.out there."""
    out = install.ctld(
        "sbatch", "--parsable", "-w", node, "-J", name, "-o", f"/tmp/{name}.out", *options,
        "--wrap", script,
    )  # fmt: skip
    return int(out.strip().split(";")[0])


async def job_state(install: Install, job_id: int) -> str:
    return install.job_fields(job_id).get("JobState", "")


async def running(install: Install, job_id: int, timeout: float = 90) -> dict[str, str]:
    async def check() -> dict[str, str] | None:
        fields = install.job_fields(job_id)
        return fields if fields.get("JobState") == "RUNNING" else None

    return await wait_for(check, timeout=timeout, interval=0.5, what=f"job {job_id} RUNNING")


async def ended(install: Install, job_id: int, timeout: float = 120) -> dict[str, str]:
    """The job's fields once it ended, however."""

    async def done() -> dict[str, str] | None:
        fields = install.job_fields(job_id)
        state = fields.get("JobState", "")
        return fields if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING") else None

    return await wait_for(done, timeout=timeout, interval=0.5, what=f"job {job_id} ended")


async def completed(install: Install, job_id: int, timeout: float = 120) -> dict[str, str]:
    """The job ended COMPLETED and was never requeued."""
    fields = await ended(install, job_id, timeout)
    assert fields["JobState"] == "COMPLETED", f"job {job_id}: {fields}"
    assert fields.get("Restarts") == "0", f"job {job_id} was requeued: {fields}"
    return fields


async def idle_nodes(install: Install, partition: str, count: int, timeout: float = 180) -> None:
    """Waits for `count` idle nodes; a timeout names each node's state and reason."""
    seen = ""

    async def idle() -> bool:
        nonlocal seen
        out = install.ctld("sinfo", "-h", "-p", partition, "-N", "-o", "%N %t %E")
        seen = out.strip() or "no node"
        states = [line.split()[1] for line in out.splitlines() if line.strip()]
        return len(states) == count and all(s == "idle" for s in states)

    try:
        await wait_for(
            idle,
            timeout=timeout,
            interval=1,
            what=f"{count} idle node(s) in {partition}",
            ignore=(AssertionError,),
        )
    except AssertionError as e:
        raise AssertionError(f"{e}; sinfo: {seen}") from None


async def nothing_left(install: Install, namespace: str, release: str) -> None:
    """Pods and claims go by garbage collection after `helm uninstall --wait` returns."""

    async def empty() -> bool:
        return not await install.leftovers(namespace, release)

    try:
        await wait_for(empty, timeout=90, interval=1, what=f"{release} gone from {namespace}")
    except AssertionError:
        raise AssertionError(
            f"left behind: {await install.leftovers(namespace, release)}"
        ) from None


async def hostpath_pv(kube: rest.Kube, name: str, path: Path, mode: str, size: str) -> None:
    """A PV on a host directory (site.hostpath_pv), of its own StorageClass `name`."""
    await kube.create(PVS, site.hostpath_pv(name, path, mode, size))


@pytest.fixture
async def install(
    kube: rest.Kube, testbed: Testbed, operator: OperatorProcess, namespace: str, tmp_path: Path
) -> AsyncIterator[Install]:
    """Namespaces, the hostPath PV for slurmctld's state and the bridge node's label; the
    session operator stopped meanwhile. Everything is removed afterwards, whatever happened."""
    if not HELM.exists():
        pytest.fail(f"{HELM} is missing: `make testbed-build` builds it")
    digest = uuid.uuid4().hex[:5]
    bridge_node = testbed.load().real_nodes[-1]
    inst = Install(
        testbed,
        kube,
        tmp_path,
        digest,
        namespace,
        f"{namespace}-op",
        f"{namespace}-jobs",
        bridge_node,
    )
    for ns in (inst.operator_ns, inst.jobs_ns):
        await kube.create(rest.NAMESPACES, {"metadata": {"name": ns}})
    await hostpath_pv(kube, inst.storage_class, tmp_path / "statesave", "ReadWriteOnce", "1Gi")
    await kube.patch(
        rest.NODES,
        bridge_node,
        {"metadata": {"labels": {SLURM_NODENAME: inst.nodeset("bridge") + "-0"}}},
    )
    operator.kill()
    try:
        yield inst
    finally:
        for release, ns in (
            (inst.bridge_release, inst.slurm_ns),
            (inst.slurm_release, inst.slurm_ns),
            (inst.operator_release, inst.operator_ns),
            (inst.crds_release, inst.operator_ns),
        ):
            with contextlib.suppress(AssertionError, TimeoutError):
                await inst.helm("uninstall", release, "-n", ns, "--ignore-not-found", "--wait")
        await kube.patch(rest.NODES, bridge_node, {"metadata": {"labels": {SLURM_NODENAME: None}}})
        for ns in (inst.operator_ns, inst.jobs_ns):
            with contextlib.suppress(rest.ApiError):
                await kube.delete(rest.NAMESPACES, ns)
        with contextlib.suppress(rest.ApiError):
            await kube.delete(PVS, inst.storage_class)
        await operator.restart()
        for what, value in inst.timings.items():
            print(f"helm e2e: {what}: {value:.1f}")


async def test_helm_installs_operator_slurm_and_bridge_that_run_jobs_upgrade_and_uninstall(
    install: Install,
) -> None:
    i, kube = install, install.kube
    t0 = time.monotonic()

    # ------------------------------------------------ install: CRDs, operator, slurm, bridge
    # The session installed the CRDs with kubectl; the CRD chart adopts them, as it would
    # on a cluster upgraded from `kubectl apply -f config/crd`.
    await i.helm(
        "install",
        i.crds_release,
        str(CHARTS / "slurm-operator-crds"),
        "-n",
        i.operator_ns,
        "--take-ownership",
        "--wait",
    )
    operator_values = {
        "operator": {"image": image("slinky"), "logLevel": "debug"},
        "metricsApi": {"enabled": False},
    }
    start = time.monotonic()
    await i.helm(
        "install",
        i.operator_release,
        str(CHARTS / "slurm-operator"),
        "-n",
        i.operator_ns,
        "-f",
        i.values_file("operator", operator_values),
        "--wait",
        "--timeout",
        "4m",
    )
    i.timings["install slurm-operator (--wait: Ready)"] = time.monotonic() - start

    start = time.monotonic()
    slurm_values_path = i.values_file("slurm", i.slurm_values())
    await i.helm(
        "install",
        i.slurm_release,
        str(CHARTS / "slurm"),
        "-n",
        i.slurm_ns,
        "-f",
        slurm_values_path,
        "--wait",
        "--timeout",
        "5m",
    )
    i.timings["install slurm (--wait: slurmctld, slurmrestd Ready)"] = time.monotonic() - start

    async def cluster_ready() -> bool:
        got = await kube.get(CLUSTERS, i.slurm_release, i.slurm_ns)
        return condition(got).get("reason") == "Connected"

    await wait_for(cluster_ready, timeout=120, interval=0.5, what="Cluster Connected")
    await idle_nodes(i, "batch", 1)
    job = await submit(i, "batch", 1)
    first = await completed(i, job)
    assert first["NodeList"] == f"{i.nodeset('batch')}-0"
    i.timings["operator + slurm install to first job COMPLETED"] = time.monotonic() - t0

    bridge_values = bridge_chart_values(i)
    start = time.monotonic()
    await i.helm(
        "install",
        i.bridge_release,
        str(CHARTS / "slurm-bridge"),
        "-n",
        i.slurm_ns,
        "-f",
        i.values_file("bridge", bridge_values),
        "--wait",
        "--timeout",
        "4m",
    )
    i.timings["install slurm-bridge (--wait: Ready)"] = time.monotonic() - start
    i.timings["all three charts installed"] = time.monotonic() - t0

    # ------------------------------------------------ a pod of a managed namespace, via Slurm
    await idle_nodes(i, "slurm-bridge", 1)
    hello = hello_pod()
    await kube.create(rest.PODS, hello, i.jobs_ns)

    async def succeeded() -> JSON | None:
        pod = await kube.get(rest.PODS, "hello", i.jobs_ns)
        return pod if (pod.get("status") or {}).get("phase") == "Succeeded" else None

    pod = await wait_for(succeeded, timeout=120, interval=0.5, what="bridge pod Succeeded")
    assert pod["spec"]["schedulerName"] == f"{i.bridge_release}-scheduler"
    assert pod["spec"]["nodeName"] == i.bridge_node
    assert pod["metadata"]["annotations"]["slinky.slurm.net/slurm-node"] == (
        f"{i.nodeset('bridge')}-0"
    )
    logs = i.kubectl("-n", i.jobs_ns, "logs", "hello")
    assert logs.strip() == "hello from hello"

    # ------------------------------------------------ the site's health check drains a node
    await idle_nodes(i, "extra", 1)
    extra = f"{i.nodeset('extra')}-0"
    exec_in = ("-n", i.slurm_ns, "exec", extra, "-c", "slurmd", "--")
    i.kubectl(*exec_in, "touch", HEALTH_MARKER)

    async def drained_by_health_check() -> bool:
        return "Reason=health: marker file" in i.ctld("scontrol", "-o", "show", "node", extra)

    await wait_for(drained_by_health_check, timeout=60, interval=1, what="health check drained")
    i.kubectl(*exec_in, "rm", HEALTH_MARKER)
    i.ctld("scontrol", "update", f"nodename={extra}", "state=resume")
    await idle_nodes(i, "extra", 1)

    # ------------------------------------------------ jobs kept apart by cgroups
    # The chart's default (slurmConfig.jobIsolation: cgroup), with CAP_SYS_ADMIN added to the
    # slurmd container and nothing privileged: a job using more memory than its --mem is
    # killed alone (OUT_OF_MEMORY) while its neighbour on the same node completes; each
    # 1-CPU job sees one CPU, not the other's.
    await idle_nodes(i, "batch", 1)
    batch = f"{i.nodeset('batch')}-0"
    slurmd = (await kube.get(rest.PODS, batch, i.slurm_ns))["spec"]["containers"][0]
    # (SYS_PTRACE: slurmstepd reads the job processes' /proc/<pid>/io, for sacct's MaxRSS.)
    assert slurmd["securityContext"] == {"capabilities": {"add": ["SYS_PTRACE", "SYS_ADMIN"]}}
    # CgroupPlugin=autodetect: cgroup/v2 needs the memory controller in the host's cgroup2
    # hierarchy; on a host that binds every controller to v1 (this machine) it is cgroup/v1.
    v2 = host_cgroup2_controllers()
    slurmd_log = i.kubectl("-n", i.slurm_ns, "logs", batch, "-c", "slurmd")
    on_v1 = "cgroup/v1 plugin is deprecated" in slurmd_log
    assert on_v1 == ("memory" not in v2), (v2, slurmd_log[-3000:])
    print(f"helm e2e: slurmd runs cgroup/{'v1' if on_v1 else 'v2'}; host cgroup2 controllers: {v2}")
    cpus = "nproc; grep Cpus_allowed_list /proc/self/status"
    # The neighbour runs until the test has seen the hog's end (a file it then makes).
    neighbour = await submit_script(
        i, batch, "neighbour",
        f"{cpus}; while [ ! -e /tmp/hog-ended ]; do sleep 0.2; done; echo neighbour done",
        "-c1", "--mem=64", "--time=3",
    )  # fmt: skip
    await running(i, neighbour)
    hog = await submit_script(
        i, batch, "hog", f"{cpus}; head -c 512M /dev/zero | tail >/dev/null", "-c1", "--mem=64"
    )
    hogged = await ended(i, hog)
    assert hogged["JobState"] == "OUT_OF_MEMORY", hogged
    in_batch = ("-n", i.slurm_ns, "exec", batch, "-c", "slurmd", "--")
    i.kubectl(*in_batch, "touch", "/tmp/hog-ended")
    await completed(i, neighbour)
    hog_out = i.kubectl(*in_batch, "cat", "/tmp/hog.out").split("\n")
    neighbour_out = i.kubectl(*in_batch, "cat", "/tmp/neighbour.out").split("\n")
    assert hog_out[0] == neighbour_out[0] == "1", (hog_out, neighbour_out)
    hog_cpu, neighbour_cpu = hog_out[1].split()[-1], neighbour_out[1].split()[-1]
    assert hog_cpu.isdigit() and neighbour_cpu.isdigit() and hog_cpu != neighbour_cpu
    assert "neighbour done" in neighbour_out, neighbour_out
    pod_status = (await kube.get(rest.PODS, batch, i.slurm_ns))["status"]
    assert pod_status["containerStatuses"][0]["restartCount"] == 0

    # ------------------------------------------------ GRES devices confined per job
    # ConstrainDevices: a job given one of the node's two gpus opens that device file only
    # (and has CUDA_VISIBLE_DEVICES); a job given none opens neither.
    probe = "; ".join(
        f"if head -c1 {d} >/dev/null 2>&1; then echo {d} open; else echo {d} denied; fi"
        for d in FAKE_GPUS
    )
    probe += '; echo "visible=${CUDA_VISIBLE_DEVICES:-}"'
    one_gpu = await submit_script(i, extra, "one-gpu", probe, "--gres=gpu:1", "--mem=64")
    no_gpu = await submit_script(i, extra, "no-gpu", probe, "--mem=64")
    await completed(i, one_gpu)
    await completed(i, no_gpu)
    in_extra = ("-n", i.slurm_ns, "exec", extra, "-c", "slurmd", "--", "cat")
    one_gpu_out = i.kubectl(*in_extra, "/tmp/one-gpu.out").split()
    no_gpu_out = i.kubectl(*in_extra, "/tmp/no-gpu.out").split()
    opened = [d for d in FAKE_GPUS if f"{d} open" in " ".join(one_gpu_out)]
    assert len(opened) == 1, one_gpu_out
    assert [w for w in one_gpu_out if w.startswith("visible=") and w != "visible="], one_gpu_out
    assert all(f"{d} denied" in " ".join(no_gpu_out) for d in FAKE_GPUS), no_gpu_out

    # ------------------------------------------------ the webhook outlives one replica's end
    # Two replicas; one is deleted (as a drain or a rollout does) while pods keep being
    # created in the managed namespace: none is refused (the terminating replica serves on
    # until its endpoint left the Service).
    webhook = f"app.kubernetes.io/instance={i.bridge_release},app.kubernetes.io/component=admission"
    replicas = await i.pods(i.slurm_ns, webhook)
    assert len(replicas) == 2, [p["metadata"]["name"] for p in replicas]
    await kube.delete(rest.PODS, replicas[0]["metadata"]["name"], i.slurm_ns)
    refused: list[str] = []
    created = 0
    until = time.monotonic() + 12
    while time.monotonic() < until:
        probe = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"generateName": "webhook-probe-"},
            "spec": {"containers": [{"name": "c", "image": nodes.image_ref("slurm")}]},
        }
        try:
            await kube.request(
                "POST", rest.PODS.path(i.jobs_ns), params={"dryRun": "All"}, body=probe
            )
            created += 1
        except rest.ApiError as e:
            refused.append(str(e))
        await asyncio.sleep(0.1)  # a steady trickle of creations across the replica's end
    assert not refused, f"{len(refused)} of {created + len(refused)} refused: {refused[:3]}"

    i.timings["operator pod memory MiB"] = await i.memory_mib(
        i.operator_ns, f"app.kubernetes.io/instance={i.operator_release}"
    )
    for component in ("scheduler", "controllers", "admission"):
        i.timings[f"bridge {component} pod memory MiB"] = await i.memory_mib(
            i.slurm_ns,
            f"app.kubernetes.io/instance={i.bridge_release},app.kubernetes.io/component={component}",
        )

    # ------------------------------------------------ upgrade: roll slurmd around a running job
    keys = {
        name: await i.secret_data(i.slurm_ns, name)
        for name in (
            f"{i.slurm_release}-slurm-key",
            f"{i.slurm_release}-jwt-key",
            f"{i.bridge_release}-slurm-bridge-webhook-tls",
        )
    }
    old = await i.pods(i.slurm_ns, f"nodeset.slinky.slurm.net/name={i.nodeset('batch')}")
    ctld_before = (await i.pods(i.slurm_ns, "app.kubernetes.io/component=controller"))[0]
    job = await submit(i, "batch", 30)
    busy_pod = (await running(i, job))["NodeList"]
    # The upgrade also removes NodeSet `extra` while a job runs in its partition and one
    # waits there: its partition stays until both ran (slurm.conf does not change, so
    # slurmctld does not restart), then the NodeSet and its partition go.
    await idle_nodes(i, "extra", 1)
    extra_running = await submit(i, "extra", 15, "--exclusive")
    await running(i, extra_running)
    extra_queued = await submit(i, "extra", 1, "--exclusive")
    start = time.monotonic()
    await i.helm(
        "upgrade",
        i.slurm_release,
        str(CHARTS / "slurm"),
        "-n",
        i.slurm_ns,
        "-f",
        i.values_file("slurm2", i.slurm_values(batch_labels={"rev": "2"}, extra=False)),
        "--wait",
        "--timeout",
        "4m",
    )
    i.timings["helm upgrade slurm"] = time.monotonic() - start
    # The old pod is drained, not killed: it goes only after the job ended.
    assert await job_state(i, job) == "RUNNING"

    # Meanwhile the operator chart's policy refuses `kubectl delete pod` of it (the operator
    # labels it busy as it polls Slurm for the update); the operator's own deletion, once the
    # job ended, passes.
    async def labelled_busy() -> bool:
        pod = await kube.get(rest.PODS, busy_pod, i.slurm_ns)
        return (pod["metadata"].get("labels") or {}).get(LABEL_PROTECT) == "true"

    await wait_for(labelled_busy, timeout=75, interval=0.5, what=f"{busy_pod} labelled busy")
    refused = i.testbed.kubectl(["delete", "pod", busy_pod, "-n", i.slurm_ns], timeout=60)
    policy = f"{i.operator_release}-slurm-operator-busy-pods"
    assert refused.returncode != 0, refused.stdout
    assert f"ValidatingAdmissionPolicy '{policy}'" in refused.stderr, refused.stderr
    assert f"Slurm node {busy_pod} runs jobs" in refused.stderr, refused.stderr
    await completed(i, job)
    await completed(i, extra_running)
    await completed(i, extra_queued)

    async def extra_gone() -> bool:
        try:
            await kube.get(NODESETS, i.nodeset("extra"), i.slurm_ns)
        except rest.ApiError as e:
            if e.not_found:
                return "extra" not in i.ctld("sinfo", "-h", "-o", "%R").split()
            raise
        return False

    await wait_for(extra_gone, timeout=120, interval=1, what="NodeSet extra and its partition gone")

    async def rolled() -> list[JSON] | None:
        pods = await i.pods(i.slurm_ns, f"nodeset.slinky.slurm.net/name={i.nodeset('batch')}")
        fresh = [
            p for p in pods
            if p["metadata"]["uid"] != old[0]["metadata"]["uid"]
            and (p["metadata"].get("labels") or {}).get("rev") == "2"
        ]  # fmt: skip
        return fresh if len(pods) == 1 and fresh else None

    await wait_for(rolled, timeout=180, interval=1, what="batch slurmd pod rolled")
    i.timings["upgrade to rolled slurmd pod"] = time.monotonic() - start
    await idle_nodes(i, "batch", 1)
    await completed(i, await submit(i, "batch", 1))
    for name, data in keys.items():
        assert await i.secret_data(i.slurm_ns, name) == data, f"{name} changed on upgrade"
    ctld_after = (await i.pods(i.slurm_ns, "app.kubernetes.io/component=controller"))[0]
    assert ctld_after["metadata"]["uid"] == ctld_before["metadata"]["uid"], "slurmctld restarted"
    # The bridge still admits pods with the kept certificate after re-rendering it.
    await i.helm(
        "upgrade",
        i.bridge_release,
        str(CHARTS / "slurm-bridge"),
        "-n",
        i.slurm_ns,
        "--reuse-values",
        "--set",
        "logLevel=info",
        "--wait",
    )
    assert (
        await i.secret_data(i.slurm_ns, f"{i.bridge_release}-slurm-bridge-webhook-tls")
        == (keys[f"{i.bridge_release}-slurm-bridge-webhook-tls"])
    )

    # ------------------------------------------------ a line Slurm refuses: an Event names it
    # The reconfigure container records each outcome as an Event on the slurmctld pod: a
    # slurm.conf line Slurm's parser refuses is named with Slurm's message and slurmctld
    # goes on as it was (same pod, no restart, the line not in its files); a good change
    # after it is applied and recorded so.
    start = time.monotonic()
    ctld_pod = await kube.get(rest.PODS, i.ctld_pod, i.slurm_ns)
    restarts = {c["name"]: c["restartCount"] for c in ctld_pod["status"]["containerStatuses"]}

    async def upgrade_conf(line: str) -> None:
        await i.helm(
            "upgrade", i.slurm_release, str(CHARTS / "slurm"), "-n", i.slurm_ns,
            "--reuse-values", "--set", f"slurmConfig.extraSlurmConf={line}", "--wait",
        )  # fmt: skip

    async def events_naming(reason: str, words: str) -> list[str]:
        return [m for m in await pod_events(kube, i.slurm_ns, i.ctld_pod, reason) if words in m]

    async def event_naming(reason: str, words: str, skip: int = 0) -> str:
        """The first such Event (after the first `skip`); else what the reconfigure container
        said."""

        async def new() -> list[str]:
            return (await events_naming(reason, words))[skip:]

        try:
            messages = await wait_for(
                new,
                timeout=120,
                interval=1,
                what=f"Event {reason} naming {words!r} on the slurmctld pod",
            )
        except AssertionError as e:
            log = i.kubectl("-n", i.slurm_ns, "logs", i.ctld_pod, "-c", "reconfigure")
            raise AssertionError(f"{e}\nreconfigure container:\n{log[-4000:]}") from None
        return messages[0]

    await upgrade_conf("BogusKey=1")
    bogus = await event_naming("ConfigRefused", "unrecognized key: BogusKey")
    i.timings["slurm.conf line refused: upgrade to Event ConfigRefused"] = time.monotonic() - start
    print(f"helm e2e: ConfigRefused: {bogus}")
    assert "slurm.conf" in bogus and "slurmctld keeps its configuration" in bogus, bogus
    assert "BogusKey" not in i.ctld("cat", "/etc/slurm/slurm.conf")
    assert "is UP" in i.ctld("scontrol", "ping")
    ctld_pod = await kube.get(rest.PODS, i.ctld_pod, i.slurm_ns)
    assert ctld_pod["metadata"]["uid"] == ctld_after["metadata"]["uid"], "slurmctld restarted"
    assert {
        c["name"]: c["restartCount"] for c in ctld_pod["status"]["containerStatuses"]
    } == restarts
    applied_before = len(await events_naming("Reconfigured", "slurm.conf"))
    start_good = time.monotonic()
    await upgrade_conf("MinJobAge=301")
    good = await event_naming("Reconfigured", "slurm.conf", skip=applied_before)
    i.timings["good change after it: upgrade to Event Reconfigured"] = time.monotonic() - start_good
    print(f"helm e2e: Reconfigured: {good}")
    assert re.search(r"MinJobAge\s*=\s*301", i.ctld("scontrol", "show", "config"))
    ctld_pod = await kube.get(rest.PODS, i.ctld_pod, i.slurm_ns)
    assert ctld_pod["metadata"]["uid"] == ctld_after["metadata"]["uid"], "slurmctld restarted"
    i.timings["refused and good slurm.conf change, with their Events"] = time.monotonic() - start

    # ------------------------------------------------ a JWT key made anew is picked up
    # The key Secret deleted (a leak, a rotation): the next upgrade's keys hook makes a new
    # key; slurmctld and slurmrestd are restarted by hand as docs/upgrading.md says (pods
    # carry no checksum of a key: renders stay the same bytes). The operator re-keys from the
    # Secret and the bridge from its mounted file. A bridge pod runs through Slurm again.
    jwt_secret = f"{i.slurm_release}-jwt-key"
    await kube.delete(rest.SECRETS, jwt_secret, i.slurm_ns)
    start = time.monotonic()
    await i.helm(
        "upgrade", i.slurm_release, str(CHARTS / "slurm"), "-n", i.slurm_ns, "--reuse-values",
        "--wait", "--timeout", "5m",
    )  # fmt: skip
    assert await i.secret_data(i.slurm_ns, jwt_secret) != keys[jwt_secret]
    i.kubectl(
        "-n", i.slurm_ns, "rollout", "restart",
        f"statefulset/{i.slurm_release}-controller", f"deployment/{i.slurm_release}-restapi",
    )  # fmt: skip
    for what in (
        f"statefulset/{i.slurm_release}-controller",
        f"deployment/{i.slurm_release}-restapi",
    ):
        i.testbed.kubectl(
            ["-n", i.slurm_ns, "rollout", "status", what, "--timeout=180s"], timeout=200
        )
    ctld_rekeyed = (await i.pods(i.slurm_ns, "app.kubernetes.io/component=controller"))[0]
    assert ctld_rekeyed["metadata"]["uid"] != ctld_after["metadata"]["uid"], "slurmctld kept"
    await wait_for(cluster_ready, timeout=120, interval=0.5, what="Cluster Connected again")
    await kube.create(rest.PODS, {**hello, "metadata": {"name": "hello-rekeyed"}}, i.jobs_ns)

    async def rekeyed_pod_done() -> JSON | None:
        pod = await kube.get(rest.PODS, "hello-rekeyed", i.jobs_ns)
        return pod if (pod.get("status") or {}).get("phase") == "Succeeded" else None

    done = await wait_for(rekeyed_pod_done, timeout=300, interval=1, what="bridge pod after re-key")
    # Its placeholder job ends a moment after the pod (the bridge cancels it). The bridge is
    # uninstalled right away below: its hook waits for that cancel (before it did not, and a
    # CI run saw the job left RUNNING with no end, and the NodeSet holding it waiting).
    placeholder = int(done["metadata"]["labels"][SLURM_JOBID])
    i.timings["JWT key made anew: upgrade to a bridge pod through Slurm"] = time.monotonic() - start

    # ------------------------------------------------ uninstall: drain first, nothing left
    # What the bridge marks outside its release: its finalizer on a pod (made here by hand)
    # comes off in the uninstall hook. (Its taint does too, see the unit test: here the node
    # controller takes it off unmanaged nodes itself, so it would prove nothing.)
    held = f"held-{uuid.uuid4().hex[:6]}"
    await kube.create(
        rest.PODS,
        {
            "metadata": {"name": held, "finalizers": [BRIDGE_FINALIZER]},
            "spec": {
                # The bridge's pod, in a namespace it does not manage: no job is made for it.
                "schedulerName": f"{i.bridge_release}-scheduler",
                "containers": [{"name": "c", "image": nodes.image_ref("slinky")}],
            },
        },
        i.slurm_ns,
    )
    await i.helm("uninstall", i.bridge_release, "-n", i.slurm_ns, "--wait")

    async def placeholder_ended() -> bool:  # cancelled (COMPLETING on its slurmd a moment)
        return await job_state(i, placeholder) not in ("RUNNING", "PENDING", "COMPLETING")

    await wait_for(placeholder_ended, timeout=30, interval=0.5, what="placeholder job ended")
    left = await kube.get(rest.PODS, held, i.slurm_ns)
    assert BRIDGE_FINALIZER not in (left["metadata"].get("finalizers") or [])
    await kube.delete(rest.PODS, held, i.slurm_ns)
    job = await submit(i, "batch", 30)
    await running(i, job)
    # A NodeSet made by hand for the release's Cluster goes with it (not left orphaned).
    chart_made = await kube.get(NODESETS, i.nodeset("batch"), i.slurm_ns)
    by_hand = {
        "apiVersion": "slinky.slurm.net/v1alpha1",
        "kind": "NodeSet",
        "metadata": {"name": "by-hand"},
        "spec": {
            "clusterName": chart_made["spec"]["clusterName"],
            "replicas": 0,
            "selector": {"matchLabels": {"app": "by-hand"}},
            "template": {
                "metadata": {"labels": {"app": "by-hand"}},
                "spec": {"containers": [{"name": "slurmd", "image": nodes.image_ref("slurm")}]},
            },
        },
    }
    await kube.create(NODESETS, by_hand, i.slurm_ns)
    start = time.monotonic()
    uninstall = asyncio.create_task(
        i.helm(
            "uninstall", i.slurm_release, "-n", i.slurm_ns, "--wait", "--timeout", "5m", timeout=330
        )
    )

    # While the job runs, its NodeSet waits (deleting) and slurmctld is still there.
    async def draining() -> bool:
        got = await kube.get(NODESETS, i.nodeset("batch"), i.slurm_ns)
        return bool(got["metadata"].get("deletionTimestamp"))

    await wait_for(draining, timeout=60, interval=0.5, what="NodeSet being deleted")
    assert await job_state(i, job) == "RUNNING"
    await completed(i, job)
    await uninstall
    i.timings["helm uninstall slurm (a 30 s job running)"] = time.monotonic() - start
    left = [n["metadata"]["name"] for n in (await kube.list(NODESETS, i.slurm_ns))["items"]]
    assert left == [], left
    await nothing_left(i, i.slurm_ns, i.slurm_release)
    await nothing_left(i, i.slurm_ns, i.bridge_release)
    released = await i.kube.get(PVS, i.storage_class)
    assert released["status"]["phase"] == "Released"  # the claim went with the StatefulSet

    # A namespace of Slinky objects deleted right before the operator is uninstalled: the
    # uninstall hook waits while the operator takes its finalizer off, so the namespace
    # does not stay Terminating for good.
    doomed = f"doomed-{uuid.uuid4().hex[:6]}"
    await kube.create(rest.NAMESPACES, {"metadata": {"name": doomed}})
    await kube.create(NODESETS, {**by_hand, "metadata": {"name": "left"}}, doomed)

    async def finalized() -> bool:
        got = await kube.get(NODESETS, "left", doomed)
        return bool(got["metadata"].get("finalizers"))

    await wait_for(finalized, timeout=60, what="the operator's finalizer on the NodeSet")
    await kube.delete(rest.NAMESPACES, doomed)
    await i.helm("uninstall", i.operator_release, "-n", i.operator_ns, "--wait")
    await nothing_left(i, i.operator_ns, i.operator_release)

    async def released() -> bool:
        # What the operator owns: its finalizer released, the NodeSet gone with the
        # namespace's content. (The namespace itself may then wait a while longer: the
        # namespace controller's discovery can fail for a moment on the operator's
        # external metrics APIService being removed at the same time; Kubernetes retries.)
        return not (await kube.list(NODESETS, doomed))["items"]

    await wait_for(released, timeout=120, what=f"NodeSet of namespace {doomed} finalized")
    mine = (i.operator_release, i.bridge_release)
    for res in (CLUSTER_ROLES, ADMISSION_POLICIES, ADMISSION_POLICY_BINDINGS):
        names = [o["metadata"]["name"] for o in (await kube.list(res))["items"]]
        assert not [n for n in names if n.startswith(mine)], f"{res.kind} left: {names}"
