"""Types shared by the custom resources."""

from __future__ import annotations

from dataclasses import dataclass

from slinky.api.schema import prop

DURATION_PATTERN = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"

CONDITIONS_SCHEMA = {
    "type": "array",
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
    "items": {
        "type": "object",
        "required": ["type", "status", "lastTransitionTime", "reason", "message"],
        "properties": {
            "type": {"type": "string", "maxLength": 316},
            "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
            "reason": {"type": "string", "maxLength": 1024},
            "message": {"type": "string", "maxLength": 32768},
            "lastTransitionTime": {"type": "string", "format": "date-time"},
            "observedGeneration": {"type": "integer", "format": "int64", "minimum": 0},
        },
    },
}


@dataclass
class Condition:
    """A status condition (metav1.Condition)."""

    type: str = prop(required=True)
    status: str = prop(required=True)
    reason: str = prop(default="")
    message: str = prop(default="")
    last_transition_time: str | None = prop()
    observed_generation: int | None = prop()


def parse_duration(text: str) -> float:
    """Seconds in a Kubernetes duration such as "2s", "1m30s", "500ms"."""
    import re

    if not re.fullmatch(DURATION_PATTERN, text):
        raise ValueError(f"not a duration: {text!r} (e.g. 2s, 1m30s, 500ms)")
    total = 0.0
    for value, unit in re.findall(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)", text):
        total += float(value) * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]
    if total <= 0:
        raise ValueError(f"not a positive duration: {text!r}")
    return total
