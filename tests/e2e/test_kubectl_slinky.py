"""`kubectl slinky` against the real apiserver and Slurm: its joins agree with what Kubernetes
and Slurm say themselves, and a scale-in plan names the pods in the order the operator then
removes them, with the busy pod's job and its end by the time limit."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import socket
import sys
from typing import Any

import pytest

from slinky.operator.nodeset.builder import (
    ANNOTATION_CONDEMNED,
    ANNOTATION_CONDEMNED_AT,
    ANNOTATION_DRAIN_DEADLINE,
)
from slinky.operator.resources import NODESETS
from slinky_testbed.waiting import wait_for
from tests.e2e.nodeset_fixtures import Env, nodeset_manifest, wait_idle_nodes

pytestmark = pytest.mark.e2e


async def slinky(env: Env, *args: str) -> Any:
    """Run the plugin as kubectl would (a process), JSON out."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "slinky.kubectl.main",
        *args,
        f"--kubeconfig={env.testbed.kubeconfig}",
        "-n",
        env.namespace,
        "-o",
        "json",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, f"kubectl slinky {' '.join(args)}: {err.decode()}"
    return json.loads(out)


async def test_status_and_a_scale_in_plan_match_kubernetes_slurm_and_what_happens(
    env: Env,
) -> None:
    await env.kube.create(NODESETS, nodeset_manifest("plan", 3), env.namespace)
    await wait_idle_nodes(env, "plan", 3)
    job = await env.submit("plan", 25)
    busy = await env.running_on(job)

    async def shows_the_job() -> Any:
        data = await slinky(env, "status", "plan")
        pods = {p["name"]: p for p in data["nodesets"][0]["pods"]}
        return data if [j["id"] for j in pods[busy]["jobs"]] == [job] else None

    data = await wait_for(shows_the_job, timeout=30, what="status shows the running job")
    kube_pods = {p["metadata"]["name"]: p for p in await env.pods("plan")}
    for entry in data["nodesets"][0]["pods"]:
        name = entry["name"]
        assert entry["kubeNode"] == kube_pods[name]["spec"]["nodeName"]
        node = await env.slurm_node(name)
        assert entry["slurmState"] == str(node.state)
    slurm_job = await env.slurm.get_job(job)
    ours = {p["name"]: p for p in data["nodesets"][0]["pods"]}[busy]["jobs"][0]
    assert (ours["user"], ours["endsAt"]) == (slurm_job.user_name, slurm_job.end_time)
    assert data["nodesets"][0]["allocated"] == 1 and data["nodesets"][0]["idle"] == 2

    plan = await slinky(env, "plan", "scale", "plan", "0")
    order = [s["pod"] for s in plan["steps"]]
    assert order[-1] == busy and set(order) == set(kube_pods)
    last = plan["steps"][-1]
    assert [j["id"] for j in last["jobs"]] == [job]
    assert last["goesAt"] == slurm_job.end_time == plan["completesAt"]
    assert all(s["goesIn"] == 0 for s in plan["steps"][:-1])

    # The real scale-in: the idle pods go at once, the busy one when its job has ended.
    await env.scale("plan", 0)

    async def condemned_with_deadline() -> dict[str, str] | None:
        pod = {p["metadata"]["name"]: p for p in await env.pods("plan")}.get(busy)
        notes = (pod or {}).get("metadata", {}).get("annotations") or {}
        return notes if ANNOTATION_DRAIN_DEADLINE in notes else None

    # The busy pod says since when it drains and when its job ends by its time limit.
    notes = await wait_for(condemned_with_deadline, timeout=15, what="the busy pod's deadline")
    deadline = dt.datetime.fromtimestamp(slurm_job.end_time or 0, dt.UTC)
    assert notes[ANNOTATION_DRAIN_DEADLINE] == deadline.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert notes[ANNOTATION_CONDEMNED] == "scale-in" and notes[ANNOTATION_CONDEMNED_AT]
    gone_at: dict[str, float] = {}

    async def all_gone() -> bool:
        live = set(await env.live_pod_names("plan"))
        now = asyncio.get_running_loop().time()
        for name in order:
            if name not in live:
                gone_at.setdefault(name, now)
        return not live

    await wait_for(all_gone, timeout=90, interval=0.3, what="every pod of plan removed")
    assert max(gone_at, key=lambda n: gone_at[n]) == busy
    await env.completed_once(job)


async def slinky_text(env: Env, *args: str) -> tuple[int, str, str]:
    """Run the plugin as a process, text out: exit status, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "slinky.kubectl.main",
        *args,
        f"--kubeconfig={env.testbed.kubeconfig}",
        "-n",
        env.namespace,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode or 0, out.decode(), err.decode()


async def test_why_a_pod_that_waits_for_its_job_names_the_job(env: Env) -> None:
    await env.kube.create(NODESETS, nodeset_manifest("why", 1), env.namespace)
    (name,) = await wait_idle_nodes(env, "why", 1)
    # Slurm unreachable (nothing listens at that port): the pod's Slurm node is unknown,
    # not "not registered", the hint names --slurm-server, and no aiohttp session leaks.
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        closed = f"http://127.0.0.1:{held.getsockname()[1]}"
        rc, out, err = await slinky_text(env, "status", "why", f"--slurm-server={closed}")
    assert rc == 0, err
    assert "unknown: Slurm unreachable" in out and "not registered" not in out, out
    assert "--slurm-server=" in out.splitlines()[-1], out
    assert "Unclosed" not in err and err == "", err
    job = await env.submit("why", 15)
    await env.running_on(job)
    await env.scale("why", 0)

    async def explained() -> Any:
        data = await slinky(env, "why", name)
        return data if any(str(job) in line for line in data["why"]) else None

    data = await wait_for(explained, timeout=30, what="why names the job")
    assert data["why"][0] == "leaving: scale-in"
    await env.completed_once(job)
