"""What the NodeSet controller watches, and which events enqueue which NodeSet.

- NodeSets: their own key.
- Pods: the owning NodeSet (controller owner reference); pod adds/deletes also settle
  expectations.
- Kubernetes Nodes: a node cordoned or uncordoned (or its cordon reason changed) enqueues the
  NodeSets with pods on it (index by spec.nodeName).
- Slurm (the seeds' "Slurm event channel"): a change of Slurm node `X` of Cluster `ns/c`
  enqueues the NodeSet owning pod `ns/X`; the informer going stale/fresh enqueues every
  NodeSet of that Cluster.
"""

from __future__ import annotations

from typing import Any

from slinky.kube import events, rest
from slinky.kube.controller import Controller, owner_mapper
from slinky.kube.expectations import Expectations
from slinky.kube.informer import Handler, InformerFactory
from slinky.kube.store import BY_NODE_NAME, index_node_name, key_of
from slinky.operator.clients import ClusterClients
from slinky.operator.nodeset.sync import NodeSetSync
from slinky.slurm.informer import SlurmEvent

JSON = dict[str, Any]
BY_CLUSTER = "cluster"


def cluster_of_nodeset(obj: JSON) -> list[str]:
    name = (obj.get("spec") or {}).get("clusterName")
    return [f"{obj['metadata']['namespace']}/{name}"] if name else []


def build(
    kube: rest.Kube,
    factory: InformerFactory,
    clients: ClusterClients,
    recorder: events.EventRecorder,
    *,
    workers: int = 4,
) -> Controller:
    from slinky.operator.resources import NODESETS

    nodesets = factory.shared(NODESETS, indexers={BY_CLUSTER: cluster_of_nodeset})
    pods = factory.shared(rest.PODS, indexers={BY_NODE_NAME: index_node_name})
    nodes = factory.informer(rest.NODES)
    revisions = factory.shared(rest.CONTROLLER_REVISIONS)
    expectations = Expectations()
    sync = NodeSetSync(
        kube,
        nodesets=nodesets,
        pods=pods,
        nodes=nodes,
        revisions=revisions,
        clients=clients,
        recorder=recorder,
        expectations=expectations,
    )
    ctrl = Controller("nodeset", sync, workers=workers)
    ctrl.watch(nodesets)
    to_owner = owner_mapper("NodeSet")
    ctrl.watch(pods, to_owner)

    def exp_key(pod: JSON) -> str | None:
        for ref in pod["metadata"].get("ownerReferences") or []:
            if ref.get("controller") and ref.get("kind") == "NodeSet":
                return f"{pod['metadata']['namespace']}/{ref['name']}/{ref['uid']}"
        return None

    def observed_add(pod: JSON) -> None:
        if k := exp_key(pod):
            expectations.creation_observed(k)

    def observed_delete(pod: JSON) -> None:
        if k := exp_key(pod):
            expectations.deletion_observed(k, pod["metadata"]["uid"])

    pods.add_handler(Handler(on_add=observed_add, on_delete=observed_delete))

    def node_changed(old: JSON | None, new: JSON) -> bool:
        def cordon(n: JSON | None) -> tuple[Any, Any]:
            if n is None:
                return (None, None)
            ann = n["metadata"].get("annotations") or {}
            return (
                (n.get("spec") or {}).get("unschedulable"),
                ann.get("nodeset.slinky.slurm.net/node-cordon-reason"),
            )

        return old is not None and cordon(old) != cordon(new)

    def pods_on_node(node: JSON) -> list[str]:
        keys: list[str] = []
        for pod in pods.by_index(BY_NODE_NAME, node["metadata"]["name"]):
            keys += to_owner(pod)
        return keys

    ctrl.watch(nodes, pods_on_node, predicate=node_changed)

    def on_slurm(cluster_key: str, event: SlurmEvent) -> None:
        namespace = cluster_key.partition("/")[0]
        if event.kind == "informer":
            for ns_obj in nodesets.by_index(BY_CLUSTER, cluster_key):
                ctrl.enqueue(key_of(ns_obj))
        elif event.kind == "node":
            pod = pods.get(f"{namespace}/{event.name}")
            if pod is not None:
                for key in to_owner(pod):
                    ctrl.enqueue(key)

    clients.subscribe(on_slurm)
    return ctrl
