"""What a NodeSet pod's metadata and status say (pure queries, used by every step).

Every reconcile of a NodeSet asks these questions of each of its pods, several times; with
5,000 pods that must not mean re-reading the same nested dicts each time. The pod informer
stores pods through `slim` (a transform on store): only the fields read here, as a
`CachedPod` that carries its answers (`Facts`), computed once per pod version. A pod that
did not come from the informer (a test's, one just built) is read field by field instead.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Any

from slinky.operator.nodeset.builder import ANNOTATION_CONDEMNED, LABEL_REVISION
from slinky.types import JSON


@dataclass(frozen=True, slots=True)
class Facts:
    name: str
    deleting: bool  # deletion requested (deletionTimestamp set)
    node_name: str | None
    phase: str
    revision: str
    condemned: str | None
    ready: bool
    # When the pod became Ready; None when Ready without a transition time (then: now).
    ready_at: dt.datetime | None

    @staticmethod
    def of(pod: JSON) -> Facts:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        ready, ready_at = False, None
        for c in status.get("conditions") or []:
            if c.get("type") == "Ready":
                ready = c.get("status") == "True"
                ts = c.get("lastTransitionTime")
                ready_at = parse_time(str(ts)) if ready and ts else None
                break
        condemned_value = annotations.get(ANNOTATION_CONDEMNED)
        return Facts(
            name=str(meta["name"]),
            deleting=bool(meta.get("deletionTimestamp")),
            node_name=str(spec["nodeName"]) if spec.get("nodeName") else None,
            phase=str(status.get("phase") or "Pending"),
            revision=str(labels.get(LABEL_REVISION) or ""),
            condemned=str(condemned_value) if condemned_value is not None else None,
            ready=ready,
            ready_at=ready_at,
        )


class CachedPod(dict[str, Any]):
    """A pod as the informer stores it: the JSON the operator reads, plus its `Facts`."""

    __slots__ = ("facts",)

    def __init__(self, data: JSON) -> None:
        super().__init__(data)
        self.facts = Facts.of(self)


def slim(pod: JSON) -> JSON:
    """The part of a pod the operator reads: metadata without managedFields,
    `spec.nodeName`, `status.phase`, `status.conditions` and `status.podIP`. A 5,000-pod
    cache is a fraction of the size of whole pods; the operator never writes a cached pod
    back (it patches)."""
    meta = {k: v for k, v in pod["metadata"].items() if k != "managedFields"}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    return CachedPod(
        {
            "apiVersion": pod.get("apiVersion"),
            "kind": pod.get("kind"),
            "metadata": meta,
            "spec": {"nodeName": spec["nodeName"]} if spec.get("nodeName") else {},
            "status": {k: status[k] for k in ("phase", "conditions", "podIP") if k in status},
        }
    )


def facts(pod: JSON) -> Facts:
    if isinstance(pod, CachedPod):
        return pod.facts
    return Facts.of(pod)


def name(pod: JSON) -> str:
    return facts(pod).name


def uid(pod: JSON) -> str:
    return str(pod["metadata"]["uid"])


def phase(pod: JSON) -> str:
    return facts(pod).phase


def node_name(pod: JSON) -> str | None:
    """The Kubernetes node the pod is bound to (None until scheduled)."""
    return facts(pod).node_name


def annotation(pod: JSON, key: str) -> str | None:
    value = (pod["metadata"].get("annotations") or {}).get(key)
    return str(value) if value is not None else None


def label(pod: JSON, key: str) -> str | None:
    value = (pod["metadata"].get("labels") or {}).get(key)
    return str(value) if value is not None else None


def revision_of(pod: JSON) -> str:
    return facts(pod).revision


def condemned(pod: JSON) -> str | None:
    """Why the operator is removing this pod ("scale-in", "update", "nodeset deleted")."""
    return facts(pod).condemned


def ready_since(pod: JSON) -> dt.datetime | None:
    """When the pod last became Ready, or None if it is not Ready."""
    f = facts(pod)
    if not f.ready:
        return None
    return f.ready_at or dt.datetime.now(dt.UTC)


@functools.lru_cache(maxsize=4096)
def parse_time(ts: str) -> dt.datetime:
    """An RFC 3339 time; cached because thousands of pods share a handful of seconds."""
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))


def is_ready(pod: JSON) -> bool:
    return facts(pod).ready
