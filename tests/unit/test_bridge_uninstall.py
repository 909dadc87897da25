"""The bridge's uninstall hook: its own taint and finalizer come off, nothing else."""

from __future__ import annotations

from typing import Any

from slinky.bridge import uninstall
from slinky.bridge.labels import FINALIZER, MANAGED_NODE_TAINT, SLURM_JOBID
from slinky.kube import rest

JSON = dict[str, Any]
OURS = {"key": MANAGED_NODE_TAINT, "value": "s1", "effect": "NoExecute"}
OTHER_BRIDGE = {"key": MANAGED_NODE_TAINT, "value": "s2", "effect": "NoExecute"}
ADMIN = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}


class FakeKube:
    def __init__(self, nodes: list[JSON], pods: list[JSON]) -> None:
        self.items = {rest.NODES.plural: nodes, rest.PODS.plural: pods}
        self.patches: list[tuple[str, str, Any]] = []

    async def list(self, res: rest.Resource, *_a: Any, **_k: Any) -> JSON:
        return {"items": self.items[res.plural]}

    async def patch(self, res: rest.Resource, name: str, body: Any, *_a: Any, **_k: Any) -> JSON:
        self.patches.append((res.plural, name, body))
        return {}


def test_only_this_bridges_taint_is_taken_off() -> None:
    node = {"metadata": {"name": "n"}, "spec": {"taints": [ADMIN, OURS, OTHER_BRIDGE]}}
    assert uninstall.without_our_taint(node, "s1") == [ADMIN, OTHER_BRIDGE]
    assert uninstall.without_our_taint(node, "s3") is None
    assert uninstall.without_our_taint({"metadata": {"name": "m"}, "spec": {}}, "s1") is None


async def test_run_patches_tainted_nodes_and_held_pods_only() -> None:
    nodes = [
        {"metadata": {"name": "a"}, "spec": {"taints": [OURS]}},
        {"metadata": {"name": "b"}, "spec": {"taints": [ADMIN]}},
    ]
    pods = [
        {
            "metadata": {"name": "p", "namespace": "ns", "finalizers": ["x", FINALIZER]},
            "spec": {"schedulerName": "s1"},
        },
        {"metadata": {"name": "q", "namespace": "ns", "finalizers": ["x"]}, "spec": {}},
        {  # another bridge's pod keeps its finalizer
            "metadata": {"name": "r", "namespace": "ns", "finalizers": [FINALIZER]},
            "spec": {"schedulerName": "s2"},
        },
    ]
    kube = FakeKube(nodes, pods)
    await uninstall.run(kube, "s1")  # type: ignore[arg-type]
    assert [(r, n) for r, n, _ in kube.patches] == [("nodes", "a"), ("pods", "p")]
    node_patch, pod_patch = kube.patches[0][2], kube.patches[1][2]
    assert node_patch[0] == {"op": "test", "path": "/spec/taints", "value": [OURS]}
    assert node_patch[1] == {"op": "replace", "path": "/spec/taints", "value": []}
    assert pod_patch == [
        {"op": "test", "path": "/metadata/finalizers/1", "value": FINALIZER},
        {"op": "remove", "path": "/metadata/finalizers/1"},
    ]


def _pod(name: str, phase: str, scheduler: str = "s1", finalizer: bool = True) -> JSON:
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "labels": {SLURM_JOBID: "7"},
            "finalizers": [FINALIZER] if finalizer else [],
        },
        "spec": {"schedulerName": scheduler},
        "status": {"phase": phase},
    }


class SettlingKube(FakeKube):
    """The running bridge takes the finalizer off pod `done` after two lists."""

    def __init__(self, pods: list[JSON]) -> None:
        super().__init__([], pods)
        self.lists = 0

    async def list(self, res: rest.Resource, *_a: Any, **_k: Any) -> JSON:
        self.lists += 1
        if self.lists == 3:
            for pod in self.items[rest.PODS.plural]:
                if pod["metadata"]["name"] == "done":
                    pod["metadata"]["finalizers"] = []
        return await super().list(res)


async def test_uninstall_waits_for_the_bridge_to_settle_finished_pods() -> None:
    pods = [
        _pod("done", "Succeeded"),
        _pod("running", "Running"),  # left in place: its job ends with it
        _pod("other", "Failed", scheduler="s2"),  # another bridge's
    ]
    kube = SettlingKube(pods)
    left = await uninstall.settle_finished_pods(kube, "s1", timeout=5, interval=0)  # type: ignore[arg-type]
    assert left == [] and kube.lists == 3


async def test_an_unsettled_finished_pod_is_named_with_its_job_at_the_deadline() -> None:
    kube = FakeKube([], [_pod("stuck", "Failed")])
    left = await uninstall.settle_finished_pods(kube, "s1", timeout=0, interval=0)  # type: ignore[arg-type]
    assert left == ["ns/stuck (job 7)"]
