"""What a NodeSet pod's metadata and status say (pure queries, used by every step)."""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

from slinky.operator.nodeset.builder import ANNOTATION_CONDEMNED, LABEL_REVISION

JSON = dict[str, Any]


def name(pod: JSON) -> str:
    return str(pod["metadata"]["name"])


def uid(pod: JSON) -> str:
    return str(pod["metadata"]["uid"])


def phase(pod: JSON) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def node_name(pod: JSON) -> str | None:
    """The Kubernetes node the pod is bound to (None until scheduled)."""
    value = (pod.get("spec") or {}).get("nodeName")
    return str(value) if value else None


def annotation(pod: JSON, key: str) -> str | None:
    value = (pod["metadata"].get("annotations") or {}).get(key)
    return str(value) if value is not None else None


def label(pod: JSON, key: str) -> str | None:
    value = (pod["metadata"].get("labels") or {}).get(key)
    return str(value) if value is not None else None


def revision_of(pod: JSON) -> str:
    return label(pod, LABEL_REVISION) or ""


def condemned(pod: JSON) -> str | None:
    """Why the operator is removing this pod ("scale-in", "update", "nodeset deleted")."""
    return annotation(pod, ANNOTATION_CONDEMNED)


def ready_since(pod: JSON) -> dt.datetime | None:
    """When the pod last became Ready, or None if it is not Ready."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            if c.get("status") != "True":
                return None
            ts = c.get("lastTransitionTime")
            if ts:
                return parse_time(str(ts))
            return dt.datetime.now(dt.UTC)
    return None


@functools.lru_cache(maxsize=4096)
def parse_time(ts: str) -> dt.datetime:
    """An RFC 3339 time; cached because thousands of pods share a handful of seconds and
    every reconcile of a large NodeSet asks for each pod."""
    return dt.datetime.fromisoformat(ts.replace("Z", "+00:00"))


def is_ready(pod: JSON) -> bool:
    return ready_since(pod) is not None
