"""The bridge's config file: upstream's keys work unchanged, ours are validated, and every bad
key or value is refused with an error that names the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jwt
import pytest

from slinky.bridge.config import (
    DEFAULT_SCHEDULER_NAME,
    BridgeConfig,
    ConfigError,
    SlurmAuth,
    load_config,
    parse_config,
)
from slinky.bridge.connection import token_provider
from slinky.slurm.tokens import MintedToken, StaticToken, TokenFile


def refused(data: Any) -> ConfigError:
    with pytest.raises(ConfigError) as err:
        parse_config(data, environ={})
    return err.value


def test_defaults_are_upstreams() -> None:
    config = parse_config(None, environ={})
    assert config.scheduler_name == DEFAULT_SCHEDULER_NAME == "slurm-bridge-scheduler"
    assert config.managed_namespaces == ("slurm-bridge",)
    assert config.managed_namespace_selector is None
    assert config.mcs_label == "kubernetes"
    assert config.partition == "slurm-bridge"
    assert config.managed_node_taint.enabled
    assert config.managed_node_taint.effect == "NoExecute"
    assert config.slurm_auth is None
    assert config.immediate_allocation


def test_an_upstream_config_is_accepted_unchanged() -> None:
    config = parse_config(
        {
            "schedulerName": "my-scheduler",
            "slurmRestApi": "http://slurm-restapi.slurm:6820",
            "managedNamespaces": ["slurm-bridge", "team-a"],
            "managedNamespaceSelector": {"matchLabels": {"slurm": "yes"}},
            "mcsLabel": "kubernetes",
            "partition": "slurm-bridge",
        },
        environ={"SLURM_JWT": "tok"},
    )
    assert config.scheduler_name == "my-scheduler"
    assert config.slurm_rest_api == "http://slurm-restapi.slurm:6820"
    assert config.managed_namespaces == ("slurm-bridge", "team-a")
    assert config.slurm_auth is not None and config.slurm_auth.static_token == "tok"


def test_the_selector_wins_over_the_list() -> None:
    config = parse_config(
        {
            "managedNamespaces": ["listed"],
            "managedNamespaceSelector": {
                "matchExpressions": [{"key": "team", "operator": "In", "values": ["a"]}]
            },
        },
        environ={},
    )
    assert config.is_managed_namespace("other", {"team": "a"})
    assert not config.is_managed_namespace("listed", {})
    assert not config.is_managed_namespace("kube-system", {"team": "a"})


def test_token_file_and_jwt_key_sources(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("abc\n")
    key = tmp_path / "key"
    key.write_bytes(b"k" * 32)
    by_file = parse_config({"slurmAuth": {"tokenFile": str(token)}}, environ={})
    assert by_file.slurm_auth is not None and by_file.slurm_auth.token_file == token
    minted = parse_config(
        {"slurmAuth": {"jwtKeyFile": str(key), "user": "root", "tokenLifetime": "5m"}},
        environ={},
    )
    assert minted.slurm_auth is not None
    assert minted.slurm_auth.jwt_key_file == key
    assert minted.slurm_auth.user == "root"
    assert minted.slurm_auth.token_lifetime == 300.0


def test_taint_can_be_switched_off_or_softened() -> None:
    off = parse_config({"managedNodeTaint": {"enabled": False}}, environ={})
    assert not off.managed_node_taint.enabled
    soft = parse_config({"managedNodeTaint": {"effect": "NoSchedule"}}, environ={})
    assert soft.managed_node_taint == type(soft.managed_node_taint)(True, "NoSchedule")
    assert soft.toleration()["effect"] == "NoSchedule"


def test_node_health_drains_on_not_ready_by_default_and_on_the_conditions_named() -> None:
    default = parse_config({}, environ={}).node_health
    assert default.not_ready and not default.conditions
    npd = parse_config(
        {"nodeHealth": {"notReady": False, "conditions": ["KernelDeadlock", "example.com/Gpu"]}},
        environ={},
    ).node_health
    assert not npd.not_ready
    assert npd.conditions == frozenset({"KernelDeadlock", "example.com/Gpu"})


@pytest.mark.parametrize(
    ("data", "key", "says"),
    [
        ({"schedulerNme": "x"}, "schedulerNme", "did you mean 'schedulerName'"),
        ({"bogus": 1}, "bogus", "unknown key"),
        ({"schedulerName": ""}, "schedulerName", "non-empty string"),
        ({"schedulerName": "has space"}, "schedulerName", "not a valid scheduler name"),
        ({"slurmRestApi": "slurm:6820"}, "slurmRestApi", "http(s) URL"),
        ({"managedNamespaces": "slurm-bridge"}, "managedNamespaces", "list of namespace names"),
        ({"managedNamespaces": ["Bad_Name"]}, "managedNamespaces[0]", "namespace name"),
        ({"managedNamespaces": ["ok", "kube-system"]}, "managedNamespaces[1]", "never"),
        (
            {"managedNamespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Is"}]}},
            "managedNamespaceSelector.matchExpressions[0].operator",
            "must be one of",
        ),
        (
            {"managedNamespaceSelector": {"matchLabel": {"a": "b"}}},
            "managedNamespaceSelector.matchLabel",
            "unknown field",
        ),
        ({"partition": "a b"}, "partition", "partition name"),
        ({"partition": 3}, "partition", "non-empty string"),
        ({"managedNodeTaint": {"effect": "NoRun"}}, "managedNodeTaint.effect", "NoExecute"),
        ({"managedNodeTaint": {"enabled": "yes"}}, "managedNodeTaint.enabled", "true or false"),
        ({"managedNodeTaint": {"enable": True}}, "managedNodeTaint.enable", "did you mean"),
        ({"nodeHealth": {"notReady": "yes"}}, "nodeHealth.notReady", "true or false"),
        ({"nodeHealth": {"conditions": "KernelDeadlock"}}, "nodeHealth.conditions", "list"),
        ({"nodeHealth": {"conditions": ["a b"]}}, "nodeHealth.conditions[0]", "condition type"),
        ({"nodeHealth": {"conditions": ["Ready"]}}, "nodeHealth.conditions[0]", "notReady"),
        ({"nodeHealth": {"condition": []}}, "nodeHealth.condition", "did you mean"),
        ({"slurmAuth": {}}, "slurmAuth", "exactly one of tokenFile and jwtKeyFile"),
        ({"slurmAuth": {"tokenFile": "/nonexistent/t"}}, "slurmAuth.tokenFile", "no such file"),
        ({"slurmPollInterval": "2"}, "slurmPollInterval", "invalid duration"),
        ({"slurmPollInterval": 2}, "slurmPollInterval", "duration"),
        ({"immediateAllocation": "no"}, "immediateAllocation", "true or false"),
        (["a"], "", "must be a mapping"),
    ],
)
def test_bad_keys_and_values_are_refused_naming_the_key(data: Any, key: str, says: str) -> None:
    err = refused(data)
    assert err.key == key
    assert says in str(err)
    if key:
        assert str(err).startswith(f"{key}: ")


def test_token_lifetime_only_with_a_jwt_key(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("abc")
    err = refused({"slurmAuth": {"tokenFile": str(token), "tokenLifetime": "5m"}})
    assert err.key == "slurmAuth.tokenLifetime"


def test_load_config_reports_yaml_and_missing_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("schedulerName: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.yaml")
    good = tmp_path / "good.yaml"
    good.write_text("partition: p1\nmanagedNodeTaint:\n  enabled: false\n")
    config = load_config(good)
    assert isinstance(config, BridgeConfig)
    assert config.partition == "p1"
    assert not config.managed_node_taint.enabled


async def test_token_sources_become_providers(tmp_path: Path) -> None:
    token = jwt.encode({"sun": "alice"}, "k" * 32, "HS256")
    path = tmp_path / "token"
    path.write_text(token + "\n")
    by_file = token_provider(SlurmAuth(token_file=path))
    assert isinstance(by_file, TokenFile) and by_file.user == "alice"
    assert await by_file.token() == token
    path.write_text("rotated-token-longer\n")
    assert await by_file.token() == "rotated-token-longer"  # re-read on change

    key = tmp_path / "key"
    key.write_bytes(b"k" * 32)
    minted = token_provider(SlurmAuth(jwt_key_file=key, user="root", token_lifetime=60))
    assert isinstance(minted, MintedToken) and minted.user == "root"
    claims = jwt.decode(await minted.token(), b"k" * 32, algorithms=["HS256"])
    assert claims["sun"] == "root" and claims["exp"] - claims["iat"] == 60

    static = token_provider(SlurmAuth(static_token=token))
    assert isinstance(static, StaticToken) and static.user == "alice"
