"""metav1.LabelSelector: parse and validate one from config, and match labels against it.

The apiserver validates selectors inside objects it stores; a selector that comes from a
config file has no such guard, so `parse_label_selector` checks it the same way and names
the offending field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")


class SelectorError(ValueError):
    """A malformed selector; `path` names the field (e.g. `matchExpressions[0].operator`)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


@dataclass(frozen=True)
class Requirement:
    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        if self.operator == "In":
            return labels.get(self.key) in self.values
        return self.key not in labels or labels[self.key] not in self.values  # NotIn

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "operator": self.operator}
        if self.operator in ("In", "NotIn"):
            out["values"] = list(self.values)
        return out


@dataclass(frozen=True)
class LabelSelector:
    """A parsed selector. Empty matches everything (as in Kubernetes)."""

    match_labels: tuple[tuple[str, str], ...] = ()
    match_expressions: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        if any(labels.get(k) != v for k, v in self.match_labels):
            return False
        return all(r.matches(labels) for r in self.match_expressions)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.match_labels:
            out["matchLabels"] = dict(self.match_labels)
        if self.match_expressions:
            out["matchExpressions"] = [r.to_json() for r in self.match_expressions]
        return out


def _strings(value: Any, path: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise SelectorError(path, "must be a list of strings")
    return tuple(value)


def parse_label_selector(data: Any) -> LabelSelector:
    """A LabelSelector from its JSON form; SelectorError names the bad field."""
    if not isinstance(data, dict):
        raise SelectorError("", "must be a mapping with matchLabels and/or matchExpressions")
    unknown = sorted(set(data) - {"matchLabels", "matchExpressions"})
    if unknown:
        raise SelectorError(unknown[0], "unknown field (use matchLabels or matchExpressions)")
    labels = data.get("matchLabels") or {}
    if not isinstance(labels, dict):
        raise SelectorError("matchLabels", "must be a mapping of label to value")
    for k, v in labels.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise SelectorError(f"matchLabels.{k}", "label values must be strings")
    exprs = data.get("matchExpressions") or []
    if not isinstance(exprs, list):
        raise SelectorError("matchExpressions", "must be a list")
    reqs: list[Requirement] = []
    for i, expr in enumerate(exprs):
        path = f"matchExpressions[{i}]"
        if not isinstance(expr, dict):
            raise SelectorError(path, "must be a mapping with key, operator and values")
        extra = sorted(set(expr) - {"key", "operator", "values"})
        if extra:
            raise SelectorError(f"{path}.{extra[0]}", "unknown field")
        key, op = expr.get("key"), expr.get("operator")
        if not isinstance(key, str) or not key:
            raise SelectorError(f"{path}.key", "required")
        if op not in OPERATORS:
            raise SelectorError(f"{path}.operator", f"must be one of {', '.join(OPERATORS)}")
        values = _strings(expr.get("values") or [], f"{path}.values")
        if op in ("In", "NotIn") and not values:
            raise SelectorError(f"{path}.values", f"must not be empty for {op}")
        if op in ("Exists", "DoesNotExist") and values:
            raise SelectorError(f"{path}.values", f"must be empty for {op}")
        reqs.append(Requirement(key, str(op), values))
    return LabelSelector(tuple(sorted(labels.items())), tuple(reqs))
