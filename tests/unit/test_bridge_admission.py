"""The admission webhook's rules as data: what is mutated, what is refused and with which
message; and the webhook registrations it is installed with."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from slinky.bridge.admission import manifests, mutate, validate
from slinky.bridge.admission.server import review_response
from slinky.bridge.config import parse_config
from slinky.bridge.labels import (
    FINALIZER,
    SLURM_JOBID,
    SLURM_JOBID_ANNOTATION,
    SLURM_NODE,
    SLURMJOB_PREFIX,
)

JSON = dict[str, Any]
REPO = Path(__file__).resolve().parents[2]
CONFIG = parse_config({}, environ={})
TOLERATION = {
    "key": "slinky.slurm.net/managed-node",
    "operator": "Equal",
    "value": "slurm-bridge-scheduler",
    "effect": "NoExecute",
}


def pod(
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> JSON:
    return {
        "metadata": {"name": "p", "labels": labels or {}, "annotations": annotations or {}},
        "spec": {"containers": [{"name": "c", "image": "i"}], **spec},
    }


def apply_patch(obj: JSON, ops: list[JSON]) -> JSON:
    """Enough of RFC 6902 for the webhook's own patches."""
    out = json.loads(json.dumps(obj))
    for op in ops:
        *parents, last = op["path"].strip("/").split("/")
        target = out
        for part in parents:
            target = target[part]
        if last == "-":
            target.append(op["value"])
        else:
            target[last] = op["value"]
    return out


# ---------------------------------------------------------------- mutation


def test_default_scheduler_becomes_the_bridges_and_the_taint_is_tolerated() -> None:
    before = pod(schedulerName="default-scheduler")
    after = apply_patch(before, mutate.pod_patch(before, CONFIG))
    assert after["spec"]["schedulerName"] == "slurm-bridge-scheduler"
    assert after["spec"]["tolerations"] == [TOLERATION]


def test_existing_tolerations_are_kept() -> None:
    other = {"key": "gpu", "operator": "Exists"}
    before = pod(tolerations=[other])
    after = apply_patch(before, mutate.pod_patch(before, CONFIG))
    assert after["spec"]["tolerations"] == [other, TOLERATION]


def test_a_pod_already_tolerating_the_taint_gets_no_second_toleration() -> None:
    before = pod(
        schedulerName="slurm-bridge-scheduler",
        tolerations=[{"key": "slinky.slurm.net/managed-node", "operator": "Exists"}],
    )
    assert mutate.pod_patch(before, CONFIG) == []


def test_a_pod_naming_another_scheduler_is_left_alone() -> None:
    assert mutate.pod_patch(pod(schedulerName="volcano"), CONFIG) == []


def test_a_pod_with_a_node_name_is_left_alone() -> None:
    assert mutate.pod_patch(pod(nodeName="n1"), CONFIG) == []


def test_no_toleration_when_tainting_is_off() -> None:
    config = parse_config({"managedNodeTaint": {"enabled": False}}, environ={})
    ops = mutate.pod_patch(pod(), config)
    assert ops == [{"op": "add", "path": "/spec/schedulerName", "value": "slurm-bridge-scheduler"}]


# ---------------------------------------------------------------- validation


def create(p: JSON) -> list[str]:
    return validate.violations(validate.Request("CREATE", p))


def update(old: JSON, new: JSON, sub_resource: str = "") -> list[str]:
    return validate.violations(validate.Request("UPDATE", new, old, sub_resource))


def test_a_plain_pod_passes() -> None:
    assert create(pod()) == []


def test_every_rule_has_a_distinct_message() -> None:
    names = [r.name for r in validate.RULES]
    assert len(names) == len(set(names))
    assert len({r.message for r in validate.RULES}) == len(names)


@pytest.mark.parametrize(
    ("p", "message"),
    [
        (pod(labels={SLURM_JOBID: "12"}), f"label {SLURM_JOBID} is set by slurm-bridge"),
        (pod(annotations={SLURM_NODE: "n1"}), f"annotation {SLURM_NODE} is set by slurm-bridge"),
        (
            pod(annotations={SLURMJOB_PREFIX + "timelimt": "5"}),
            f"unknown annotation {SLURMJOB_PREFIX}timelimt (did you mean "
            f"{SLURMJOB_PREFIX}timelimit?); known",
        ),
        (
            pod(annotations={SLURMJOB_PREFIX + "cpus-per-task": "2"}),
            f"(did you mean {SLURMJOB_PREFIX}cpu-per-task?)",
        ),
        (
            pod(annotations={SLURMJOB_PREFIX + "colour": "2"}),
            f"unknown annotation {SLURMJOB_PREFIX}colour; known",
        ),
        (
            pod(annotations={SLURMJOB_PREFIX + "cpu-per-task": "two"}),
            f"annotation {SLURMJOB_PREFIX}cpu-per-task must be a whole number (base 10) of at "
            "least 1, got 'two'",
        ),
        (
            pod(annotations={SLURMJOB_PREFIX + "min-nodes": "0"}),
            "min-nodes must be a whole number (base 10) of at least 1, got '0'",
        ),
        (
            pod(annotations={SLURMJOB_PREFIX + "priority": "-1"}),
            "priority must be a whole number (base 10) of at least 0",
        ),
        (
            pod(annotations={SLURMJOB_PREFIX + "timelimit": "1:00:00"}),
            f"annotation {SLURMJOB_PREFIX}timelimit is the time limit in whole minutes",
        ),
        (
            pod(annotations={SLURMJOB_PREFIX + "exclusive": "yes"}),
            f'annotation {SLURMJOB_PREFIX}exclusive must be "true" or "false", got \'yes\'',
        ),
        (
            pod(
                annotations={SLURMJOB_PREFIX + "min-nodes": "4", SLURMJOB_PREFIX + "max-nodes": "2"}
            ),
            "min-nodes (4) is larger than",
        ),
        (
            pod(resourceClaims=[{"name": "gpu", "resourceClaimName": "c"}]),
            "resourceClaims (dynamic resource allocation) are not supported",
        ),
        (
            pod(topologySpreadConstraints=[{"maxSkew": 1, "topologyKey": "zone"}]),
            "spec.topologySpreadConstraints are not supported by slurm-bridge",
        ),
    ],
)
def test_each_create_rule_refuses_with_its_message(p: JSON, message: str) -> None:
    problems = create(p)
    assert len(problems) == 1, problems
    assert message in problems[0]


def test_container_resource_claims_are_refused_too() -> None:
    p = pod()
    p["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    assert "resourceClaims" in create(p)[0]


def test_good_slurmjob_annotations_pass() -> None:
    good = {SLURMJOB_PREFIX + k: v for k, v in {
        "account": "a", "timelimit": "90", "exclusive": "false", "cpu-per-task": "2",
        "mem-per-node": "1024", "min-nodes": "1", "max-nodes": "2", "priority": "0",
        "user-id": "1000", "group-id": "1000", "partition": "p", "qos": "normal",
    }.items()}  # fmt: skip
    assert create(pod(annotations=good)) == []


def test_job_id_and_node_cannot_change_on_a_bound_pod() -> None:
    old = pod(labels={SLURM_JOBID: "12"}, annotations={SLURM_NODE: "n1"}, nodeName="n1")
    new = pod(labels={SLURM_JOBID: "13"}, annotations={}, nodeName="n1")
    problems = update(old, new)
    assert len(problems) == 2
    assert f"label {SLURM_JOBID} cannot be changed" in problems[0]
    assert f"annotation {SLURM_NODE} cannot be changed" in problems[1]


def test_the_label_may_follow_the_binding_only_with_the_job_the_binding_named() -> None:
    """A pod Slurm allocated inside the request is bound first, the job id in the Binding's
    annotations; the scheduler then adds the label, which must name that job."""
    old = pod(annotations={SLURM_NODE: "n1", SLURM_JOBID_ANNOTATION: "12"}, nodeName="n1")
    follows = pod(
        labels={SLURM_JOBID: "12"},
        annotations={SLURM_NODE: "n1", SLURM_JOBID_ANNOTATION: "12"},
        nodeName="n1",
    )
    follows["metadata"]["finalizers"] = [FINALIZER]  # label and finalizer in one write
    assert update(old, follows) == []
    follows["metadata"]["finalizers"] = []
    assert f"label {SLURM_JOBID} cannot be changed" in update(old, follows)[0]  # alone
    other = pod(labels={SLURM_JOBID: "13"}, annotations=dict(old["metadata"]["annotations"]))
    assert f"label {SLURM_JOBID} cannot be changed" in update(old, other)[0]
    moved = pod(annotations={SLURM_NODE: "n1", SLURM_JOBID_ANNOTATION: "13"}, nodeName="n1")
    assert update(old, moved) == [
        f"annotation {SLURM_JOBID_ANNOTATION} cannot be changed or removed once the pod is "
        "bound to a node: it names the Slurm node and job allocated to the pod"
    ]
    assert f"annotation {SLURM_JOBID_ANNOTATION} is set by slurm-bridge" in " ".join(
        create(pod(annotations={SLURM_JOBID_ANNOTATION: "12"}))
    )


def test_the_scheduler_may_set_job_id_and_node_before_binding() -> None:
    old = pod()
    new = pod(labels={SLURM_JOBID: "12"}, annotations={SLURM_NODE: "n1"})
    assert update(old, new) == []


def test_a_bad_annotation_admitted_earlier_does_not_block_other_updates() -> None:
    old = pod(annotations={SLURMJOB_PREFIX + "bogus": "1"})
    new = pod(annotations={SLURMJOB_PREFIX + "bogus": "1"}, labels={"x": "y"})
    assert update(old, new) == []
    changed = pod(annotations={SLURMJOB_PREFIX + "bogus": "2"})
    assert "unknown annotation" in update(old, changed)[0]


def test_in_place_resize_is_refused() -> None:
    problems = update(pod(nodeName="n1"), pod(nodeName="n1"), sub_resource="resize")
    assert len(problems) == 1
    assert "in-place resize is not supported" in problems[0]
    assert "delete the pod and create it" in problems[0]


def test_review_response_carries_patch_and_denial() -> None:
    ok = review_response("u1", allowed=True, patch=[{"op": "add", "path": "/x", "value": 1}])
    assert ok["response"]["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(ok["response"]["patch"])) == [
        {"op": "add", "path": "/x", "value": 1}
    ]
    denied = review_response("u2", allowed=False, message="no")
    assert denied["response"] == {
        "uid": "u2",
        "allowed": False,
        "status": {"code": 403, "reason": "Forbidden", "message": "no"},
    }


# ---------------------------------------------------------------- registrations


def selector_values(webhook: JSON, operator: str) -> list[str]:
    for expr in webhook["namespaceSelector"]["matchExpressions"]:
        if expr["operator"] == operator:
            return list(expr["values"])
    return []


def test_registrations_never_match_kube_system_or_the_bridges_namespace() -> None:
    objs = manifests.webhook_configurations(CONFIG, own_namespace="bridge-ns")
    hooks = [h for o in objs for h in o["webhooks"]]
    assert len(hooks) == 3
    for hook in hooks:
        assert set(selector_values(hook, "NotIn")) >= {"kube-system", "bridge-ns"}


def test_only_managed_namespaces_fail_closed() -> None:
    mutating, validating = manifests.webhook_configurations(CONFIG)
    (mhook,) = mutating["webhooks"]
    managed, other = validating["webhooks"]
    for hook in (mhook, managed):
        assert hook["failurePolicy"] == "Fail"
        assert selector_values(hook, "In") == ["slurm-bridge"]
    assert other["failurePolicy"] == "Ignore"
    assert "slurm-bridge-scheduler" in other["matchConditions"][0]["expression"]
    assert "pods/resize" in managed["rules"][0]["resources"]


def test_a_selector_config_becomes_the_namespace_selector() -> None:
    config = parse_config(
        {"managedNamespaceSelector": {"matchLabels": {"slurm": "yes"}}}, environ={}
    )
    mutating, _ = manifests.webhook_configurations(config)
    selector = mutating["webhooks"][0]["namespaceSelector"]
    assert selector["matchLabels"] == {"slurm": "yes"}
    assert selector["matchExpressions"][-1]["operator"] == "NotIn"


def test_checked_in_registrations_are_what_the_code_renders() -> None:
    path = REPO / "config" / "webhook" / "bridge_webhooks.yaml"
    rendered = manifests.HEADER + manifests.render(manifests.webhook_configurations(CONFIG))
    assert path.read_text() == rendered, (
        "config/webhook/bridge_webhooks.yaml is stale: run "
        "python -m slinky.bridge.admission.manifests --output config/webhook/bridge_webhooks.yaml"
    )
    assert len(list(yaml.safe_load_all(path.read_text()))) == 2


# ---------------------------------------------------------------- the tenancy policy

POLICY = parse_config(
    {
        "policy": {
            "namespaces": {
                "team-a": {"users": ["alice"], "groups": ["alice"], "accounts": ["physics"]}
            }
        }
    }
).policy


def policy_request(operation: str, new: JSON, old: JSON | None = None) -> validate.Request:
    return validate.Request(
        operation,
        new,
        old,
        rule=POLICY.rule_for("team-a"),
        partition="slurm-bridge",
        who="pods of namespace team-a (ServiceAccount default)",
    )


def test_a_pod_asking_for_another_account_or_user_is_refused_naming_the_rule() -> None:
    asked = pod(annotations={SLURMJOB_PREFIX + "account": "finance"})
    (message,) = validate.violations(policy_request("CREATE", asked))
    assert "'finance' is not allowed for pods of namespace team-a" in message
    assert "allowed: physics; config policy.namespaces.team-a.accounts" in message
    root = pod(annotations={SLURMJOB_PREFIX + "user-id": "0"})
    (message,) = validate.violations(policy_request("CREATE", root))
    assert "policy.namespaces.team-a.users" in message
    fine = pod(annotations={SLURMJOB_PREFIX + "account": "physics"})
    assert validate.violations(policy_request("CREATE", fine)) == []


def test_an_update_is_judged_only_when_it_changes_what_the_policy_decides() -> None:
    """A pod admitted before the policy changed is not wedged by it."""
    before = pod(annotations={SLURMJOB_PREFIX + "account": "finance"})
    relabelled = pod(labels={"x": "y"}, annotations={SLURMJOB_PREFIX + "account": "finance"})
    assert validate.violations(policy_request("UPDATE", relabelled, before)) == []
    changed = pod(annotations={SLURMJOB_PREFIX + "qos": "high"})
    assert validate.violations(policy_request("UPDATE", changed, pod())) != []
