"""The slurm chart deployed as Argo CD deploys it: `helm template` (no cluster access, no
lookup), its pre-install/pre-upgrade hooks run as PreSync hooks (the hook Job deleted, made
again and waited for), then the rest applied. A second sync, with a batch job running, gives
the same bytes, makes no key and restarts no daemon: the job ends COMPLETED, never requeued.
The keys are made at run time by the keys hook (python -m slinky.operator.keys): slurm.key,
the JWT key, the chart's MariaDB password and sshd's host key (ssh-keygen in the Slurm image).

Shares test_helm's `install` fixture (namespaces, slurmctld's PV, the session operator
stopped meanwhile); the operator is installed from its chart as there."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
import yaml

from slinky.kube import rest
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
    i, kube = install, install.kube
    t0 = time.monotonic()
    await i.helm(
        "install", i.operator_release, str(CHARTS / "slurm-operator"), "-n", i.operator_ns,
        "-f", i.values_file("operator", {
            "operator": {"image": image("slinky")}, "metricsApi": {"enabled": False},
        }),
        "--wait", "--timeout", "4m",
    )  # fmt: skip
    db_pv = f"{i.storage_class}-db"
    await hostpath_pv(kube, db_pv, i.work / "mariadb", "ReadWriteOnce", "1Gi")
    path = i.values_file("slurm", values(i))
    try:
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
                f"app.kubernetes.io/instance={i.slurm_release},"
                f"app.kubernetes.io/component={component}"
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
            "accounting", "controller", "login", "mariadb", "restapi", "slurmd",
        ], before  # fmt: skip
        i.timings["gitops test"] = time.monotonic() - t0
    finally:
        # Not a Helm release: its NodeSets go first (drained by the operator, still here),
        # then the rest of the render.
        for ns in (await kube.list(NODESETS, i.slurm_ns))["items"]:
            with contextlib.suppress(rest.ApiError):
                await kube.delete(NODESETS, ns["metadata"]["name"], i.slurm_ns)

        async def nodesets_gone() -> bool:
            return not (await kube.list(NODESETS, i.slurm_ns))["items"]

        with contextlib.suppress(AssertionError):
            await wait_for(nodesets_gone, timeout=120, interval=1, what="NodeSets gone")
        rendered = i.work / "render-1.yaml"
        if rendered.exists():
            i.testbed.kubectl(
                [
                    "-n",
                    i.slurm_ns,
                    "delete",
                    "-f",
                    str(rendered),
                    "--ignore-not-found",
                    "--wait=true",
                ],
                timeout=180,
            )
        i.testbed.kubectl(
            ["-n", i.slurm_ns, "delete", "pvc", "--all", "--ignore-not-found"], timeout=60
        )
        with contextlib.suppress(rest.ApiError):
            await kube.delete(PVS, db_pv)
