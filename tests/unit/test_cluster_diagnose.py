"""Why slurmctld does not answer, as Kubernetes can tell (its pod, its claim), and telling
slurmctld's trouble from slurmrestd's."""

from __future__ import annotations

import asyncio
from typing import Any

from slinky.kube import rest
from slinky.operator.cluster import diagnose
from slinky.operator.cluster.sync import listening, slurmctld_trouble
from slinky.slurm import errors
from slinky.slurm.errors import SlurmErrorEntry

JSON = dict[str, Any]


class FakeKube:
    def __init__(self, **items: list[JSON]) -> None:
        self.items = items
        self.asked: list[tuple[str, str | None, Any]] = []

    async def list(self, res: rest.Resource, ns: str | None = None, **kw: Any) -> JSON:
        self.asked.append((res.plural, ns, kw.get("params")))
        return {"items": self.items.get(res.plural, [])}


SERVICE = {"metadata": {"name": "slurm-controller"}, "spec": {"selector": {"app": "ctld"}}}


def pending_pod(claim: str | None) -> JSON:
    volumes = [{"name": "state", "persistentVolumeClaim": {"claimName": claim}}] if claim else []
    return {
        "metadata": {"name": "slurm-controller-0"},
        "spec": {"volumes": volumes},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "message": "pod has unbound immediate PersistentVolumeClaims",
                }
            ],
        },
    }


def test_service_of_a_controller_host() -> None:
    assert diagnose.service_of("slurm-controller.slurm.svc.cluster.local", "x") == (
        "slurm",
        "slurm-controller",
    )
    assert diagnose.service_of("slurm-controller.slurm", "x") == ("slurm", "slurm-controller")
    assert diagnose.service_of("slurm-controller", "x") == ("x", "slurm-controller")
    assert diagnose.service_of("10.0.0.1", "x") is None
    assert diagnose.service_of("ctld.example.org", "x") is None
    assert diagnose.service_of("", "x") is None


async def test_a_pending_pod_and_its_claim_without_a_storage_class_are_named() -> None:
    claim = {
        "metadata": {"name": "state-slurm-controller-0"},
        "spec": {},
        "status": {"phase": "Pending"},
    }
    kube = FakeKube(
        services=[SERVICE], pods=[pending_pod("state-slurm-controller-0")],
        persistentvolumeclaims=[claim],
    )  # fmt: skip
    got = await diagnose.controller_problem(
        kube,  # type: ignore[arg-type]
        "slurm-controller.slurm.svc.cluster.local",
        "slurm",
    )
    assert got is not None
    reason, message = got
    assert reason == "SlurmctldPodPending"
    assert "waiting for slurmctld's pod slurm/slurm-controller-0: Pending" in message
    assert "unbound immediate PersistentVolumeClaims" in message
    assert "its claim state-slurm-controller-0 is Pending (no storageClassName" in message
    assert ("pods", "slurm", {"labelSelector": "app=ctld"}) in kube.asked


async def test_no_pod_and_a_crashing_pod_are_told_apart() -> None:
    kube = FakeKube(services=[SERVICE])
    got = await diagnose.controller_problem(kube, "slurm-controller", "ns")  # type: ignore[arg-type]
    assert got is not None and got[0] == "SlurmctldPodMissing"
    crashing = {
        "metadata": {"name": "slurm-controller-0"},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "containerStatuses": [
                {"name": "slurmctld", "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
            ],
        },
    }
    kube = FakeKube(services=[SERVICE], pods=[crashing])
    got = await diagnose.controller_problem(kube, "slurm-controller", "ns")  # type: ignore[arg-type]
    assert got is not None and got[0] == "SlurmctldPodNotReady"
    assert "slurmctld: CrashLoopBackOff" in got[1]


async def test_a_ready_pod_or_an_outside_host_explains_nothing() -> None:
    ready = {
        "metadata": {"name": "c-0"},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }
    kube = FakeKube(services=[SERVICE], pods=[ready])
    assert await diagnose.controller_problem(kube, "slurm-controller", "ns") is None  # type: ignore[arg-type]
    assert await diagnose.controller_problem(kube, "10.1.2.3", "ns") is None  # type: ignore[arg-type]
    assert await diagnose.controller_problem(FakeKube(), "svc", "ns") is None  # type: ignore[arg-type]


def test_slurmctld_trouble_is_read_from_slurms_errors() -> None:
    def err(number: int, text: str) -> errors.SlurmError:
        entry = SlurmErrorEntry(error_number=number, error=text, description="", source="")
        return errors.SlurmError("x", status=500, errors=[entry])

    assert slurmctld_trouble(err(1001, "Unable to contact slurm controller (connect failure)"))
    assert slurmctld_trouble(err(0, "Unable to contact slurm controller"))
    assert not slurmctld_trouble(err(2017, "Invalid job id specified"))


async def test_listening_probes_the_port() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert await listening(f"http://127.0.0.1:{port}")
    finally:
        server.close()
        await server.wait_closed()
    assert not await listening(f"http://127.0.0.1:{port}")
    assert not await listening("not a url")


async def test_another_namespace_is_not_looked_into_and_a_pull_error_is_named() -> None:
    kube = FakeKube(services=[SERVICE], pods=[pending_pod(None)])
    # A Cluster in namespace "mine" naming a Service elsewhere: its status tells nothing.
    assert await diagnose.controller_problem(kube, "slurm-controller.other", "mine") is None  # type: ignore[arg-type]
    assert kube.asked == []
    pulling = pending_pod(None)
    pulling["status"]["conditions"] = [{"type": "PodScheduled", "status": "True"}]
    pulling["status"]["containerStatuses"] = [
        {"name": "slurmctld", "state": {"waiting": {"reason": "ImagePullBackOff"}}}
    ]
    kube = FakeKube(services=[SERVICE], pods=[pulling])
    got = await diagnose.controller_problem(kube, "slurm-controller", "ns")  # type: ignore[arg-type]
    assert got is not None and got[0] == "SlurmctldPodPending"
    assert "(slurmctld: ImagePullBackOff)" in got[1], got[1]
