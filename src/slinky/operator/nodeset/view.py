"""What one reconcile of a NodeSet knows (`View`) and what it acts through (`Context`).

Every step module (`scalein`, `update`, `mirror`, `status`) takes these two, so a step reads
the same picture and writes through the same side-effect objects.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from slinky.api.v1alpha1.nodeset import NodeSetSpec
from slinky.kube import events, rest
from slinky.kube.expectations import Expectations
from slinky.kube.informer import Informer
from slinky.kube.nodehealth import NodeHealth
from slinky.operator.clients import Connection
from slinky.operator.nodeset import builder, pods
from slinky.operator.nodeset.podcontrol import PodControl
from slinky.slurm.models import Node
from slinky.types import JSON

if TYPE_CHECKING:
    from slinky.operator.nodeset.partition import Partitions


@dataclass(frozen=True)
class Placement:
    """Which Kubernetes node labels become Slurm features and topology (`placement`)."""

    feature_labels: tuple[str, ...] = ()
    topology_labels: tuple[str, ...] = ()
    # `<topology>:<switch>`: the tree topology and its switch (declared in topology.yaml,
    # with a child, so not a leaf) under which the switches of `topology_labels` are made.
    topology_root: str = "default:root"

    def gives_feature(self, key: str) -> bool:
        """Whether a Kubernetes node label with this key gives a Slurm feature."""
        return any(key == k or (k.endswith("/") and key.startswith(k)) for k in self.feature_labels)

    def watches(self, key: str) -> bool:
        """Whether a Kubernetes node label with this key is read."""
        return key in self.topology_labels or self.gives_feature(key)

    def labels_of(self, labels: Mapping[str, str]) -> dict[str, str]:
        """The labels read, of those given."""
        return {k: v for k, v in labels.items() if self.watches(k)}


@dataclass
class Context:
    """The side effects and shared caches a reconcile uses."""

    kube: rest.Kube
    podcontrol: PodControl
    recorder: events.EventRecorder
    nodes: Informer
    expectations: Expectations
    node_health: NodeHealth = field(default_factory=NodeHealth)
    # Extended resource -> Slurm GRES name, for the node size of pods (`builder.node_size`).
    gres_resources: Mapping[str, str] = field(
        default_factory=lambda: dict(builder.DEFAULT_GRES_RESOURCES)
    )
    # Kubernetes node labels -> Slurm features and topology (`placement`), and what was
    # last written per Slurm node: (body, when, accepted).
    placement: Placement = field(default_factory=Placement)
    placement_writes: dict[str, tuple[dict[str, Any], float, bool]] = field(default_factory=dict)
    # The NodeSets' own Slurm partitions (`partition.Partitions`): a pod's node leaves the
    # partition before its Slurm node is deleted. None: no NodeSet has one (unit tests).
    partitions: Partitions | None = None


@dataclass
class View:
    """What one reconcile knows about a NodeSet."""

    obj: JSON
    spec: NodeSetSpec
    key: str
    exp_key: str
    revision: str
    conf_server: str | None
    conn: Connection | None
    active: dict[str, JSON]  # by pod name: not being deleted
    terminating: dict[str, JSON]  # by pod name: deletion requested
    # Why no pod can be created: (reason, message), e.g. the Cluster has no spec.controller.
    conf_problem: tuple[str, str] | None = None
    # Set by the steps: why Slurm is being waited on (drives the informer's fast polling).
    waits: list[str] = field(default_factory=list)
    # Set by the steps: extra status conditions (type, ok, reason, message).
    conditions: list[tuple[str, bool, str, str]] = field(default_factory=list)
    # Set by the removal steps: pods condemned (or un-condemned) in this pass. Their cached
    # dicts no longer say what was just written, so the mirror leaves them to the next pass
    # (it would otherwise undo a drain made a moment ago).
    acted_on: set[str] = field(default_factory=set)
    # Set by the removal steps: pods this pass takes out (condemned or deleted); their nodes
    # are no longer written into the NodeSet's partition (`partition.members`).
    leaving: set[str] = field(default_factory=set)
    # Set by the steps: seconds after which the NodeSet must be looked at again, when no
    # event would come (a wait that ends on a clock).
    recheck: list[float] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"]["namespace"])

    @property
    def deleting(self) -> bool:
        return bool(self.obj["metadata"].get("deletionTimestamp"))

    @property
    def slurm_ready(self) -> bool:
        """True when the Slurm view of the Cluster is synced and current: only then are
        victims condemned and drains written."""
        return (
            self.conn is not None and self.conn.informer.has_synced and not self.conn.informer.stale
        )

    def slurm_fresh(self, why: str) -> bool:
        """Record that this NodeSet waits on Slurm (`why`), and whether the Slurm view is
        recent enough to choose on: polled since the wait began. The first reconcile of a
        scale-in or update only switches the informer to fast polling."""
        self.waits.append(why)
        return self.conn is not None and self.conn.informer.fresh_for(self.key)

    def ordinal(self, pod: JSON) -> int:
        o = builder.ordinal_of(self.name, pods.name(pod))
        return o if o is not None else 1 << 30

    def slurm_node(self, pod: JSON) -> Node | None:
        """The cached Slurm node of this pod; None when absent or when it belongs to a pod
        of another NodeSet (same name in another namespace pointing at the same Slurm)."""
        if self.conn is None:
            return None
        node = self.conn.informer.nodes.get(pods.name(pod))
        if node is None or not belongs_to(node, self.namespace, pods.name(pod)):
            return None
        return node

    def pods_with_nodes(self) -> list[tuple[JSON, Node]]:
        """Active pods with their own cached Slurm node (except those in `acted_on`),
        walking the smaller of the two (a NodeSet of 5,000 pods whose nodes never
        registered costs nothing here)."""
        if self.conn is None:
            return []
        nodes = self.conn.informer.nodes
        pairs: list[tuple[JSON, Node | None]]
        if len(nodes) < len(self.active):
            pairs = [(p, n) for n in nodes.values() if (p := self.active.get(n.name)) is not None]
        else:
            pairs = [(p, nodes.get(pods.name(p))) for p in self.active.values()]
        return [
            (p, n)
            for p, n in pairs
            if n is not None
            and pods.name(p) not in self.acted_on
            and belongs_to(n, self.namespace, pods.name(p))
        ]

    def foreign(self, pod: JSON) -> bool:
        """The Slurm node named like this pod is claimed by another pod: never touch it."""
        if self.conn is None:
            return False
        node = self.conn.informer.nodes.get(pods.name(pod))
        return node is not None and not belongs_to(node, self.namespace, pods.name(pod))

    def moved(self, pod: JSON) -> None:
        """The pod's deletion was requested: it is terminating from now on."""
        name = pods.name(pod)
        self.terminating[name] = self.active.pop(name, pod)


def belongs_to(node: Node, namespace: str, pod_name: str) -> bool:
    """Whether the Slurm node's comment (our JSON identity) names this pod. A node without
    our JSON comment is unclaimed (slurmd registered, comment not yet written)."""
    claimed = claimant(node.comment)
    return claimed is None or claimed == (namespace, pod_name)


@functools.lru_cache(maxsize=16384)
def claimant(comment: str) -> tuple[Any, Any] | None:
    """(namespace, podName) from our JSON identity comment; None for any other comment.
    Cached: every reconcile asks for each node of a NodeSet, and comments rarely change."""
    try:
        ident = json.loads(comment) if comment else None
    except ValueError:
        return None
    if not isinstance(ident, dict) or "namespace" not in ident:
        return None
    return (ident.get("namespace"), ident.get("podName"))
