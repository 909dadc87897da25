"""NodeSet: a scalable set of homogeneous Slurm nodes, one pod each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from slinky.api.schema import IntOrString, prop
from slinky.api.v1alpha1 import podtemplate
from slinky.api.v1alpha1.common import CONDITIONS_SCHEMA, Condition

KIND = "NodeSet"
PLURAL = "nodesets"

_LABELS = {
    "type": "object",
    "maxProperties": 64,
    "additionalProperties": {"type": "string", "maxLength": 63},
}
MAX_CONTAINERS = 256


def pod_template_schema() -> dict[str, Any]:
    """core/v1 PodTemplateSpec's own structure (podtemplate.py): an unknown field such as
    `resurces:` is refused (kubectl's strict field validation) or pruned, as in a StatefulSet,
    never kept and silently ignored when the pod is made."""
    out = podtemplate.schema(_LABELS, MAX_CONTAINERS)
    return {
        "description": "Pod template (core/v1 PodTemplateSpec). The container named `slurmd` "
        "is the Slurm node.",
        **out,
    }


PVC_TEMPLATES_SCHEMA: dict[str, Any] = {
    "type": "array",
    "description": "PersistentVolumeClaims made for each pod, as in a StatefulSet.",
    "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
}


@dataclass
class LabelSelectorRequirement:
    key: str = prop(required=True)
    operator: str = prop(required=True, enum=["In", "NotIn", "Exists", "DoesNotExist"])
    values: list[str] | None = prop()


@dataclass
class LabelSelector:
    """Which pods belong to the NodeSet; must match the template's labels."""

    match_labels: dict[str, str] | None = prop(schema=_LABELS)
    match_expressions: list[LabelSelectorRequirement] | None = prop()


@dataclass
class RollingUpdate:
    max_unavailable: IntOrString | None = prop(
        default=1,
        description="Pods (or percent of replicas) that may be unavailable during an update; "
        "old and new pods count together. Never 0.",
        rules=[
            (
                "type(self) == int ? self > 0 : self.matches('^[0-9]+%$') && self != '0%'",
                "maxUnavailable must be a positive integer or a positive percentage",
            )
        ],
    )
    partition: int = prop(
        default=0, minimum=0, description="Only ordinals >= partition are updated."
    )


@dataclass
class UpdateStrategy:
    type: str = prop(default="RollingUpdate", enum=["RollingUpdate", "OnDelete"])
    rolling_update: RollingUpdate | None = prop(default={})


@dataclass
class PVCRetentionPolicy:
    when_deleted: str = prop(default="Retain", enum=["Retain", "Delete"])
    when_scaled: str = prop(default="Retain", enum=["Retain", "Delete"])


@dataclass
class NodeSetPartition:
    """A Slurm partition made of this NodeSet's nodes."""

    enabled: bool = prop(default=False)
    config: str = prop(default="", description="Extra partition options, e.g. MaxTime=60.")
    name: str | None = prop(
        description="Partition name (default: the NodeSet's name). It cannot change once "
        "the operator made the partition.",
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$",
    )


@dataclass
class NodeSetSpec:
    __validations__ = [
        (
            "!has(self.selector.matchLabels) || self.selector.matchLabels.all(k, "
            "has(self.template.metadata) && has(self.template.metadata.labels) && "
            "k in self.template.metadata.labels && "
            "self.template.metadata.labels[k] == self.selector.matchLabels[k])",
            "spec.selector.matchLabels must match spec.template.metadata.labels",
            ".selector",
        )
    ]

    cluster_name: str = prop(
        required=True,
        description="The Cluster (same namespace) whose Slurm the pods join. Immutable.",
        rules=[("self == oldSelf", "clusterName is immutable")],
    )
    replicas: int = prop(default=1, minimum=0, description="Desired pods (Slurm nodes).")
    selector: LabelSelector = prop(required=True)
    service_name: str | None = prop(
        description="Headless Service for stable pod DNS (created if absent; default the "
        "NodeSet's name)."
    )
    template: dict[str, Any] = prop(
        required=True,
        schema=pod_template_schema,
        rules=[
            (
                "has(self.spec) && has(self.spec.containers) && "
                "self.spec.containers.exists(c, has(c.name) && c.name == 'slurmd')",
                "the pod template needs a container named slurmd (spec.template.spec.containers"
                "): it runs slurmd, the Slurm node; without it the pods never join Slurm",
            )
        ],
    )
    volume_claim_templates: list[dict[str, Any]] | None = prop(schema=PVC_TEMPLATES_SCHEMA)
    update_strategy: UpdateStrategy = prop(default={})
    revision_history_limit: int = prop(default=10, minimum=0)
    persistent_volume_claim_retention_policy: PVCRetentionPolicy = prop(default={})
    min_ready_seconds: int = prop(default=0, minimum=0)
    partition: NodeSetPartition | None = prop()


@dataclass
class NodeSetStatus:
    replicas: int | None = prop()
    ready_replicas: int | None = prop()
    available_replicas: int | None = prop()
    updated_replicas: int | None = prop()
    current_replicas: int | None = prop()
    current_revision: str | None = prop()
    update_revision: str | None = prop()
    collision_count: int | None = prop()
    observed_generation: int | None = prop()
    selector: str | None = prop(description="Label selector in string form (for HPA).")
    slurm_idle: int | None = prop()
    slurm_allocated: int | None = prop(description="ALLOCATED or MIXED.")
    slurm_down: int | None = prop()
    slurm_drain: int | None = prop()
    conditions: list[Condition] | None = prop(schema=CONDITIONS_SCHEMA)


@dataclass
class NodeSet:
    spec: NodeSetSpec = prop(required=True)
    status: NodeSetStatus | None = prop()


PRINTER_COLUMNS: list[dict[str, Any]] = [
    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
    {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
    {
        "name": "Updated",
        "type": "integer",
        "jsonPath": ".status.updatedReplicas",
        "description": "Pods of the current template revision",
    },
    {"name": "Idle", "type": "integer", "jsonPath": ".status.slurmIdle"},
    {"name": "Allocated", "type": "integer", "jsonPath": ".status.slurmAllocated"},
    {"name": "Down", "type": "integer", "jsonPath": ".status.slurmDown"},
    {"name": "Drain", "type": "integer", "jsonPath": ".status.slurmDrain"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
]
