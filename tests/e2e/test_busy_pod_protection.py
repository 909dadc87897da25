"""A slurmd pod whose Slurm node runs jobs is not deleted by accident. The policy of
config/policy/ (applied as a user does, `kubectl apply -f config/policy/`) refuses a plain
DELETE of a pod the operator labelled pod-protect; the NodeSet's PodDisruptionBudget refuses
its eviction (`kubectl drain`), which never reaches the policy. Commands run as a user types
them (kubectl); real apiserver, real Slurm, real slurmd.

Jobs here wait for a file in the slurmd container that the test creates (`kubectl exec`),
so a job runs exactly as long as the test needs it busy."""

from __future__ import annotations

import asyncio
import subprocess
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from slinky.kube import rest
from slinky.operator.nodeset.builder import LABEL_NODESET, LABEL_PROTECT
from slinky.operator.nodeset.sync import ANNOTATION_SKIP_DRAIN
from slinky.operator.resources import NODESETS
from slinky_testbed import paths
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for
from tests.e2e.nodeset_fixtures import Env, nodeset_manifest, wait_idle_nodes
from tests.e2e.operator_fixtures import OPERATOR_SA

pytestmark = pytest.mark.e2e

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
POLICY_DIR = REPO / "config" / "policy"
POLICY = "slurm-operator-busy-pods"
# A job starting is labelled at the operator's next idle poll (--slurm-idle-poll-interval, 5 s
# for the session's operator).
LABELLED_WITHIN_S = 30


async def kubectl(testbed: Testbed, *args: str) -> subprocess.CompletedProcess[str]:
    """kubectl as cluster admin, as a user runs it."""
    return await asyncio.to_thread(testbed.kubectl, list(args))


def refused_by_policy(out: subprocess.CompletedProcess[str]) -> bool:
    return out.returncode != 0 and f"ValidatingAdmissionPolicy '{POLICY}'" in out.stderr


def labelled_pod(name: str, **metadata: Any) -> JSON:
    """A pod the operator would call busy, never scheduled (no node matches): what the policy
    sees, without Slurm."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {LABEL_PROTECT: "true"}, **metadata},
        "spec": {
            "nodeSelector": {"e2e.slinky.slurm.net/nowhere": "true"},
            "containers": [{"name": "c", "image": "localhost/none:0"}],
        },
    }


async def pod_or_none(kube: rest.Kube, namespace: str, name: str) -> JSON | None:
    try:
        return await kube.get(rest.PODS, name, namespace)
    except rest.ApiError as e:
        if e.not_found:
            return None
        raise


async def wait_gone(kube: rest.Kube, pod: JSON, timeout: float = 60) -> None:
    """That pod (by uid) is gone; its NodeSet may have made a new one of the same name."""
    meta = pod["metadata"]

    async def gone() -> bool:
        now = await pod_or_none(kube, meta["namespace"], meta["name"])
        return now is None or now["metadata"]["uid"] != meta["uid"]

    what = f"pod {meta['namespace']}/{meta['name']} gone"
    await wait_for(gone, timeout=timeout, interval=0.3, what=what)


@pytest.fixture(scope="module")
async def busy_pod_policy(kube: rest.Kube, testbed: Testbed) -> AsyncIterator[None]:
    """config/policy/ applied with kubectl and in effect (a server-side dry-run DELETE of a
    labelled probe pod is refused); removed again afterwards, so other modules' tests run
    without it."""
    probe_ns = f"t-busy-pod-policy-{uuid.uuid4().hex[:6]}"
    await kube.create(rest.NAMESPACES, {"metadata": {"name": probe_ns}})
    await kube.create(rest.PODS, labelled_pod("probe"), probe_ns)
    applied = await kubectl(testbed, "apply", "-f", str(POLICY_DIR))
    assert applied.returncode == 0, applied.stderr

    async def probe_refused() -> bool:
        out = await kubectl(testbed, "delete", "pod", "probe", "-n", probe_ns, "--dry-run=server")
        return refused_by_policy(out)

    try:
        await wait_for(probe_refused, timeout=30, interval=0.5, what=f"policy {POLICY} in effect")
        yield
    finally:
        await kubectl(testbed, "delete", "-f", str(POLICY_DIR), "--ignore-not-found")

        async def probe_allowed() -> bool:
            return not await probe_refused()

        await wait_for(probe_allowed, timeout=30, interval=0.5, what=f"policy {POLICY} gone")
        await kube.delete(rest.NAMESPACES, probe_ns)


# ------------------------------------------------------------ the policy alone (no Slurm)


async def test_the_operator_a_terminating_pod_and_a_deleted_namespace_pass_the_policy(
    kube: rest.Kube, testbed: Testbed, namespace: str, busy_pod_policy: None
) -> None:
    await kube.create(rest.PODS, labelled_pod("busy"), namespace)
    plain = await kubectl(testbed, "delete", "pod", "busy", "-n", namespace, "--dry-run=server")
    assert refused_by_policy(plain), plain.stderr
    # Impersonated with system:masters, so that only the username differs from the admin's.
    as_operator = ["--dry-run=server", "--as-group=system:masters", f"--as={OPERATOR_SA}"]
    out = await kubectl(testbed, "delete", "pod", "busy", "-n", namespace, *as_operator)
    assert out.returncode == 0, out.stderr
    # Only that ServiceAccount: one of the same name in another namespace is refused.
    other = f"system:serviceaccount:{namespace}:slurm-operator"
    as_other = ["--dry-run=server", "--as-group=system:masters", f"--as={other}"]
    out = await kubectl(testbed, "delete", "pod", "busy", "-n", namespace, *as_other)
    assert refused_by_policy(out), out.stderr

    # Already terminating (held by a finalizer here, by its preStop hook in life): a DELETE
    # again, the kubelet's final one among them, must pass or the pod stays Terminating.
    forced = {ANNOTATION_SKIP_DRAIN: "true"}
    hold = "e2e.slinky.slurm.net/hold"
    await kube.create(
        rest.PODS, labelled_pod("going", finalizers=[hold], annotations=forced), namespace
    )
    await kube.delete(rest.PODS, "going", namespace)
    unforced = {"metadata": {"annotations": {ANNOTATION_SKIP_DRAIN: None}}}
    await kube.patch(rest.PODS, "going", unforced, namespace)
    out = await kubectl(testbed, "delete", "pod", "going", "-n", namespace, "--wait=false")
    assert out.returncode == 0, out.stderr
    await kube.patch(rest.PODS, "going", {"metadata": {"finalizers": None}}, namespace)

    # A namespace being deleted takes its labelled pods (their preStop hooks protect jobs).
    doomed = f"{namespace}-del"
    await kube.create(rest.NAMESPACES, {"metadata": {"name": doomed}})
    pod = await kube.create(rest.PODS, labelled_pod("busy"), doomed)
    await kube.delete(rest.NAMESPACES, doomed)
    await wait_gone(kube, pod)


async def test_an_eviction_never_reaches_the_policy_only_a_pdb_stops_it(
    kube: rest.Kube, namespace: str, busy_pod_policy: None
) -> None:
    """An eviction is a CREATE of pods/eviction; the apiserver deletes the pod itself, past
    admission. Here no PodDisruptionBudget covers the labelled pod, so it goes."""
    pod = await kube.create(rest.PODS, labelled_pod("busy"), namespace)
    await kube.request(
        "POST",
        rest.PODS.path(namespace, "busy", "eviction"),
        body={"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "busy"}},
    )
    await wait_gone(kube, pod, timeout=30)


# ------------------------------------------------------------ busy slurmd pods


@dataclass
class HeldJob:
    """A Slurm job that takes a whole node (CPUs=2) and runs until released."""

    env: Env
    job_id: int
    node: str
    flag: str

    async def release(self) -> None:
        """Create the file it waits for, in the slurmd container it runs in."""
        out = await kubectl(
            self.env.testbed,
            *("exec", "-n", self.env.namespace, self.node, "-c", "slurmd"),
            *("--", "touch", self.flag),
        )
        assert out.returncode == 0, out.stderr


async def submit_held(env: Env, feature: str) -> HeldJob:
    flag = f"/tmp/release-{uuid.uuid4().hex[:8]}"
    job_id = await env.slurm.submit_job(
        {
            "name": "e2e-held",
            "constraints": feature,
            "minimum_nodes": 1,
            "maximum_nodes": 1,
            "tasks": 1,
            "cpus_per_task": 2,
            "current_working_directory": "/tmp",
            "environment": ["PATH=/usr/bin:/bin"],
            "time_limit": {"set": True, "number": 10},
        },
        script=f"#!/bin/sh\nwhile [ ! -e {flag} ]; do sleep 0.2; done\n",
    )
    return HeldJob(env, job_id, await env.running_on(job_id), flag)


def protected(pod: JSON | None) -> bool:
    return ((pod or {}).get("metadata", {}).get("labels") or {}).get(LABEL_PROTECT) == "true"


async def wait_protected(env: Env, *names: str) -> None:
    async def labelled() -> bool:
        return all([protected(await pod_or_none(env.kube, env.namespace, n)) for n in names])

    await wait_for(labelled, timeout=LABELLED_WITHIN_S, what=f"{names} labelled {LABEL_PROTECT}")


async def test_kubectl_delete_takes_an_idle_slurmd_pod_but_a_busy_one_only_when_forced(
    env: Env, busy_pod_policy: None
) -> None:
    ns = env.namespace
    await env.kube.create(NODESETS, nodeset_manifest("guard", 3), ns)
    names = await wait_idle_nodes(env, "guard", 3)
    kept = await submit_held(env, "guard")
    forced = await submit_held(env, "guard")
    (idle,) = set(names) - {kept.node, forced.node}

    pod = await env.kube.get(rest.PODS, idle, ns)
    out = await kubectl(env.testbed, "delete", "pod", idle, "-n", ns, "--wait=false")
    assert out.returncode == 0, out.stderr
    await wait_gone(env.kube, pod)

    await wait_protected(env, kept.node, forced.node)
    out = await kubectl(env.testbed, "delete", "pod", kept.node, "-n", ns)
    assert refused_by_policy(out), out.stderr
    for words in (
        f"Slurm node {kept.node} runs jobs",
        f"squeue -w {kept.node}",
        f"kubectl annotate pod -n {ns} {kept.node} {ANNOTATION_SKIP_DRAIN}=true",
    ):
        assert words in out.stderr, out.stderr
    pod = await env.kube.get(rest.PODS, kept.node, ns)
    assert not pod["metadata"].get("deletionTimestamp")
    assert await env.job_state(kept.job_id) == ["RUNNING"]

    # The documented way to force it: annotate the pod, delete again. Its preStop hook still
    # gives the job the grace period (10 s here), then the job dies with slurmd.
    victim = await env.kube.get(rest.PODS, forced.node, ns)
    out = await kubectl(
        env.testbed, "annotate", "pod", forced.node, "-n", ns, f"{ANNOTATION_SKIP_DRAIN}=true"
    )
    assert out.returncode == 0, out.stderr
    out = await kubectl(env.testbed, "delete", "pod", forced.node, "-n", ns, "--wait=false")
    assert out.returncode == 0, out.stderr
    await wait_gone(env.kube, victim)
    await env.slurm.cancel_job(forced.job_id)  # requeued, it would hold the new pod's node

    # The refused pod's job ran on undisturbed.
    await kept.release()
    await env.completed_once(kept.job_id)


@dataclass
class Drain:
    """`kubectl drain` running in the background; its output collected line by line."""

    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    @classmethod
    async def start(cls, testbed: Testbed, *args: str) -> Drain:
        proc = await asyncio.create_subprocess_exec(
            str(paths.bin_dir() / "kubectl"),
            f"--kubeconfig={testbed.kubeconfig}",
            "drain",
            *args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        drain = cls(proc)
        drain.reader = asyncio.create_task(drain.read())
        return drain

    async def read(self) -> None:
        assert self.proc.stdout is not None
        async for line in self.proc.stdout:
            self.lines.append(line.decode().rstrip())

    def said(self, words: str) -> bool:
        return any(words in line for line in self.lines)

    @property
    def output(self) -> str:
        return "\n".join(self.lines)


async def test_kubectl_drain_of_the_node_of_a_busy_slurmd_pod_waits_for_its_job(
    env: Env, busy_pod_policy: None
) -> None:
    ns = env.namespace
    await env.kube.create(NODESETS, nodeset_manifest("drain", 1), ns)
    (name,) = await wait_idle_nodes(env, "drain", 1)
    job = await submit_held(env, "drain")
    await wait_protected(env, name)
    pod = await env.kube.get(rest.PODS, name, ns)
    node = pod["spec"]["nodeName"]
    only_ours = f"--pod-selector={LABEL_NODESET}=drain"
    drain: Drain | None = None
    try:
        # Told to delete instead of evicting, kubectl drain meets the policy.
        out = await kubectl(env.testbed, "drain", node, only_ours, "--disable-eviction")
        assert refused_by_policy(out), out.stderr
        # Evictions: the PodDisruptionBudget refuses them while the job runs; kubectl retries.
        drain = await Drain.start(env.testbed, node, only_ours)
        await wait_for(
            lambda: drain is not None and drain.said("violate the pod's disruption budget"),
            timeout=60,
            what="kubectl drain refused by the PodDisruptionBudget",
        )
        assert drain.proc.returncode is None, drain.output
        assert not (await env.kube.get(rest.PODS, name, ns))["metadata"].get("deletionTimestamp")
        assert await env.job_state(job.job_id) == ["RUNNING"]

        # The cordon kubectl drain made drains the Slurm node: no new job starts there.
        async def slurm_drained() -> bool:
            slurm_node = await env.slurm_node(name)
            return slurm_node is not None and slurm_node.state.is_drain

        await wait_for(slurm_drained, timeout=30, what=f"Slurm node {name} drained")

        await job.release()
        await env.completed_once(job.job_id)

        async def drained() -> bool:
            return drain is not None and drain.proc.returncode is not None

        await wait_for(drained, timeout=LABELLED_WITHIN_S + 30, what="kubectl drain finished")
        assert drain.proc.returncode == 0, drain.output
        assert drain.said(f"pod/{name} evicted"), drain.output
        await wait_gone(env.kube, pod)
    finally:
        if drain is not None and drain.proc.returncode is None:
            drain.proc.kill()
            await drain.proc.wait()
        await kubectl(env.testbed, "uncordon", node)
