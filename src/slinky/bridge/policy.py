"""Who a pod's Slurm job runs as, and what it may ask of Slurm: the tenancy policy.

The bridge talks to Slurm as an administrator, so slurmctld takes whatever user, account,
QOS or priority a placeholder job names. Upstream copied those from the pod's annotations:
anyone who could create a pod chose its Slurm user, charged any account and jumped the
queue. Here the pod's namespace decides, through rules in the config (`policy`). The
namespace is the boundary, never the ServiceAccount: anyone who may create pods in a namespace
may name any ServiceAccount of it in `serviceAccountName` (and a controller's pods are created
by the controller, not the user), so a rule per ServiceAccount is refused at start:

```yaml
policy:
  default:                  # every managed namespace without a rule of its own
    users: ["65534"]        # the first is the user the jobs run as (a name or a uid; here
                            # nobody's uid); a pod may pick another of the list with the
                            # user-id annotation (list uids as numbers for that)
    groups: ["65534"]       # the same for group-id; the first must be the first user's
                            # primary group (a rule that sets users sets groups too)
    accounts: []            # accounts a pod may name (annotation `account`)
    defaultAccount: ""      # the account of a pod that names none ("": Slurm's default)
    qos: []                 # QOS a pod may name
    defaultQos: ""
    partitions: []          # partitions a pod may name besides the bridge's `partition`
    reservations: []        # reservations a pod may name
    allowPriority: false    # the `priority` annotation (a Slurm administrator's field)
  namespaces:
    team-a:                 # keys given here replace the default's
      users: [alice]
      groups: [alice]
      accounts: [physics, chem]
      defaultAccount: physics
```

`decide` is pure: the rule and the pod's `slurmjob.slinky.slurm.net/*` annotations (a group's
merged over its pods') in, the job's identity out, or `PolicyDenied` naming the annotation,
the rule and what is allowed. The webhook refuses such a pod at `kubectl apply`; the
scheduler (which also sees a group's root object) leaves it Pending with reason
`PolicyDenied`. Nothing a pod says can make its job run as root unless a rule says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

from slinky.bridge.labels import SLURMJOB_PREFIX

# nobody and nogroup, by number: Slurm refuses the name "nobody" in a job's user_id, and a
# job submitted by an administrator without a group_id gets the administrator's (root's).
DEFAULT_USER = "65534"
DEFAULT_GROUP = "65534"
# Annotations whose value the policy decides (the rest describe resources and are free).
GOVERNED = ("user-id", "group-id", "account", "qos", "partition", "reservation", "priority")


class PolicyDenied(ValueError):
    """A pod asks for something its rule does not allow; the message names both."""


@dataclass(frozen=True)
class Rule:
    """What the pods of one namespace may ask of Slurm."""

    users: tuple[str, ...] = (DEFAULT_USER,)
    groups: tuple[str, ...] = (DEFAULT_GROUP,)
    accounts: tuple[str, ...] = ()
    default_account: str = ""
    qos: tuple[str, ...] = ()
    default_qos: str = ""
    partitions: tuple[str, ...] = ()
    reservations: tuple[str, ...] = ()
    allow_priority: bool = False
    # Where the rule comes from, for messages: "policy.default", "policy.namespaces.a", ...
    source: str = "policy.default"


@dataclass(frozen=True)
class Policy:
    default: Rule = Rule()
    namespaces: dict[str, Rule] = field(default_factory=dict)

    def rule_for(self, namespace: str) -> Rule:
        """The rule of the pods of `namespace`, whatever their ServiceAccount."""
        return self.namespaces.get(namespace, self.default)


def merged(base: Rule, given: dict[str, Any], source: str) -> Rule:
    """`base` with the fields `given` (Rule field names) replaced."""
    known = {f.name for f in fields(Rule)}
    return replace(base, source=source, **{k: v for k, v in given.items() if k in known})


@dataclass(frozen=True)
class Identity:
    """What the placeholder job gets from the policy (None: leave it to Slurm)."""

    user: str
    group: str
    account: str | None = None
    qos: str | None = None
    partition: str = ""
    reservation: str | None = None


def _annotation(annotations: dict[str, str], short: str) -> str | None:
    value = annotations.get(SLURMJOB_PREFIX + short)
    return None if value is None or value == "" else str(value)


def _allowed(listed: tuple[str, ...]) -> str:
    return ", ".join(listed) if listed else "none"


def _pick(
    annotations: dict[str, str],
    short: str,
    *,
    allowed: tuple[str, ...],
    default: str | None,
    rule: Rule,
    key: str,
    who: str,
) -> str | None:
    """The annotation's value if `allowed` lists it (or it is the default), else the
    default; PolicyDenied naming the rule's key when the pod asks for anything else."""
    asked = _annotation(annotations, short)
    if asked is None or asked == default:
        return default
    if asked in allowed:
        return asked
    raise PolicyDenied(
        f"annotation {SLURMJOB_PREFIX}{short}: {asked!r} is not allowed for {who} "
        f"(allowed: {_allowed(allowed)}; config {rule.source}.{key})"
    )


def decide(
    rule: Rule, annotations: dict[str, str], *, partition: str, who: str = "this pod"
) -> Identity:
    """The job's identity under `rule` for a pod (or group) with `annotations`; `partition`
    is the bridge's own, always allowed. `who` names the pod in messages."""

    def pick(short: str, allowed: tuple[str, ...], default: str | None, key: str) -> str | None:
        return _pick(
            annotations, short, allowed=allowed, default=default, rule=rule, key=key, who=who
        )

    user = pick("user-id", rule.users, rule.users[0], "users")
    group = pick("group-id", rule.groups, rule.groups[0], "groups")
    account = pick("account", rule.accounts, rule.default_account or None, "accounts")
    qos = pick("qos", rule.qos, rule.default_qos or None, "qos")
    chosen_partition = pick("partition", rule.partitions, partition, "partitions")
    reservation = pick("reservation", rule.reservations, None, "reservations")
    if _annotation(annotations, "priority") is not None and not rule.allow_priority:
        raise PolicyDenied(
            f"annotation {SLURMJOB_PREFIX}priority: setting a job's priority is a Slurm "
            f"administrator's right, not allowed for {who} (config {rule.source}.allowPriority)"
        )
    return Identity(
        user=str(user),
        group=str(group),
        account=account,
        qos=qos,
        partition=str(chosen_partition),
        reservation=reservation,
    )


def pod_annotations(pod: dict[str, Any]) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("annotations") or {})
