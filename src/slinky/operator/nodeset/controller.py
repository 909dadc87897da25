"""What the NodeSet controller watches, and which events enqueue which NodeSet.

- NodeSets: their own key (not for a change of their status only: the operator's own write).
- Clusters: a Cluster change (e.g. `spec.controller`) enqueues its NodeSets.
- Pods, Services, PodDisruptionBudgets, ControllerRevisions (only those the operator made,
  by label): the owning NodeSet; pod adds and deletions (a deletionTimestamp is enough)
  also settle expectations; a deleted Service or PDB is re-created by the reconcile this
  enqueues.
- HorizontalPodAutoscalers scaling a NodeSet: that NodeSet (the `Autoscaling` condition).
- Kubernetes Nodes: a node cordoned or uncordoned (or its cordon reason changed), or a
  change of its conditions' statuses (NotReady, Node Problem Detector's), enqueues the
  NodeSets with pods on it (index by spec.nodeName).
- Slurm (the seeds' "Slurm event channel"): a change of Slurm node `X` of Cluster `ns/c`
  enqueues the NodeSet owning pod `ns/X`; a change of partition `P` (added, changed, gone:
  slurmctld may lose it at a restart) the NodeSets of that Cluster keeping `P`; the informer
  going stale/fresh enqueues every NodeSet of that Cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slinky.kube import events, rest
from slinky.kube.controller import Controller, beyond_status, owner_mapper
from slinky.kube.expectations import Expectations
from slinky.kube.informer import Handler, InformerFactory
from slinky.kube.nodehealth import NodeHealth
from slinky.kube.store import BY_NODE_NAME, index_node_name, key_of
from slinky.operator.clients import ClusterClients
from slinky.operator.nodeset import builder
from slinky.operator.nodeset import pods as pod_fields
from slinky.operator.nodeset.mirror import slurmd_gone
from slinky.operator.nodeset.placement import ANNOTATION_TOPOLOGY_SPEC as TOPOLOGY_SPEC
from slinky.operator.nodeset.sync import BY_HPA_TARGET, NodeSetSync, hpa_target
from slinky.operator.nodeset.view import Placement
from slinky.operator.resources import CLUSTERS, NODESETS
from slinky.slurm.informer import SlurmEvent
from slinky.types import JSON

BY_CLUSTER = "cluster"
MANAGED = f"{builder.LABEL_MANAGED_BY}={builder.MANAGER}"


def cluster_of_nodeset(obj: JSON) -> list[str]:
    name = (obj.get("spec") or {}).get("clusterName")
    return [f"{obj['metadata']['namespace']}/{name}"] if name else []


def partition_of(obj: JSON) -> str | None:
    """The name of the Slurm partition a NodeSet keeps (spec.partition), if enabled."""
    spec = (obj.get("spec") or {}).get("partition") or {}
    if not spec.get("enabled"):
        return None
    return str(spec.get("name") or obj["metadata"]["name"])


def slim_node(node: JSON) -> JSON:
    """What the cordon mirror and the placement read of a Kubernetes node (name, labels,
    annotations, `spec.unschedulable`, each condition's type, status and reason): a large
    cluster's node status (images, addresses, heartbeat times) is not kept, so a heartbeat
    is no update."""
    meta = node["metadata"]
    conditions = [
        {k: c[k] for k in ("type", "status", "reason") if k in c}
        for c in (node.get("status") or {}).get("conditions") or []
    ]
    return {
        "apiVersion": node.get("apiVersion"),
        "kind": node.get("kind"),
        "metadata": {
            k: meta[k]
            for k in ("name", "uid", "resourceVersion", "labels", "annotations")
            if k in meta
        },
        "spec": {"unschedulable": True} if (node.get("spec") or {}).get("unschedulable") else {},
        "status": {"conditions": conditions},
    }


def slim_hpa(hpa: JSON) -> JSON:
    """What the operator reads of an HPA: its target, minReplicas, maxReplicas (the most its
    NodeSet can have: autoscale.metrics leaves out jobs larger) and the reason of its
    ScalingActive condition. The rest of its status (rewritten at every 15 s sync) is
    dropped, so a sync that changed nothing of that is no update."""
    spec = hpa.get("spec") or {}
    active = [
        {"type": "ScalingActive", "reason": c.get("reason"), "status": c.get("status")}
        for c in (hpa.get("status") or {}).get("conditions") or []
        if c.get("type") == "ScalingActive"
    ]
    return {
        "status": {"conditions": active},
        "apiVersion": hpa.get("apiVersion"),
        "kind": hpa.get("kind"),
        "metadata": {
            k: hpa["metadata"][k]
            for k in ("name", "namespace", "uid", "resourceVersion")
            if k in hpa["metadata"]
        },
        "spec": {k: spec[k] for k in ("scaleTargetRef", "minReplicas", "maxReplicas") if k in spec},
    }


def expectation_key(pod: JSON) -> str | None:
    """`ns/nodeset/uid` of the NodeSet controlling `pod` (the sync's `View.exp_key`)."""
    for ref in pod["metadata"].get("ownerReferences") or []:
        if ref.get("controller") and ref.get("kind") == "NodeSet":
            return f"{pod['metadata']['namespace']}/{ref['name']}/{ref['uid']}"
    return None


def build(
    kube: rest.Kube,
    factory: InformerFactory,
    clients: ClusterClients,
    recorder: events.EventRecorder,
    *,
    workers: int = 4,
    node_health: NodeHealth | None = None,
    gres_resources: Mapping[str, str] | None = None,
    placement: Placement | None = None,
) -> Controller:
    nodesets = factory.shared(NODESETS, indexers={BY_CLUSTER: cluster_of_nodeset})
    clusters = factory.shared(CLUSTERS)
    pods = factory.shared(
        rest.PODS,
        label_selector=MANAGED,
        indexers={BY_NODE_NAME: index_node_name},
        transform=pod_fields.slim,
    )
    services = factory.shared(rest.SERVICES, label_selector=MANAGED)
    pdbs = factory.shared(rest.PDBS, label_selector=MANAGED)
    nodes = factory.informer(rest.NODES, transform=slim_node)
    revisions = factory.shared(rest.CONTROLLER_REVISIONS, label_selector=builder.LABEL_NODESET)
    hpas = factory.shared(rest.HPAS, indexers={BY_HPA_TARGET: hpa_target}, transform=slim_hpa)
    expectations = Expectations()
    sync = NodeSetSync(
        kube,
        nodesets=nodesets,
        clusters=clusters,
        pods=pods,
        services=services,
        pdbs=pdbs,
        nodes=nodes,
        revisions=revisions,
        clients=clients,
        recorder=recorder,
        expectations=expectations,
        hpas=hpas,
        node_health=node_health,
        gres_resources=gres_resources,
        placement_config=placement,
    )
    ctrl = Controller("nodeset", sync, workers=workers)
    # An HPA made, changed or deleted: the NodeSet it scales (its status changes are not
    # kept, see slim_hpa, so they do not come here).
    ctrl.watch(
        hpas,
        hpa_target,
        predicate=lambda old, new: (
            old is None
            or (old["spec"], old["status"])
            != (
                new["spec"],
                new["status"],
            )
        ),
    )
    ctrl.watch(nodesets, predicate=beyond_status)
    ctrl.watch(
        clusters,
        lambda c: [key_of(n) for n in nodesets.by_index(BY_CLUSTER, key_of(c))],
        predicate=lambda old, new: old is None or old.get("spec") != new.get("spec"),
    )
    to_owner = owner_mapper("NodeSet")
    ctrl.watch(pods, to_owner)
    ctrl.watch(services, to_owner, predicate=lambda old, new: old is None)
    ctrl.watch(pdbs, to_owner, predicate=lambda old, new: old is None)
    ctrl.watch(revisions, to_owner, predicate=lambda old, new: old is None)

    def observed_add(pod: JSON) -> None:
        if k := expectation_key(pod):
            expectations.creation_observed(k)

    def observed_delete(pod: JSON) -> None:
        if k := expectation_key(pod):
            expectations.deletion_observed(k, pod["metadata"]["uid"])

    def observed_update(_old: JSON, pod: JSON) -> None:
        # Like kube-controller-manager: a pod being deleted gracefully counts as deleted
        # once its deletionTimestamp shows, not seconds later when its preStop and
        # containers are done; the next decision must not wait for that.
        if pod["metadata"].get("deletionTimestamp"):
            observed_delete(pod)

    pods.add_handler(
        Handler(on_add=observed_add, on_update=observed_update, on_delete=observed_delete)
    )

    placed = placement or Placement()

    def node_changed(old: JSON | None, new: JSON) -> bool:
        def cordon(n: JSON | None) -> tuple[Any, Any, Any, Any]:
            if n is None:
                return (None, None, None, None)
            ann = n["metadata"].get("annotations") or {}
            return (
                (n.get("spec") or {}).get("unschedulable"),
                ann.get(builder.ANNOTATION_NODE_CORDON_REASON),
                (n.get("status") or {}).get("conditions"),
                (placed.labels_of(n["metadata"].get("labels") or {}), ann.get(TOPOLOGY_SPEC)),
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
        elif event.kind == "partition":
            for ns_obj in nodesets.by_index(BY_CLUSTER, cluster_key):
                if partition_of(ns_obj) == event.name:
                    ctrl.enqueue(key_of(ns_obj))
        elif event.kind == "node":
            pod = pods.get(f"{namespace}/{event.name}")
            if pod is not None:
                for key in to_owner(pod):
                    ctrl.enqueue(key)
            elif event.new is not None and slurmd_gone(event.new, namespace):
                # A node whose pod is gone: its NodeSet deletes it (forget_departed).
                owner = f"{namespace}/{event.name.rsplit('-', 1)[0]}"
                if nodesets.get(owner) is not None:
                    ctrl.enqueue(owner)

    clients.subscribe(on_slurm)
    return ctrl
