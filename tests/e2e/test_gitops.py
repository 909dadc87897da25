"""The slurm chart deployed as Argo CD deploys it: `helm template` (no cluster access, no
lookup), its pre-install/pre-upgrade hooks run as PreSync hooks (the hook Job deleted, made
again and waited for), then the rest applied. A second sync, with a batch job running, gives
the same bytes, makes no key and restarts no daemon: the job ends COMPLETED, never requeued.
The keys are made at run time by the keys hook (python -m slinky.operator.keys): slurm.key,
the JWT key, the chart's MariaDB password and sshd's host key (ssh-keygen in the Slurm image).

Uses test_helm's `install` fixture (namespaces, slurmctld's PV, the session operator stopped
meanwhile; function-scoped: an installation of its own, not test_helm's); the operator is
installed from its chart as there. Taken down as a person would (no Helm release, no cleanup
hook): the NodeSets first, waited for while slurmctld still answers their drain, then the rest
of the render; NodeSets still there after 120 s fail the test with what they say and only then
get delete-without-drain. A failure of the test itself stays the one reported."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import pytest
import yaml

from slinky.kube import rest
from slinky.operator.nodeset.partition import ANNOTATION_SKIP_DRAIN
from slinky.operator.resources import CLUSTERS, NODESETS
from slinky_testbed.waiting import wait_for
from tests.e2e.operator_fixtures import condition
from tests.e2e.test_helm import (
    CHARTS,
    HELM,
    JOBS,
    PVS,
    Install,
    completed,
    hostpath_pv,
    idle_nodes,
    image,
    install,
    running,
    submit,
)

pytestmark = pytest.mark.e2e

__all__ = ["install"]  # the fixture, shared

JSON = dict[str, Any]
HOOK = "helm.sh/hook"
DAEMONS = {
    "controller": "slurmctld",
    "restapi": "slurmrestd",
    "accounting": "slurmdbd",
    "login": "sshd",
}


def values(i: Install) -> JSON:
    """test_helm's values with one batch NodeSet, the login pods (sshd's host key) and
    accounting on the chart's MariaDB (its password): every key the hook makes."""
    got = i.slurm_values(extra=False)
    got["compute"]["nodesets"] = [{"name": "batch", "replicas": 1}]
    got["login"] = {"enabled": True}
    got["accounting"] = {
        "enabled": True,
        "mariadb": {
            "enabled": True,
            "persistence": {"storageClassName": f"{i.storage_class}-db", "size": "1Gi"},
        },
    }
    return got


async def render(i: Install, path: str) -> str:
    """`helm template` as Argo CD runs it: no cluster (no kubeconfig given, no lookup)."""
    proc = await asyncio.create_subprocess_exec(
        str(HELM), "template", i.slurm_release, str(CHARTS / "slurm"), "-n", i.slurm_ns,
        "-f", path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def sync(i: Install, text: str, n: int) -> list[str]:
    """One Argo CD sync of a render: the PreSync hooks (helm's pre-install/pre-upgrade) by
    weight, each deleted first (before-hook-creation) and a Job waited for until it
    succeeded; then every object that is no hook, applied. Returns the hook Jobs' logs."""
    objs = [o for o in yaml.safe_load_all(text) if o]
    hooks = [
        o for o in objs if "pre-install" in (o["metadata"].get("annotations") or {}).get(HOOK, "")
    ]
    hooks.sort(key=lambda o: int(o["metadata"]["annotations"].get("helm.sh/hook-weight", "0")))
    logs = []
    for obj in hooks:
        kind, name = obj["kind"].lower(), obj["metadata"]["name"]
        i.kubectl("-n", i.slurm_ns, "delete", kind, name, "--ignore-not-found", "--wait=true")
        path = i.work / f"hook-{n}-{kind}-{name}.yaml"
        path.write_text(yaml.safe_dump(obj))
        i.kubectl("-n", i.slurm_ns, "create", "-f", str(path))
        if obj["kind"] == "Job":

            async def finished(name: str = name) -> JSON | None:
                got = await i.kube.get(JOBS, name, i.slurm_ns)
                status = got.get("status") or {}
                assert not status.get("failed"), f"hook Job {name} failed: " + i.kubectl(
                    "-n", i.slurm_ns, "logs", f"job/{name}", "--all-containers"
                )
                return got if status.get("succeeded") else None

            await wait_for(finished, timeout=120, interval=0.5, what=f"hook Job {name} done")
            logs.append(i.kubectl("-n", i.slurm_ns, "logs", f"job/{name}", "-c", "keys"))
    rest_path = i.work / f"render-{n}.yaml"
    rest_path.write_text(
        yaml.safe_dump_all(
            [o for o in objs if HOOK not in (o["metadata"].get("annotations") or {})]
        )
    )
    i.kubectl("-n", i.slurm_ns, "apply", "-f", str(rest_path))
    return logs


async def daemons(i: Install) -> dict[str, tuple[str, str, int]]:
    """Each daemon pod of the release (slurmctld, slurmrestd, slurmdbd, MariaDB, login,
    slurmd) by name: its component, UID and container restarts."""
    pods = await i.pods(i.slurm_ns, f"app.kubernetes.io/instance={i.slurm_release}")
    pods += await i.pods(i.slurm_ns, f"nodeset.slinky.slurm.net/name={i.nodeset('batch')}")
    out = {}
    for pod in pods:
        meta, status = pod["metadata"], pod.get("status") or {}
        component = (meta.get("labels") or {}).get("app.kubernetes.io/component", "slurmd")
        if component in ("keys", "cleanup"):
            continue  # the hooks' pods
        restarts = sum(c.get("restartCount", 0) for c in status.get("containerStatuses") or [])
        out[meta["name"]] = (component, meta["uid"], restarts)
    return out


async def test_two_argo_cd_syncs_make_keys_once_and_restart_nothing(install: Install) -> None:
    i = install
    t0 = time.monotonic()
    await i.helm(
        "install", i.operator_release, str(CHARTS / "slurm-operator"), "-n", i.operator_ns,
        "-f", i.values_file("operator", {
            "operator": {"image": image("slinky")}, "metricsApi": {"enabled": False},
        }),
        "--wait", "--timeout", "4m",
    )  # fmt: skip
    db_pv = f"{i.storage_class}-db"
    await hostpath_pv(i.kube, db_pv, i.work / "mariadb", "ReadWriteOnce", "1Gi")
    try:
        await two_syncs(i, t0)
    except BaseException as e:
        # The test's own failure is the one reported; what the teardown met is added to it.
        for problem in await teardown(i, db_pv):
            e.add_note(f"teardown: {problem}")
        raise
    problems = await teardown(i, db_pv)
    assert not problems, "teardown: " + "\n".join(problems)
    i.timings["gitops test with teardown"] = time.monotonic() - t0


async def two_syncs(i: Install, t0: float) -> None:
    kube = i.kube
    path = i.values_file("slurm", values(i))
    first = await render(i, path)
    assert "slurm.key:" not in first and "jwt_hs256.key:" not in first
    logs = await sync(i, first, 1)
    made = [
        f"made Secret {i.slurm_ns}/{i.slurm_release}-{name}"
        for name in ("slurm-key", "jwt-key", "mariadb", "ssh-host-keys")
    ]
    assert all(m in logs[0] for m in made), logs
    i.timings["first sync (keys made) to applied"] = time.monotonic() - t0

    async def cluster_ready() -> bool:
        got = await kube.get(CLUSTERS, i.slurm_release, i.slurm_ns)
        return condition(got).get("reason") == "Connected"

    await wait_for(cluster_ready, timeout=180, interval=0.5, what="Cluster Connected")
    await idle_nodes(i, "batch", 1)
    for component in DAEMONS:
        selector = (
            f"app.kubernetes.io/instance={i.slurm_release},app.kubernetes.io/component={component}"
        )

        async def ready(selector: str = selector) -> bool:
            pods = await i.pods(i.slurm_ns, selector)
            return bool(pods) and all(condition(p).get("status") == "True" for p in pods)

        await wait_for(ready, timeout=180, interval=1, what=f"{component} Ready")
    job = await submit(i, "batch", 40)
    await running(i, job)
    before = await daemons(i)
    keys = {
        name: await i.secret_data(i.slurm_ns, f"{i.slurm_release}-{name}")
        for name in ("slurm-key", "jwt-key", "mariadb", "ssh-host-keys")
    }
    assert len(keys["slurm-key"]["slurm.key"]) > 1300  # 1024 bytes, base64

    # ------------------------------------------------ the second sync, the job running
    start = time.monotonic()
    second = await render(i, path)
    assert second == first, "two renders differ"
    logs = await sync(i, second, 2)
    assert all(m.replace("made", "kept") in logs[0] for m in made), logs
    i.timings["second sync"] = time.monotonic() - start
    await completed(i, job, timeout=120)
    for name, data in keys.items():
        assert await i.secret_data(i.slurm_ns, f"{i.slurm_release}-{name}") == data, name
    after = await daemons(i)
    assert after == before, f"daemon pods restarted or replaced: {before} -> {after}"
    assert sorted(c for c, _, _ in before.values()) == [
        "accounting", "compute", "controller", "login", "mariadb", "restapi",
    ], before  # fmt: skip
    i.timings["gitops test"] = time.monotonic() - t0


NODESETS_GONE_S = 120  # drained (their pods idle), each pod's grace period


async def teardown(i: Install, db_pv: str) -> list[str]:
    """Takes the render down as a person would (it is no Helm release, no cleanup hook runs):
    the NodeSets first, waited for while slurmctld still runs to answer their drain; then the
    rest of the render. Returns what went wrong, never raises: NodeSets that did not go in
    time are named with what they say, then annotated delete-without-drain (the last resort,
    or their finalizer would wait for a slurmctld deleted next and hold the namespace)."""
    kube, problems = i.kube, []

    async def left() -> list[JSON]:
        return list((await kube.list(NODESETS, i.slurm_ns))["items"])

    async def gone() -> bool:
        return not await left()

    try:
        for ns in await left():
            await absent_ok(kube.delete(NODESETS, ns["metadata"]["name"], i.slurm_ns))
        try:
            await wait_for(gone, timeout=NODESETS_GONE_S, interval=1, what="NodeSets gone")
        except AssertionError:
            stuck = await left()
            problems.append(
                f"NodeSets not gone {NODESETS_GONE_S}s after their deletion (slurmctld still "
                f"deployed): {said(stuck)}; then annotated {ANNOTATION_SKIP_DRAIN}=true"
            )
            for ns in stuck:
                patch = {"metadata": {"annotations": {ANNOTATION_SKIP_DRAIN: "true"}}}
                await absent_ok(kube.patch(NODESETS, ns["metadata"]["name"], patch, i.slurm_ns))
            await wait_for(gone, timeout=60, interval=1, what="NodeSets gone without drain")
    except Exception as e:  # reported; the rest is still taken down
        problems.append(f"deleting the NodeSets: {e}")
    rendered = i.work / "render-1.yaml"
    if rendered.exists():
        argv = ["-n", i.slurm_ns, "delete", "-f", str(rendered), "--ignore-not-found"]
        out = i.testbed.kubectl([*argv, "--wait=true", "--timeout=120s"], timeout=150)
        if out.returncode != 0:
            problems.append(f"kubectl delete of the render: {out.stderr.strip()}")
    i.testbed.kubectl(["-n", i.slurm_ns, "delete", "pvc", "--all", "--ignore-not-found"])
    try:
        await absent_ok(kube.delete(PVS, db_pv))
    except rest.ApiError as e:
        problems.append(f"deleting PersistentVolume {db_pv}: {e}")
    return problems


async def absent_ok(call: Awaitable[Any]) -> None:
    """A call on an object that may be gone already (404 is fine)."""
    try:
        await call
    except rest.ApiError as e:
        if not e.not_found:
            raise


def said(nodesets: list[JSON]) -> str:
    """Each NodeSet by name with its conditions (Deleting names what it waits for)."""
    return "; ".join(
        f"{ns['metadata']['name']}: "
        + ", ".join(
            f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
            for c in (ns.get("status") or {}).get("conditions") or []
        )
        for ns in nodesets
    )
