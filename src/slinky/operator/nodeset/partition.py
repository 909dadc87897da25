"""The NodeSet's own Slurm partition (`spec.partition`).

With `spec.partition.enabled` the operator keeps a Slurm partition named after the NodeSet
(upstream's convention) through slurmrestd's `POST /partitions/`:

- its node list is the NodeSet's pods that are registered in Slurm (a partition with no
  nodes is fine: Slurm queues jobs on it, reason `PartitionConfig`, so `replicas: 0` keeps
  the partition and jobs submitted to it stay PENDING until nodes come);
- `spec.partition.config` is a slurm.conf-style string (`MaxTime=60 Default=YES`); only the
  keys in `CONFIG_KEYS` are accepted, anything else is refused naming the key;
- the partition is the NodeSet's only if the operator created it: the NodeSet carries the
  annotation `ANNOTATION_PARTITION`, written *before* the partition is created. A partition
  of that name that exists without the annotation belongs to someone else and is never
  changed or deleted;
- it is deleted when the NodeSet is deleted, after every pod was drained and deleted (the
  deletion finalizer, `sync.finalize`), or when `enabled` is turned off.

Problems are reported on the NodeSet condition `PartitionReady`; nothing is deleted on error.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from slinky.kube import conditions, events, rest
from slinky.operator.nodeset.view import Context, View
from slinky.operator.resources import NODESETS
from slinky.slurm import errors

log = logging.getLogger(__name__)

JSON = dict[str, Any]
ANNOTATION_PARTITION = "nodeset.slinky.slurm.net/partition"
CONDITION = "PartitionReady"
# A partition that matches what was last written is re-read this often (an admin may have
# changed it with scontrol); otherwise nothing is sent to Slurm per reconcile.
RECHECK_S = 60.0
RETRY_S = 10.0  # after an error: Slurm unreachable, refused, or a conflict resolved by hand


class PartitionConfigError(ValueError):
    """`spec.partition.config` cannot be applied; the message names the key."""


def _no_val(value: int | None) -> JSON:
    """Slurm's `*_no_val_struct`: a number, or infinite."""
    if value is None:
        return {"set": True, "infinite": True, "number": 0}
    return {"set": True, "infinite": False, "number": value}


_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")


def minutes(key: str, value: str) -> int | None:
    """A Slurm time limit in minutes (None = UNLIMITED): `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`,
    `D-HH:MM`, `D-HH:MM:SS`, `UNLIMITED`/`INFINITE`."""
    if value.upper() in ("UNLIMITED", "INFINITE"):
        return None
    m = _TIME.match(value)
    if not m:
        raise PartitionConfigError(f"{key}={value}: not a Slurm time (minutes, D-HH:MM:SS)")
    days, a, b, c = m.groups()
    if days is not None:  # D-HH[:MM[:SS]]
        total = int(days) * 1440 + int(a) * 60 + int(b or 0) + (1 if c and int(c) else 0)
    elif c is not None:  # HH:MM:SS
        total = int(a) * 60 + int(b) + (1 if int(c) else 0)
    elif b is not None:  # MM:SS
        total = int(a) + (1 if int(b) else 0)
    else:
        total = int(a)
    return total


def _int(key: str, value: str) -> int:
    if not value.isdigit():
        raise PartitionConfigError(f"{key}={value}: not a non-negative integer")
    return int(value)


def _yes_no(key: str, value: str) -> bool:
    v = value.upper()
    if v not in ("YES", "NO"):
        raise PartitionConfigError(f"{key}={value}: must be YES or NO")
    return v == "YES"


def _choice(key: str, value: str, allowed: tuple[str, ...]) -> str:
    if value.upper() not in allowed:
        raise PartitionConfigError(f"{key}={value}: must be one of {', '.join(allowed)}")
    return value.upper()


def _put(body: JSON, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for p in parents:
        body = body.setdefault(p, {})
    body[leaf] = value


def _flag(body: JSON, flag: str, on: bool) -> None:
    body.setdefault("flags", []).append(flag if on else f"{flag}_CLEAR")


def _oversubscribe(body: JSON, key: str, value: str) -> None:
    """`NO`, `EXCLUSIVE`, `YES[:n]`, `FORCE[:n]` as in slurm.conf."""
    mode, _, count = value.upper().partition(":")
    if mode not in ("NO", "EXCLUSIVE", "YES", "FORCE") or (count and not count.isdigit()):
        raise PartitionConfigError(f"{key}={value}: must be NO, EXCLUSIVE, YES[:n] or FORCE[:n]")
    if mode == "EXCLUSIVE":
        _put(body, "partition.exclusive", "YES")
        return
    jobs = 1 if mode == "NO" else int(count or 4)
    _put(
        body,
        "maximums.oversubscribe",
        {"jobs": jobs, "flags": ["force"] if mode == "FORCE" else []},
    )


Setter = Callable[[JSON, str, str], None]

# slurm.conf partition keys (case-insensitive) and how each becomes a partition_info field.
CONFIG_KEYS: dict[str, Setter] = {
    "maxtime": lambda b, k, v: _put(b, "maximums.time", _no_val(minutes(k, v))),
    "defaulttime": lambda b, k, v: _put(b, "defaults.time", _no_val(minutes(k, v))),
    "maxnodes": lambda b, k, v: _put(
        b, "maximums.nodes", _no_val(None if v.upper() == "UNLIMITED" else _int(k, v))
    ),
    "minnodes": lambda b, k, v: _put(b, "minimums.nodes", _int(k, v)),
    "default": lambda b, k, v: _flag(b, "DEFAULT", _yes_no(k, v)),
    "hidden": lambda b, k, v: _flag(b, "HIDDEN", _yes_no(k, v)),
    "rootonly": lambda b, k, v: _flag(b, "ROOT_ONLY", _yes_no(k, v)),
    "state": lambda b, k, v: _put(
        b, "partition.state", [_choice(k, v, ("UP", "DOWN", "DRAIN", "INACTIVE"))]
    ),
    "oversubscribe": _oversubscribe,
    "prioritytier": lambda b, k, v: _put(b, "priority.tier", _int(k, v)),
    "priorityjobfactor": lambda b, k, v: _put(b, "priority.job_factor", _int(k, v)),
    "gracetime": lambda b, k, v: _put(b, "grace_time", _int(k, v)),
    "allowaccounts": lambda b, k, v: _put(b, "accounts.allowed", v),
    "denyaccounts": lambda b, k, v: _put(b, "accounts.deny", v),
    "allowgroups": lambda b, k, v: _put(b, "groups.allowed", v),
    "allowqos": lambda b, k, v: _put(b, "qos.allowed", v),
    "denyqos": lambda b, k, v: _put(b, "qos.deny", v),
    "qos": lambda b, k, v: _put(b, "qos.assigned", v),
}
# Keys the operator owns: setting them in the config is an error, not a silent override.
OWNED_KEYS = {
    "partitionname": "the partition is named after the NodeSet",
    "nodes": "the NodeSet's registered nodes are the partition's nodes",
}


def parse_config(text: str) -> JSON:
    """`spec.partition.config` → the partition_info fields it sets. Raises
    PartitionConfigError naming the first bad key."""
    body: JSON = {}
    for token in text.split():
        key, eq, value = token.partition("=")
        if not eq or not key or not value:
            raise PartitionConfigError(f"{token!r}: expected Key=Value")
        lower = key.lower()
        if lower in OWNED_KEYS:
            raise PartitionConfigError(f"{key}: set by the operator ({OWNED_KEYS[lower]})")
        setter = CONFIG_KEYS.get(lower)
        if setter is None:
            raise PartitionConfigError(
                f"{key}: unknown or unsupported partition key (supported: "
                f"{', '.join(sorted(CONFIG_KEYS))})"
            )
        setter(body, key, value)
    return body


def partition_name(view: View) -> str:
    return view.name


def registered_nodes(view: View) -> list[str]:
    """The NodeSet's pods whose slurmd registered in Slurm (identity checked)."""
    return sorted(
        name
        for name, pod in (*view.active.items(), *view.terminating.items())
        if view.slurm_node(pod) is not None
    )


@dataclass
class _Applied:
    uid: str
    body: JSON
    at: float


@dataclass
class Outcome:
    """What the step says on the `PartitionReady` condition (None: nothing to say)."""

    ok: bool
    reason: str
    message: str


class Partitions:
    """The partition step. Keeps what it last wrote per NodeSet so a reconcile that changes
    nothing sends nothing to Slurm."""

    def __init__(self) -> None:
        self._applied: dict[str, _Applied] = {}

    def owned(self, view: View) -> bool:
        ann = view.obj["metadata"].get("annotations") or {}
        return ann.get(ANNOTATION_PARTITION) == partition_name(view)

    async def sync(self, ctx: Context, view: View) -> Outcome | None:
        """Create or update the partition (enabled), or delete ours (disabled)."""
        spec = view.spec.partition
        if spec is None or not spec.enabled:
            if self.owned(view):
                return await self._delete_disabled(ctx, view)
            if conditions.find((view.obj.get("status") or {}).get("conditions"), CONDITION):
                # Said on every reconcile, so a status written from a stale cache converges.
                return Outcome(True, "PartitionDisabled", "spec.partition.enabled is false")
            return None
        name = partition_name(view)
        try:
            config = parse_config(spec.config)
        except PartitionConfigError as e:
            return Outcome(False, "InvalidPartitionConfig", f"spec.partition.config: {e}")
        if not view.slurm_ready or view.conn is None:
            return Outcome(False, "SlurmNotReady", f"partition {name} waits for Slurm")
        body: JSON = {
            "name": name,
            **config,
            "nodes": {"configured": ",".join(registered_nodes(view))},
        }
        uid = str(view.obj["metadata"]["uid"])
        last = self._applied.get(view.key)
        if (
            last is not None
            and last.uid == uid
            and last.body == body
            and time.monotonic() - last.at < RECHECK_S
        ):
            return Outcome(True, "PartitionReady", self._message(body))
        client = view.conn.client
        try:
            existing = await client.get_partition(name)
        except errors.SlurmNotFound:
            existing = None
        except errors.SlurmError as e:
            return Outcome(False, "SlurmError", f"partition {name}: cannot read it: {e}")
        if existing is not None and not self.owned(view):
            return Outcome(
                False,
                "PartitionConflict",
                f"Slurm partition {name} already exists and was not created for this "
                f"NodeSet (no annotation {ANNOTATION_PARTITION}={name}); it is left alone. "
                "Rename the NodeSet or remove that partition from Slurm",
            )
        if not self.owned(view):
            await self._claim(ctx, view, name)
        try:
            await client.put_partition(body)
        except errors.SlurmError as e:
            self._applied.pop(view.key, None)
            if errors.ESLURM_INVALID_NODE_NAME in e.error_numbers:
                # A node of the list left Slurm since the last poll (scale-in): look again.
                view.conn.informer.poke()
                return Outcome(False, "NodesChanging", f"partition {name}: {e}; retrying")
            return Outcome(False, "PartitionRefused", f"Slurm refused partition {name}: {e}")
        if existing is None:
            ctx.recorder.event(
                view.obj, events.NORMAL, "PartitionCreated", f"Slurm partition {name} created"
            )
            log.info("nodeset %s: Slurm partition %s created", view.key, name)
        self._applied[view.key] = _Applied(uid, body, time.monotonic())
        return Outcome(True, "PartitionReady", self._message(body))

    @staticmethod
    def _message(body: JSON) -> str:
        nodes = body["nodes"]["configured"]
        return f"Slurm partition {body['name']}: nodes {nodes or '(none yet)'}"

    async def _claim(self, ctx: Context, view: View, name: str) -> None:
        """Mark the partition as this NodeSet's before creating it, so a crash between the
        two never leaves a partition the operator would later call foreign."""
        meta = view.obj["metadata"]
        patch = {"metadata": {"annotations": {ANNOTATION_PARTITION: name}}}
        view.obj = await ctx.kube.patch(NODESETS, meta["name"], patch, meta["namespace"])

    async def _delete_disabled(self, ctx: Context, view: View) -> Outcome | None:
        name = partition_name(view)
        if view.conn is None or not view.slurm_ready:
            return Outcome(
                False, "SlurmNotReady", f"partition {name} is deleted once Slurm is reachable"
            )
        if not await self.delete(ctx, view):
            return Outcome(
                False, "PartitionDeleteFailed", f"partition {name} could not be deleted; retrying"
            )
        meta = view.obj["metadata"]
        patch = {"metadata": {"annotations": {ANNOTATION_PARTITION: None}}}
        try:
            view.obj = await ctx.kube.patch(NODESETS, meta["name"], patch, meta["namespace"])
        except rest.ApiError as e:
            if not e.not_found:
                raise
        return Outcome(
            True,
            "PartitionDisabled",
            f"Slurm partition {name} deleted (spec.partition.enabled is false)",
        )

    async def delete(self, ctx: Context, view: View) -> bool:
        """Delete the partition if it is this NodeSet's; True when it is gone (or was never
        ours). Called by the deletion finalizer once every pod is gone."""
        self._applied.pop(view.key, None)
        if not self.owned(view):
            return True
        name = partition_name(view)
        if view.conn is None:
            ctx.recorder.event(
                view.obj,
                events.WARNING,
                "PartitionNotDeleted",
                f"Cluster {view.spec.cluster_name} has no Slurm connection; partition {name} "
                "is left in Slurm",
            )
            return True
        try:
            await view.conn.client.delete_partition(name)
        except errors.SlurmNotFound:
            return True
        except errors.SlurmError as e:
            log.warning("nodeset %s: deleting partition %s failed: %s", view.key, name, e)
            ctx.recorder.event(
                view.obj, events.WARNING, "PartitionDeleteFailed", f"partition {name}: {e}"
            )
            return False
        ctx.recorder.event(
            view.obj, events.NORMAL, "PartitionDeleted", f"Slurm partition {name} deleted"
        )
        log.info("nodeset %s: Slurm partition %s deleted", view.key, name)
        return True
