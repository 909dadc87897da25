"""The tenancy policy: which Slurm user a pod's job runs as and what it may name, by the pod's
namespace (never its ServiceAccount); parsed from the config with errors that name the key."""

from __future__ import annotations

from typing import Any

import pytest

from slinky.bridge.config import ConfigError, parse_config
from slinky.bridge.labels import SLURMJOB_PREFIX
from slinky.bridge.policy import DEFAULT_GROUP, DEFAULT_USER, Identity, PolicyDenied, Rule, decide

POLICY = {
    "default": {"users": ["65534"], "groups": ["65534"]},
    "namespaces": {
        "team-a": {
            "users": ["alice", "2001"],
            "groups": ["alice", "physics"],
            "accounts": ["physics", "chem"],
            "defaultAccount": "physics",
            "qos": ["normal"],
            "partitions": ["gpu"],
        },
        "team-b": {"reservations": ["maint"]},
    },
}


def ann(**values: str) -> dict[str, str]:
    return {SLURMJOB_PREFIX + k.replace("_", "-"): v for k, v in values.items()}


def rule(namespace: str) -> Rule:
    return parse_config({"policy": POLICY}).policy.rule_for(namespace)


def test_with_no_policy_every_job_runs_as_nobody_never_root() -> None:
    got = decide(parse_config({}).policy.rule_for("any"), {}, partition="bridge")
    assert got == Identity(user=DEFAULT_USER, group=DEFAULT_GROUP, partition="bridge")
    assert (DEFAULT_USER, DEFAULT_GROUP) == ("65534", "65534")  # nobody, nogroup


def test_a_namespace_rule_gives_its_user_group_and_default_account() -> None:
    got = decide(rule("team-a"), {}, partition="bridge")
    assert (got.user, got.group, got.account, got.qos) == ("alice", "alice", "physics", None)


def test_a_pod_may_pick_what_its_rule_lists() -> None:
    got = decide(
        rule("team-a"),
        ann(user_id="2001", account="chem", qos="normal", partition="gpu"),
        partition="bridge",
    )
    assert (got.user, got.account, got.qos, got.partition) == ("2001", "chem", "normal", "gpu")
    assert decide(rule("team-a"), ann(partition="bridge"), partition="bridge").partition == "bridge"


@pytest.mark.parametrize(
    ("namespace", "asked", "named"),
    [
        ("team-a", ann(user_id="0"), "policy.namespaces.team-a.users"),
        ("team-a", ann(group_id="0"), "policy.namespaces.team-a.groups"),
        ("other", ann(group_id="0"), "policy.default.groups"),
        ("team-a", ann(account="finance"), "policy.namespaces.team-a.accounts"),
        ("team-a", ann(qos="high"), "policy.namespaces.team-a.qos"),
        ("team-a", ann(partition="debug"), "policy.namespaces.team-a.partitions"),
        ("team-a", ann(reservation="maint"), "policy.namespaces.team-a.reservations"),
        ("team-a", ann(priority="100"), "policy.namespaces.team-a.allowPriority"),
        ("other", ann(user_id="0"), "policy.default.users"),
        ("other", ann(account="physics"), "policy.default.accounts"),
    ],
)
def test_anything_else_is_refused_naming_the_annotation_and_the_rule(
    namespace: str, asked: dict[str, str], named: str
) -> None:
    with pytest.raises(PolicyDenied) as e:
        decide(rule(namespace), asked, partition="bridge", who=f"pods of {namespace}")
    text = str(e.value)
    assert next(iter(asked)) in text and named in text and f"pods of {namespace}" in text


def test_a_rule_by_service_account_is_refused_the_namespace_is_the_boundary() -> None:
    # Any pod author of team-a can set serviceAccountName: trainer, so a rule of trainer's
    # would be anyone's in team-a.
    policy = {"namespaces": {"team-a": {"serviceAccounts": {"trainer": {"qos": ["high"]}}}}}
    with pytest.raises(ConfigError) as e:
        parse_config({"policy": policy})
    assert e.value.key == "policy.namespaces.team-a.serviceAccounts"
    assert "trainer" in str(e.value) and "namespace of their own" in str(e.value)


def test_a_namespace_rule_inherits_what_it_does_not_say() -> None:
    got = decide(rule("team-b"), ann(reservation="maint"), partition="bridge")
    assert (got.user, got.group, got.reservation) == ("65534", "65534", "maint")


@pytest.mark.parametrize(
    ("policy", "key"),
    [
        ({"default": {"users": [], "groups": ["g"]}}, "policy.default.users"),
        ({"default": {"users": ["alice"]}}, "policy.default.groups"),  # root's group else
        ({"default": {"user": ["x"]}}, "policy.default.user"),
        ({"namespaces": {"a": {"acounts": ["x"]}}}, "policy.namespaces.a.acounts"),
        ({"namespaces": {"a": {"qos": "high"}}}, "policy.namespaces.a.qos"),
        ({"namespaces": {"a": {"accounts": ["has space"]}}}, "policy.namespaces.a.accounts[0]"),
        ({"namespaces": {"A_b": {}}}, "policy.namespaces.A_b"),
        (
            {"namespaces": {"a": {"serviceAccounts": {"t": {"allowPriority": True}}}}},
            "policy.namespaces.a.serviceAccounts",
        ),
    ],
)
def test_a_bad_policy_is_refused_naming_the_key(policy: Any, key: str) -> None:
    with pytest.raises(ConfigError) as e:
        parse_config({"policy": policy})
    assert e.value.key == key, str(e.value)


def test_a_rule_that_lists_its_own_accounts_does_not_inherit_a_default_account() -> None:
    config = parse_config(
        {
            "policy": {
                "default": {"accounts": ["general"], "defaultAccount": "general"},
                "namespaces": {"a": {"accounts": ["physics"]}, "b": {"qos": ["high"]}},
            }
        }
    )
    assert decide(config.policy.rule_for("a"), {}, partition="p").account is None
    assert decide(config.policy.rule_for("b"), {}, partition="p").account == "general"
    with pytest.raises(PolicyDenied):
        decide(config.policy.rule_for("a"), ann(account="general"), partition="p")
