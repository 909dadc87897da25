"""What the admission webhook refuses, as data: one rule per line of policy, each with the one
message a user sees at `kubectl apply` (instead of a pod pending for ever).

Rules see the request (operation, sub-resource, new and old pod) and return the values to
put into their message, or None when the pod passes. On UPDATE, `slurmjob.` annotations are
checked only where they changed, so a pod admitted before a rule existed is never wedged.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from slinky.bridge import policy
from slinky.bridge.labels import (
    FINALIZER,
    SLURM_JOBID,
    SLURM_JOBID_ANNOTATION,
    SLURM_NODE,
    SLURMJOB_PREFIX,
)
from slinky.types import JSON

# The `slurmjob.slinky.slurm.net/` annotations (upstream's keys) and what each must hold:
# "int>=N" a base-10 whole number of at least N, "minutes", "bool", or "text".
SLURMJOB_KEYS: dict[str, str] = {
    "account": "text",
    "constraints": "text",
    "cpu-per-task": "int>=1",
    "exclusive": "bool",
    "gang": "bool",
    "gres": "text",
    "group-id": "int>=0",
    "job-name": "text",
    "licenses": "text",
    "max-nodes": "int>=1",
    "mem-per-node": "int>=1",
    "min-nodes": "int>=1",
    "partition": "text",
    "priority": "int>=0",
    "qos": "text",
    "reservation": "text",
    "timelimit": "minutes",
    "user-id": "int>=0",
    "wckey": "text",
}
_WHOLE = re.compile(r"^[0-9]+$")


@dataclass(frozen=True)
class Request:
    """The parts of an AdmissionReview request the rules look at."""

    operation: str
    pod: JSON
    old: JSON | None = None
    sub_resource: str = ""
    # The tenancy policy's rule for the pod (its namespace and ServiceAccount), the bridge's
    # own partition, and who the pod is in messages; no rule: the policy is not checked.
    rule: policy.Rule | None = None
    partition: str = ""
    who: str = "this pod"

    def labels(self, which: JSON | None = None) -> dict[str, str]:
        obj = self.pod if which is None else which
        return dict(obj.get("metadata", {}).get("labels") or {})

    def annotations(self, which: JSON | None = None) -> dict[str, str]:
        obj = self.pod if which is None else which
        return dict(obj.get("metadata", {}).get("annotations") or {})

    @property
    def spec(self) -> JSON:
        return dict(self.pod.get("spec") or {})

    @property
    def old_is_bound(self) -> bool:
        return bool(self.old is not None and (self.old.get("spec") or {}).get("nodeName"))

    def new_slurmjob_annotations(self) -> Iterator[tuple[str, str, str]]:
        """(full key, key without prefix, value) of the slurmjob annotations to check: all of
        them on CREATE, only added or changed ones on UPDATE."""
        before = self.annotations(self.old) if self.old is not None else {}
        for key, value in sorted(self.annotations().items()):
            if key.startswith(SLURMJOB_PREFIX) and before.get(key) != value:
                yield key, key[len(SLURMJOB_PREFIX) :], str(value)


Check = Callable[[Request], Iterator[dict[str, Any]]]


@dataclass(frozen=True)
class Rule:
    """One admission rule: when it applies and the message each violation gets."""

    name: str
    operations: frozenset[str]
    message: str
    check: Check
    sub_resources: frozenset[str] = field(default=frozenset({""}))

    def violations(self, req: Request) -> list[str]:
        if req.operation not in self.operations or req.sub_resource not in self.sub_resources:
            return []
        return [self.message.format(**values) for values in self.check(req)]


def _preset_label(req: Request) -> Iterator[dict[str, Any]]:
    if SLURM_JOBID in req.labels():
        yield {}


def _preset_annotation(req: Request) -> Iterator[dict[str, Any]]:
    for key in sorted({SLURM_NODE, SLURM_JOBID_ANNOTATION} & set(req.annotations())):
        yield {"key": key}


def _label_changed(req: Request) -> Iterator[dict[str, Any]]:
    if not req.old_is_bound:
        return
    before, after = req.labels(req.old).get(SLURM_JOBID), req.labels().get(SLURM_JOBID)
    if (
        before is None
        and after == req.annotations(req.old).get(SLURM_JOBID_ANNOTATION)
        and FINALIZER in (req.pod.get("metadata", {}).get("finalizers") or [])
    ):
        # The label that follows the Binding, naming the job the Binding named, with the
        # finalizer (a label alone would read as a pod whose job was cancelled already).
        return
    if after != before:
        yield {}


def _annotation_changed(req: Request) -> Iterator[dict[str, Any]]:
    if not req.old_is_bound:
        return
    for key in (SLURM_NODE, SLURM_JOBID_ANNOTATION):
        if req.annotations().get(key) != req.annotations(req.old).get(key):
            yield {"key": key}


def _unknown_key(req: Request) -> Iterator[dict[str, Any]]:
    for key, short, _ in req.new_slurmjob_annotations():
        if short not in SLURMJOB_KEYS:
            close = difflib.get_close_matches(short, SLURMJOB_KEYS, n=1, cutoff=0.7)
            hint = f" (did you mean {SLURMJOB_PREFIX}{close[0]}?)" if close else ""
            yield {"key": key, "hint": hint}


def _not_whole(req: Request) -> Iterator[dict[str, Any]]:
    for key, short, value in req.new_slurmjob_annotations():
        kind = SLURMJOB_KEYS.get(short, "")
        if kind.startswith("int>="):
            least = int(kind[len("int>=") :])
            if not _WHOLE.match(value) or int(value) < least:
                yield {"key": key, "least": least, "value": value}


def _not_minutes(req: Request) -> Iterator[dict[str, Any]]:
    for key, short, value in req.new_slurmjob_annotations():
        if SLURMJOB_KEYS.get(short) == "minutes" and (not _WHOLE.match(value) or int(value) < 1):
            yield {"key": key, "value": value}


def _not_bool(req: Request) -> Iterator[dict[str, Any]]:
    for key, short, value in req.new_slurmjob_annotations():
        if SLURMJOB_KEYS.get(short) == "bool" and value not in ("true", "false"):
            yield {"key": key, "value": value}


def _nodes_range(req: Request) -> Iterator[dict[str, Any]]:
    ann = req.annotations()
    low, high = ann.get(SLURMJOB_PREFIX + "min-nodes"), ann.get(SLURMJOB_PREFIX + "max-nodes")
    changed = {k for k, _, _ in req.new_slurmjob_annotations()}
    if not changed & {SLURMJOB_PREFIX + "min-nodes", SLURMJOB_PREFIX + "max-nodes"}:
        return
    if low and high and _WHOLE.match(low) and _WHOLE.match(high) and int(low) > int(high):
        yield {"low": low, "high": high}


def _outside_policy(req: Request) -> Iterator[dict[str, Any]]:
    if req.rule is None:
        return
    changed = {short for _, short, _ in req.new_slurmjob_annotations()}
    if not changed & set(policy.GOVERNED):
        return  # nothing the policy decides was added or changed
    try:
        policy.decide(req.rule, req.annotations(), partition=req.partition, who=req.who)
    except policy.PolicyDenied as e:
        yield {"problem": str(e)}


def _resource_claims(req: Request) -> Iterator[dict[str, Any]]:
    spec = req.spec
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    if spec.get("resourceClaims") or any(
        (c.get("resources") or {}).get("claims") for c in containers
    ):
        yield {}


def _topology_spread(req: Request) -> Iterator[dict[str, Any]]:
    if req.spec.get("topologySpreadConstraints"):
        yield {}


def _resize(req: Request) -> Iterator[dict[str, Any]]:
    yield {}


CREATE = frozenset({"CREATE"})
UPDATE = frozenset({"UPDATE"})
BOTH = CREATE | UPDATE
KNOWN = ", ".join(SLURMJOB_KEYS)

RULES: tuple[Rule, ...] = (
    Rule(
        "job-id-label-preset",
        CREATE,
        f"label {SLURM_JOBID} is set by slurm-bridge when Slurm allocates the pod's job; "
        "remove it from the pod",
        _preset_label,
    ),
    Rule(
        "slurm-node-annotation-preset",
        CREATE,
        "annotation {key} is set by slurm-bridge when Slurm allocates the pod's job; "
        "remove it from the pod",
        _preset_annotation,
    ),
    Rule(
        "job-id-label-changed",
        UPDATE,
        f"label {SLURM_JOBID} cannot be changed or removed once the pod is bound to a node: "
        "it names the Slurm job the pod runs in",
        _label_changed,
    ),
    Rule(
        "slurm-node-annotation-changed",
        UPDATE,
        "annotation {key} cannot be changed or removed once the pod is bound to a node: "
        "it names the Slurm node and job allocated to the pod",
        _annotation_changed,
    ),
    Rule(
        "slurmjob-unknown-key",
        BOTH,
        "unknown annotation {key}{hint}; known " + SLURMJOB_PREFIX + " keys: " + KNOWN,
        _unknown_key,
    ),
    Rule(
        "slurmjob-not-a-whole-number",
        BOTH,
        "annotation {key} must be a whole number (base 10) of at least {least}, got {value!r}",
        _not_whole,
    ),
    Rule(
        "slurmjob-timelimit-not-minutes",
        BOTH,
        "annotation {key} is the time limit in whole minutes (at least 1), got {value!r}; "
        'e.g. "90" for an hour and a half',
        _not_minutes,
    ),
    Rule(
        "slurmjob-exclusive-not-boolean",
        BOTH,
        'annotation {key} must be "true" or "false", got {value!r}',
        _not_bool,
    ),
    Rule(
        "slurmjob-min-nodes-above-max-nodes",
        BOTH,
        f"annotation {SLURMJOB_PREFIX}min-nodes ({{low}}) is larger than "
        f"{SLURMJOB_PREFIX}max-nodes ({{high}})",
        _nodes_range,
    ),
    Rule(
        "slurm-identity-policy",
        BOTH,
        "{problem}",
        _outside_policy,
    ),
    Rule(
        "resource-claims",
        CREATE,
        "resourceClaims (dynamic resource allocation) are not supported by slurm-bridge yet; "
        "request devices through resources.limits (e.g. nvidia.com/gpu) or the annotation "
        f"{SLURMJOB_PREFIX}gres",
        _resource_claims,
    ),
    Rule(
        "topology-spread-constraints",
        CREATE,
        "spec.topologySpreadConstraints are not supported by slurm-bridge: Slurm chooses the "
        f"nodes; use a partition, {SLURMJOB_PREFIX}constraints (node features) or "
        f"{SLURMJOB_PREFIX}exclusive instead",
        _topology_spread,
    ),
    Rule(
        "in-place-resize",
        UPDATE,
        "in-place resize is not supported for pods scheduled by slurm-bridge: the Slurm job's "
        "allocation is fixed; delete the pod and create it with the new resources",
        _resize,
        sub_resources=frozenset({"resize"}),
    ),
)


def violations(req: Request, rules: tuple[Rule, ...] = RULES) -> list[str]:
    """Every message of every rule the request breaks (empty: allowed)."""
    return [message for rule in rules for message in rule.violations(req)]
