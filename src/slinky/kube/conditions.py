"""Status conditions as the Kubernetes API conventions define them.

`lastTransitionTime` changes only when `status` changes; reason, message and
observedGeneration are updated in place.
"""

from __future__ import annotations

import datetime as dt

from slinky.types import JSON


def now_rfc3339() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def find(conditions: list[JSON] | None, type_: str) -> JSON | None:
    for c in conditions or []:
        if c.get("type") == type_:
            return c
    return None


def is_true(conditions: list[JSON] | None, type_: str) -> bool:
    c = find(conditions, type_)
    return bool(c and c.get("status") == "True")


def set_condition(
    conditions: list[JSON] | None,
    type_: str,
    status: bool | str,
    *,
    reason: str,
    message: str = "",
    observed_generation: int | None = None,
    now: str | None = None,
) -> tuple[list[JSON], bool]:
    """Return (new list, changed?). The input list is not modified."""
    st = ("True" if status else "False") if isinstance(status, bool) else status
    out = [dict(c) for c in conditions or []]
    cur = find(out, type_)
    if cur is None:
        cur = {"type": type_}
        out.append(cur)
        before: JSON = {}
    else:
        before = dict(cur)
    if cur.get("status") != st:
        cur["lastTransitionTime"] = now or now_rfc3339()
    cur["status"] = st
    cur["reason"] = reason
    cur["message"] = message
    if observed_generation is not None:
        cur["observedGeneration"] = observed_generation
    return out, cur != before
