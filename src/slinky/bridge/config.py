"""The bridge's configuration file (YAML, `--config PATH`).

Upstream's keys are accepted unchanged (`schedulerName`, `slurmRestApi`, `managedNamespaces`,
`managedNamespaceSelector`, `mcsLabel`, `partition`), so an existing upstream config works.
Ours:

```yaml
slurmAuth:              # where the slurmrestd JWT comes from (one of the two files)
  tokenFile: /var/run/secrets/slurm/auth-token   # re-read whenever the file changes
  jwtKeyFile: /var/run/secrets/slurm/jwt_hs256.key  # or: mint short-lived tokens
  user: slurm           # X-SLURM-USER-NAME (default: the token's `sun` claim, else slurm)
  tokenLifetime: 15m    # lifetime of minted tokens (renewed at 2/3)
managedNodeTaint:
  enabled: true         # taint nodes Slurm knows, so only bridge-scheduled pods land there
  effect: NoExecute     # or NoSchedule / PreferNoSchedule
nodeHealth:             # besides a cordon, what drains a node's Slurm node (undone after)
  notReady: true        # its Ready condition False or Unknown
  conditions: [KernelDeadlock]  # Node condition types that drain while True (e.g. NPD's)
slurmPollInterval: 2s   # how often Slurm nodes are asked for changes while pods wait
slurmIdlePollInterval: 15s  # ... and while none waits (update_time deltas: one request)
immediateAllocation: true  # ask Slurm to allocate at once when a node looks free
clusterId: prod-eu-1    # who this bridge is, in every job and node it makes (default: the
                        # Kubernetes cluster's kube-system namespace UID)
policy:                 # who the jobs run as and what pods may ask of Slurm (see `policy`)
  default: {users: ["65534"], groups: ["65534"]}
  namespaces: {team-a: {users: [alice], groups: [alice], accounts: [physics]}}
```

Upstream did no validation at all: a typo silently fell back to a default. Here an unknown
key or a bad value stops start-up with an error that names the key (and suggests the key
that was probably meant).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from slinky.bridge.labels import MANAGED_NODE_TAINT
from slinky.bridge.policy import Policy, Rule, merged
from slinky.kube import flags
from slinky.kube.nodehealth import NodeHealth
from slinky.kube.selectors import LabelSelector, SelectorError, parse_label_selector

T = TypeVar("T")

DEFAULT_SCHEDULER_NAME = "slurm-bridge-scheduler"
DEFAULT_NAMESPACES = ("slurm-bridge",)
DEFAULT_MCS_LABEL = "kubernetes"
DEFAULT_PARTITION = "slurm-bridge"
TAINT_EFFECTS = ("NoExecute", "NoSchedule", "PreferNoSchedule")
# Namespaces whose pods the bridge never touches, whatever the config says.
NEVER_MANAGED = frozenset({"kube-system"})
# Upstream releases read a static token from this environment variable; kept as the
# fallback when `slurmAuth` is absent so an upstream config and Deployment work unchanged.
TOKEN_ENV = "SLURM_JWT"

_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_URL = re.compile(r"^https?://[^\s/]+(/\S*)?$")
_SLURM_NAME = re.compile(r"^[^\s,=:#]+$")
_CLUSTER_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


class ConfigError(ValueError):
    """A config problem; `key` is the dotted path of the offending key."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


@dataclass(frozen=True)
class SlurmAuth:
    """One token source: a token file (re-read on change), a JWT key to mint tokens, or a
    static token (the upstream environment variable)."""

    token_file: Path | None = None
    jwt_key_file: Path | None = None
    static_token: str | None = field(default=None, repr=False)
    user: str | None = None
    token_lifetime: float = 900.0


@dataclass(frozen=True)
class NodeTaint:
    enabled: bool = True
    effect: str = "NoExecute"


@dataclass(frozen=True)
class BridgeConfig:
    scheduler_name: str = DEFAULT_SCHEDULER_NAME
    slurm_rest_api: str | None = None
    managed_namespaces: tuple[str, ...] = DEFAULT_NAMESPACES
    managed_namespace_selector: LabelSelector | None = None
    mcs_label: str = DEFAULT_MCS_LABEL
    partition: str = DEFAULT_PARTITION
    slurm_auth: SlurmAuth | None = None
    managed_node_taint: NodeTaint = NodeTaint()
    node_health: NodeHealth = NodeHealth()
    slurm_poll_interval: float = 2.0
    slurm_idle_poll_interval: float = 15.0
    immediate_allocation: bool = True
    # Written into every placeholder job and EXTERNAL node this bridge makes; only what
    # carries it is ever cancelled, drained or deleted (two bridges may share one Slurm).
    # Empty in the file: the kube-system namespace's UID, resolved at start.
    cluster_id: str = ""
    # Slurm identity and limits of each managed namespace's pods.
    policy: Policy = field(default_factory=Policy)

    def is_managed_namespace(self, name: str, labels: dict[str, str] | None) -> bool:
        """Pods of this namespace are the bridge's: the selector wins over the list."""
        if name in NEVER_MANAGED:
            return False
        if self.managed_namespace_selector is not None:
            return self.managed_namespace_selector.matches(labels)
        return name in self.managed_namespaces

    def toleration(self) -> dict[str, str]:
        """The toleration of the managed-node taint that bridge-scheduled pods carry."""
        return {
            "key": MANAGED_NODE_TAINT,
            "operator": "Equal",
            "value": self.scheduler_name,
            "effect": self.managed_node_taint.effect,
        }


# ---------------------------------------------------------------- checks of one value


def _string(value: Any, key: str, pattern: re.Pattern[str] | None = None, what: str = "") -> str:
    if not isinstance(value, str) or not value:
        raise ConfigError(key, f"must be a non-empty string, got {_show(value)}")
    if pattern is not None and not pattern.match(value):
        raise ConfigError(key, f"{value!r} is not {what}")
    return value


def _bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(key, f"must be true or false, got {_show(value)}")
    return value


def _duration(value: Any, key: str, minimum: float) -> float:
    if not isinstance(value, str):
        raise ConfigError(key, f"must be a duration such as 2s or 15m, got {_show(value)}")
    try:
        seconds = flags.parse_duration(value)
    except Exception as e:
        raise ConfigError(key, str(e)) from None
    if seconds < minimum:
        raise ConfigError(key, f"{value} is too short (at least {minimum:g}s)")
    return seconds


def _file(value: Any, key: str) -> Path:
    path = Path(_string(value, key))
    if not path.is_file():
        raise ConfigError(key, f"{path}: no such file")
    if not os.access(path, os.R_OK):
        raise ConfigError(key, f"{path}: not readable")
    return path


def _show(value: Any) -> str:
    if value is None:
        return "nothing"
    return f"{type(value).__name__} {value!r}"


def _mapping(value: Any, key: str, known: dict[str, Callable[[Any, str], Any]]) -> dict[str, Any]:
    """Check every key of a mapping with its parser; unknown keys are errors."""
    if not isinstance(value, dict):
        raise ConfigError(key, f"must be a mapping, got {_show(value)}")
    out: dict[str, Any] = {}
    for name, item in value.items():
        path = f"{key}.{name}" if key else str(name)
        parser = known.get(str(name))
        if parser is None:
            hint = difflib.get_close_matches(str(name), list(known), n=1)
            tip = f"; did you mean {hint[0]!r}?" if hint else f" (known: {', '.join(known)})"
            raise ConfigError(path, f"unknown key{tip}")
        if item is None:
            continue  # `key:` with no value means "the default", as in Helm values
        out[str(name)] = parser(item, path)
    return out


# ---------------------------------------------------------------- sections


def _namespaces(value: Any, key: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(key, f"must be a list of namespace names, got {_show(value)}")
    names = tuple(
        _string(v, f"{key}[{i}]", _DNS_LABEL, "a namespace name") for i, v in enumerate(value)
    )
    for i, name in enumerate(names):
        if name in NEVER_MANAGED:
            raise ConfigError(f"{key}[{i}]", f"{name} can never be a managed namespace")
    return names


def _selector(value: Any, key: str) -> LabelSelector:
    try:
        return parse_label_selector(value)
    except SelectorError as e:
        raise ConfigError(f"{key}.{e.path}" if e.path else key, e.problem) from None


_SLURM_AUTH_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "tokenFile": _file,
    "jwtKeyFile": _file,
    "user": lambda v, k: _string(v, k, _SLURM_NAME, "a Slurm user name"),
    "tokenLifetime": lambda v, k: _duration(v, k, 10.0),
}


def _slurm_auth(value: Any, key: str) -> SlurmAuth:
    parts = _mapping(value, key, _SLURM_AUTH_KEYS)
    if ("tokenFile" in parts) == ("jwtKeyFile" in parts):
        raise ConfigError(key, "set exactly one of tokenFile and jwtKeyFile")
    if "tokenLifetime" in parts and "jwtKeyFile" not in parts:
        raise ConfigError(f"{key}.tokenLifetime", "only applies to tokens minted from jwtKeyFile")
    return SlurmAuth(
        token_file=parts.get("tokenFile"),
        jwt_key_file=parts.get("jwtKeyFile"),
        user=parts.get("user"),
        token_lifetime=parts.get("tokenLifetime", 900.0),
    )


def _effect(value: Any, key: str) -> str:
    if value not in TAINT_EFFECTS:
        raise ConfigError(key, f"must be one of {', '.join(TAINT_EFFECTS)}, got {_show(value)}")
    return str(value)


_TAINT_KEYS: dict[str, Callable[[Any, str], Any]] = {"enabled": _bool, "effect": _effect}


def _taint(value: Any, key: str) -> NodeTaint:
    return NodeTaint(**_mapping(value, key, _TAINT_KEYS))


_CONDITION_TYPE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?$")


def _condition_types(value: Any, key: str) -> frozenset[str]:
    if not isinstance(value, list):
        raise ConfigError(key, f"must be a list of Node condition types, got {_show(value)}")
    types = [
        _string(v, f"{key}[{i}]", _CONDITION_TYPE, "a Node condition type")
        for i, v in enumerate(value)
    ]
    for i, kind in enumerate(types):
        if kind == "Ready":
            raise ConfigError(f"{key}[{i}]", "Ready is notReady's: set nodeHealth.notReady")
    return frozenset(types)


_NODE_HEALTH_KEYS: dict[str, Callable[[Any, str], Any]] = {
    "notReady": _bool,
    "conditions": _condition_types,
}


def _node_health(value: Any, key: str) -> NodeHealth:
    parts = _mapping(value, key, _NODE_HEALTH_KEYS)
    return NodeHealth(
        conditions=parts.get("conditions", frozenset()), not_ready=parts.get("notReady", True)
    )


def _names(value: Any, key: str, what: str) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ConfigError(key, f"must be a list of {what}s, got {_show(value)}")
    return tuple(
        _string(str(v) if isinstance(v, int) else v, f"{key}[{i}]", _SLURM_NAME, f"a {what}")
        for i, v in enumerate(value)
    )


def _slurm_name(what: str) -> Callable[[Any, str], str]:
    return lambda v, k: _string(v, k, _SLURM_NAME, f"a {what}")


_RULE_KEYS: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "users": ("users", lambda v, k: _names(v, k, "Slurm user name or uid")),
    "groups": ("groups", lambda v, k: _names(v, k, "group name or gid")),
    "accounts": ("accounts", lambda v, k: _names(v, k, "Slurm account")),
    "defaultAccount": ("default_account", _slurm_name("Slurm account")),
    "qos": ("qos", lambda v, k: _names(v, k, "QOS name")),
    "defaultQos": ("default_qos", _slurm_name("QOS name")),
    "partitions": ("partitions", lambda v, k: _names(v, k, "partition name")),
    "reservations": ("reservations", lambda v, k: _names(v, k, "reservation name")),
    "allowPriority": ("allow_priority", _bool),
}


def _rule(
    value: Any, key: str, base: Rule, extra: dict[str, Callable[[Any, str], Any]] | None = None
) -> tuple[Rule, dict[str, Any]]:
    """A rule: `base` with the keys given at `key` replaced; and the `extra` keys' values."""
    known: dict[str, Callable[[Any, str], Any]] = {k: p for k, (_, p) in _RULE_KEYS.items()}
    parts = _mapping(value, key, {**known, **(extra or {})})
    for name, what in (("users", "user: the jobs run as the first"), ("groups", "group")):
        if name in parts and not parts[name]:
            raise ConfigError(f"{key}.{name}", f"needs at least one {what}")
    if "users" in parts and "groups" not in parts:
        raise ConfigError(
            f"{key}.groups",
            f"give the group the jobs of {parts['users'][0]} run as (its primary group first) "
            "beside users: Slurm gives a job submitted by the bridge the bridge's own group "
            "(root's) otherwise",
        )
    given = {_RULE_KEYS[k][0]: v for k, v in parts.items() if k in _RULE_KEYS}
    # A rule that lists its own accounts (QOS) does not inherit a default it did not list.
    for listed, default in (("accounts", "default_account"), ("qos", "default_qos")):
        if listed in given and default not in given:
            given[default] = ""
    rest = {k: v for k, v in parts.items() if k not in _RULE_KEYS}
    return merged(base, given, key), rest


def _policy(value: Any, key: str) -> Policy:
    parts = _mapping(value, key, {"default": lambda v, k: v, "namespaces": lambda v, k: v})
    default = Rule(source=f"{key}.default")
    if "default" in parts:
        default, _ = _rule(parts["default"], f"{key}.default", default)
    namespaces: dict[str, Rule] = {}
    spaces = parts.get("namespaces") or {}
    if not isinstance(spaces, dict):
        raise ConfigError(f"{key}.namespaces", f"must be a mapping, got {_show(spaces)}")
    for name, entry in spaces.items():
        at = f"{key}.namespaces.{name}"
        _string(name, at, _DNS_LABEL, "a namespace name")
        namespaces[name], _ = _rule(
            entry or {}, at, default, {"serviceAccounts": _no_service_accounts}
        )
    return Policy(default=default, namespaces=namespaces)


def _no_service_accounts(value: Any, key: str) -> None:
    """Rules by ServiceAccount are refused: the namespace is the boundary. Whoever may create
    pods in a namespace may set any of its ServiceAccounts as `serviceAccountName`, and a
    pod made by a controller (Deployment, Job) is created by the controller's own identity,
    so who may use a ServiceAccount cannot be checked when its pods are admitted."""
    names = ", ".join(str(n) for n in value) if isinstance(value, dict) else _show(value)
    raise ConfigError(
        key,
        f"rules by ServiceAccount ({names}) are refused: any pod author of the namespace can "
        "name any of its ServiceAccounts, so such a rule binds nobody; give the pods that "
        "need another rule a namespace of their own (docs/bridge.md, policy)",
    )


_TOP: dict[str, tuple[str, Callable[[Any, str], Any]]] = {
    "schedulerName": (
        "scheduler_name",
        lambda v, k: _string(v, k, _LABEL_VALUE, "a valid scheduler name (a label value)"),
    ),
    "slurmRestApi": (
        "slurm_rest_api",
        lambda v, k: _string(v, k, _URL, "an http(s) URL such as http://slurm-restapi.slurm:6820"),
    ),
    "managedNamespaces": ("managed_namespaces", _namespaces),
    "managedNamespaceSelector": ("managed_namespace_selector", _selector),
    "mcsLabel": ("mcs_label", lambda v, k: _string(v, k, _SLURM_NAME, "a valid MCS label")),
    "partition": ("partition", lambda v, k: _string(v, k, _SLURM_NAME, "a partition name")),
    "slurmAuth": ("slurm_auth", _slurm_auth),
    "managedNodeTaint": ("managed_node_taint", _taint),
    "nodeHealth": ("node_health", _node_health),
    "slurmPollInterval": ("slurm_poll_interval", lambda v, k: _duration(v, k, 0.1)),
    "slurmIdlePollInterval": ("slurm_idle_poll_interval", lambda v, k: _duration(v, k, 0.1)),
    "immediateAllocation": ("immediate_allocation", _bool),
    "clusterId": (
        "cluster_id",
        lambda v, k: _string(v, k, _CLUSTER_ID, "1-64 letters, digits, '.', '_' or '-'"),
    ),
    "policy": ("policy", _policy),
}


def all_keys() -> list[str]:
    """Every key the config file takes, dotted (`policy.namespaces.<ns>.users` is listed once
    as `policy.<rule>.users`): what docs/bridge.md must document."""
    keys = list(_TOP)
    keys += [f"slurmAuth.{k}" for k in _SLURM_AUTH_KEYS]
    keys += [f"managedNodeTaint.{k}" for k in _TAINT_KEYS]
    keys += [f"nodeHealth.{k}" for k in _NODE_HEALTH_KEYS]
    keys += ["policy.default", "policy.namespaces"]
    keys += [f"policy.<rule>.{k}" for k in _RULE_KEYS]
    return keys


def parse_config(data: Any, *, environ: dict[str, str] | None = None) -> BridgeConfig:
    """A BridgeConfig from the decoded YAML document; ConfigError names the bad key."""
    if data is None:
        data = {}
    parts = _mapping(data, "", {k: parser for k, (_, parser) in _TOP.items()})
    kwargs = {_TOP[k][0]: v for k, v in parts.items()}
    if "slurm_auth" not in kwargs:
        token = (environ if environ is not None else dict(os.environ)).get(TOKEN_ENV, "").strip()
        if token:
            kwargs["slurm_auth"] = SlurmAuth(static_token=token)
    return BridgeConfig(**kwargs)


def load_config(path: str | Path | None) -> BridgeConfig:
    """Read and validate the config file (None: every default)."""
    if path is None:
        return parse_config({})
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise ConfigError("", f"cannot read config file {path}: {e.strerror or e}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError("", f"config file {path} is not valid YAML: {e}") from None
    return parse_config(data)
