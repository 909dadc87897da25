"""What the node controller watches, and which events enqueue which Node.

- Kubernetes Nodes: their own name, when something the controller acts on changed (labels,
  the partitions annotation, cordon, taints, allocatable, addresses, a condition's status
  or reason), not on heartbeats.
- Slurm nodes (the Slurm informer's deltas): Slurm node `X` enqueues the Kubernetes nodes
  whose Slurm name is `X` (index on the slurm-nodename label, else the name), and, when the
  bridge registered `X`, the Kubernetes node named in its comment, even when that Node no
  longer exists. The informer's first full list does the same for every Slurm node, which
  is the start-up reconciliation that finds Slurm nodes of Nodes deleted while the bridge
  was down.
"""

from __future__ import annotations

from typing import Any

from slinky.bridge.config import BridgeConfig
from slinky.bridge.connection import SlurmConnection
from slinky.bridge.labels import EXTERNAL_NODE, EXTERNAL_NODE_PARTITIONS, SLURM_NODENAME
from slinky.bridge.nodes import registration
from slinky.bridge.nodes.sync import NodeSync
from slinky.kube import events, nodehealth, rest
from slinky.kube.controller import Controller
from slinky.kube.informer import InformerFactory
from slinky.kube.store import key_of
from slinky.slurm.informer import SlurmEvent
from slinky.types import JSON

BY_SLURM_NAME = "slurm-name"


def index_slurm_name(node: JSON) -> list[str]:
    """Index function: the Slurm node name of a Node."""
    return [registration.slurm_name(node)]


def relevant(node: JSON) -> tuple[Any, ...]:
    """The parts of a Node the controller acts on."""
    meta = node["metadata"]
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    spec = node.get("spec") or {}
    status = node.get("status") or {}
    return (
        labels.get(EXTERNAL_NODE),
        labels.get(SLURM_NODENAME),
        annotations.get(EXTERNAL_NODE_PARTITIONS),
        spec.get("unschedulable"),
        spec.get("taints"),
        status.get("allocatable"),
        status.get("addresses"),
        nodehealth.conditions_of(node),
    )


def build(
    kube: rest.Kube,
    factory: InformerFactory,
    slurm: SlurmConnection,
    recorder: events.EventRecorder,
    config: BridgeConfig,
    *,
    workers: int = 2,
) -> Controller:
    """The node controller: its Node informer, what enqueues which Node, and the reconciler."""
    nodes = factory.informer(rest.NODES, indexers={BY_SLURM_NAME: index_slurm_name})
    registered: dict[str, str] = {}
    sync = NodeSync(
        kube, config=config, nodes=nodes, slurm=slurm, registered=registered, recorder=recorder
    )
    ctrl = Controller("bridge-node", sync, workers=workers)
    ctrl.watch(nodes, predicate=lambda old, new: old is None or relevant(old) != relevant(new))

    def on_slurm(event: SlurmEvent) -> None:
        if event.kind != "node":
            return
        old_owner = registration.registered_for(event.old, config.cluster_id)
        new_owner = registration.registered_for(event.new, config.cluster_id)
        if old_owner is not None:
            ctrl.enqueue(old_owner)
            if old_owner != new_owner and registered.get(old_owner) == event.name:
                del registered[old_owner]
        if new_owner is not None:
            registered[new_owner] = event.name
            ctrl.enqueue(new_owner)
        for node in nodes.store.by_index(BY_SLURM_NAME, event.name):
            ctrl.enqueue(key_of(node))

    slurm.informer.subscribe(on_slurm)
    return ctrl
