"""Synchronous Kubernetes calls the test bed manager makes (nodes for kwok, readiness)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lightkube import ApiError, Client, KubeConfig
from lightkube.codecs import from_dict
from lightkube.models.core_v1 import NodeSpec, NodeStatus, Taint
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Node, Pod

KUBELET_LABEL = "testbed.slinky.slurm.net/kubelet"


class Admin:
    """A cluster-admin client for the test bed's own bookkeeping."""

    def __init__(self, kubeconfig: Path) -> None:
        self.client = Client(KubeConfig.from_file(kubeconfig), field_manager="slinky-testbed")

    def apply_kwok_node(self, name: str, *, cpus: int = 32, memory: str = "256Gi") -> None:
        """A fake Node that kwok manages: tainted so ordinary pods avoid it."""
        node = Node(
            metadata=ObjectMeta(
                name=name,
                labels={
                    KUBELET_LABEL: "kwok",
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "type": "kwok",
                },
                annotations={"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
            ),
            spec=NodeSpec(
                taints=[Taint(key="kwok.x-k8s.io/node", value="fake", effect="NoSchedule")]
            ),
        )
        node.status = NodeStatus(
            capacity={"cpu": str(cpus), "memory": memory, "pods": "20000"},
            allocatable={"cpu": str(cpus), "memory": memory, "pods": "20000"},
        )
        try:
            self.client.create(node)
        except ApiError as e:
            if e.status.code != 409:
                raise

    def ready_nodes(self) -> set[str]:
        ready = set()
        for node in self.client.list(Node):
            for cond in (node.status.conditions if node.status else None) or []:
                if cond.type == "Ready" and cond.status == "True" and node.metadata:
                    ready.add(str(node.metadata.name))
        return ready

    def create(self, manifest: dict[str, Any]) -> None:
        """Create an object unless it exists."""
        try:
            self.client.create(from_dict(manifest))
        except ApiError as e:
            if e.status.code != 409:
                raise

    def delete_pods_on(self, node_names: list[str], *, timeout: float) -> list[str]:
        """Delete every pod bound to these nodes through the API (so the kubelets run preStop
        hooks and tear sandboxes down) and wait until they are gone. Returns the pods still
        there at the deadline."""
        deadline = time.monotonic() + timeout
        left: list[str] = []
        while True:
            left = []
            for node in node_names:
                for pod in self.client.list(Pod, namespace="*", fields={"spec.nodeName": node}):
                    meta = pod.metadata
                    if meta is None or meta.name is None:
                        continue
                    left.append(f"{meta.namespace}/{meta.name}")
                    if meta.deletionTimestamp is None:
                        try:
                            self.client.delete(Pod, meta.name, namespace=meta.namespace)
                        except ApiError as e:
                            if e.status.code != 404:
                                raise
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)
