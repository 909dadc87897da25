"""The NodeSet's own Slurm partition (`spec.partition`).

With `spec.partition.enabled` the operator keeps a Slurm partition named after the NodeSet
(upstream's convention; `spec.partition.name` names it otherwise) through slurmrestd's
`POST /partitions/`:

- its node list is the NodeSet's pods that are registered in Slurm and stay (`members`: not
  condemned, not being deleted), each joining only once slurmctld has saved its node
  (`joins.py`: a registration alone is not saved). A partition with no nodes is fine:
  Slurm queues jobs on it, reason `PartitionConfig`, so `replicas: 0` keeps the partition
  and jobs submitted to it stay PENDING until nodes come. A node taken out keeps running
  its jobs (Slurm changes no running job when a partition's nodes change);
- a Slurm node leaves the partition before its record is deleted, and the record is deleted
  only `STATE_SAVE_S` after that (`release`, `record_free_in`). slurmctld saves its node and
  partition state in separate files, each written some seconds after a change, and a start
  from a partition state that names a node the node state lacks is fatal ("Invalid node
  names in partition"). Deleting a node straight out of the partition left exactly that on
  disk for the seconds before the next partition save: a kill -9 then and slurmctld could
  not start again (soak seed 26). So the operator deletes the Slurm node of a drained pod
  itself, once its node has been out of the partition long enough, and the pod's preStop,
  which deletes the node for deletions the operator did not make, waits the same way
  (`builder.pre_stop`). A partition update names only nodes Slurm has (re-read when Slurm
  says otherwise), and one that names a node Slurm no longer has (deleted by someone else)
  is written again, which makes slurmctld save it;
- `spec.partition.config` is a slurm.conf-style string (`MaxTime=60 Default=YES`); only the
  keys in `CONFIG_KEYS` are accepted, anything else is refused naming the key;
- the partition is the NodeSet's only if the operator created it: the NodeSet carries the
  annotation `ANNOTATION_PARTITION`, written *before* the partition is created. A partition
  of that name that exists without the annotation belongs to someone else and is never
  changed or deleted;
- Slurm's own view is the partition informer's (`SlurmInformer.want_partitions`): a
  reconcile sends nothing while Slurm shows the partition as it was written, and a partition
  slurmctld lost (restarted or reconfigured without `ReconfigFlags=KeepPartInfo`, or deleted
  by an admin) or changed is written again as soon as the informer sees it (its partition
  event brings the NodeSet back), at any replica count; `PartitionReady` is true only while
  the informer shows it;
- when the NodeSet is deleted, the partition is set DRAIN (no new jobs; queued ones still
  run) and the jobs already queued in it run on the NodeSet's nodes before they are drained
  (`queued_jobs`, `sync.finalize`); it is deleted after every pod was drained and deleted,
  or when `enabled` is turned off.

Problems are reported on the NodeSet condition `PartitionReady`; nothing is deleted on error.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from slinky.kube import conditions, events, rest
from slinky.operator.nodeset import builder, pods
from slinky.operator.nodeset.joins import Joins
from slinky.operator.nodeset.view import Context, View, claimant
from slinky.operator.resources import NODESETS
from slinky.slurm import errors
from slinky.slurm.models import Job, Partition, csv, expand_hostlist
from slinky.types import JSON

log = logging.getLogger(__name__)

ANNOTATION_PARTITION = builder.ANNOTATION_PARTITION
ANNOTATION_SKIP_DRAIN = "nodeset.slinky.slurm.net/delete-without-drain"
# Pending jobs a deleted NodeSet does not wait for: they would not start soon, if ever.
NOT_RUNNING_SOON = frozenset(
    {"JobHeldUser", "JobHeldAdmin", "DependencyNeverSatisfied", "BeginTime"}
)
CONDITION = "PartitionReady"
RETRY_S = 10.0  # after an error: Slurm unreachable, refused, or a conflict resolved by hand
# How long a node must have been out of the partition before its Slurm node is deleted:
# slurmctld's state thread looks every second and writes at most every 5 s (SAVE_MAX_WAIT),
# so a partition state written after the change is on disk well within this. The slurmd
# container's preStop waits as long (`builder.pre_stop`).
STATE_SAVE_S = builder.STATE_SAVE_S
FORGET_LEFT_S = 3600.0  # when a node left the partition is kept this long


def claimed_by(nodeset: JSON) -> str | None:
    """The partition name this NodeSet claimed (made, or is making), if any."""
    name = (nodeset["metadata"].get("annotations") or {}).get(ANNOTATION_PARTITION)
    return str(name) if name else None


def runs_first(job: Job, partition: str) -> bool:
    """A job queued in `partition` that a deletion of its NodeSet lets run first: pending,
    and not held or waiting for a begin time or a dependency that never comes."""
    return (
        job.is_pending
        and job.state_reason not in NOT_RUNNING_SOON
        and partition in csv(job.partition)
    )


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


def _name(key: str, value: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]+", value):
        raise PartitionConfigError(f"{key}={value}: not a name (letters, digits, . _ -)")
    return value


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
    # A topology of topology.yaml (e.g. the tree the operator places nodes in).
    "topology": lambda b, k, v: _put(b, "topology", _name(k, v)),
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
    spec = view.spec.partition
    return (spec.name if spec is not None and spec.name else None) or view.name


def matches(want: JSON, have: JSON) -> bool:
    """Whether Slurm's partition (`have`, as listed) shows what we wrote (`want`): the same
    nodes, and every option we set that Slurm lists at the same place with the same value
    (flags are write-only in the listing: not compared)."""
    want_nodes = set(expand_hostlist((want.get("nodes") or {}).get("configured") or ""))
    have_nodes = set(expand_hostlist((have.get("nodes") or {}).get("configured") or ""))
    if want_nodes != have_nodes:
        return False

    def same(w: Any, h: Any) -> bool:
        if isinstance(w, dict):
            return not isinstance(h, dict) or all(k not in h or same(v, h[k]) for k, v in w.items())
        if isinstance(w, list) and isinstance(h, list):
            return sorted(map(str, w)) == sorted(map(str, h))
        return h is None or str(w) == str(h)

    return all(
        k in ("name", "nodes", "flags") or k not in have or same(v, have[k])
        for k, v in want.items()
    )


def members(view: View) -> list[str]:
    """The partition's nodes: the NodeSet's pods whose slurmd registered in Slurm (identity
    checked) and that stay: not being deleted, not condemned (their node is drained and
    goes once its jobs end), not taken out by this pass."""
    return sorted(
        name
        for name, pod in view.active.items()
        if name not in view.leaving
        and pods.condemned(pod) is None
        and view.slurm_node(pod) is not None
    )


def named_by(nodes: str) -> set[str]:
    return set(expand_hostlist(nodes)) if nodes else set()


@dataclass
class Outcome:
    """What the step says on the `PartitionReady` condition (None: nothing to say)."""

    ok: bool
    reason: str
    message: str
    recheck: float | None = None  # seconds until a node waiting to join may


class Partitions:
    """The partition step. Slurm's partitions come from the Cluster's Slurm informer, so a
    reconcile that changes nothing sends nothing to Slurm."""

    def __init__(self) -> None:
        # (NodeSet UID, partition) pairs the informer has shown: one missing after that was
        # lost by Slurm, not yet made.
        self._seen: set[tuple[str, str]] = set()
        # By NodeSet UID: the nodes of our last accepted write of its partition, and when
        # each node that left them did (monotonic; the first sight, for one this process
        # never wrote).
        self._written: dict[str, frozenset[str]] = {}
        self._left: dict[str, dict[str, float]] = {}
        self._wrote_at: dict[str, float] = {}  # monotonic, of that last write
        self._joins = Joins()

    def claimed(self, view: View) -> str | None:
        return claimed_by(view.obj)

    async def sync(self, ctx: Context, view: View) -> Outcome | None:
        """Create or update the partition (enabled), or delete ours (disabled)."""
        spec = view.spec.partition
        if spec is None or not spec.enabled:
            if view.conn is not None:
                view.conn.informer.want_partitions(view.key, False)
            if self.claimed(view) is not None:
                return await self._delete_disabled(ctx, view)
            if conditions.find((view.obj.get("status") or {}).get("conditions"), CONDITION):
                # Said on every reconcile, so a status written from a stale cache converges.
                return Outcome(True, "PartitionDisabled", "spec.partition.enabled is false")
            return None
        name = partition_name(view)
        claimed = self.claimed(view)
        if claimed is not None and claimed != name:
            return Outcome(
                False,
                "PartitionRenamed",
                f"this NodeSet made Slurm partition {claimed}; spec.partition.name {name} "
                "cannot replace it (set it back, or disable the partition first)",
            )
        try:
            config = parse_config(spec.config)
        except PartitionConfigError as e:
            return Outcome(False, "InvalidPartitionConfig", f"spec.partition.config: {e}")
        if not view.slurm_ready or view.conn is None:
            return Outcome(False, "SlurmNotReady", f"partition {name} waits for Slurm")
        informer = view.conn.informer
        informer.want_partitions(view.key, True)
        if not informer.partitions_synced:
            # The first list is on its way; its events bring this NodeSet back.
            return Outcome(False, "SlurmNotReady", f"partition {name}: reading Slurm's partitions")
        nodes, joining_in = self._members(view, name)
        body: JSON = {"name": name, **config, "nodes": {"configured": ",".join(nodes)}}
        existing = informer.partitions.get(name)
        if existing is not None and claimed is None:
            return Outcome(
                False,
                "PartitionConflict",
                f"Slurm partition {name} already exists and was not created for this "
                f"NodeSet (no annotation {ANNOTATION_PARTITION}={name}); it is left alone. "
                "Rename the NodeSet (or spec.partition.name) or remove that partition from Slurm",
            )
        uid = str(view.obj["metadata"]["uid"])
        seen = (uid, name)
        if existing is not None:
            self._seen.add(seen)
            if matches(body, existing.raw) and not self._vanished(view, uid):
                self._observed(uid, named_by(existing.nodes))
                return Outcome(True, "PartitionReady", self._message(body, joining_in), joining_in)
        if claimed is None:
            await self._claim(ctx, view, name)
        try:
            await self._put(view, body, existing)
        except errors.SlurmError as e:
            return Outcome(False, "PartitionRefused", f"Slurm refused partition {name}: {e}")
        if existing is None:
            lost = seen in self._seen
            reason, what = (
                (
                    "PartitionRecreated",
                    "was gone from Slurm (slurmctld restarted or "
                    "reconfigured without ReconfigFlags=KeepPartInfo, or an admin deleted it); "
                    "created again",
                )
                if lost
                else ("PartitionCreated", "created")
            )
            ctx.recorder.event(
                view.obj,
                events.WARNING if lost else events.NORMAL,
                reason,
                f"Slurm partition {name} {what}",
            )
            log.info("nodeset %s: Slurm partition %s %s", view.key, name, what)
        return Outcome(True, "PartitionReady", self._message(body, joining_in), joining_in)

    def _members(self, view: View, name: str) -> tuple[list[str], float | None]:
        """`members`, less those not yet saved by slurmctld (`joins.py`), and the seconds
        until the next of those may join."""
        assert view.conn is not None
        uid = str(view.obj["metadata"]["uid"])
        listed = view.conn.informer.partitions.get(name)
        inside = set(self._written.get(uid, ())) | named_by(listed.nodes if listed else "")
        candidates: dict[str, bool] = {}
        for node in members(view):
            slurm_node = view.slurm_node(view.active[node])
            comment = slurm_node.comment if slurm_node is not None else ""
            candidates[node] = claimant(comment) == (view.namespace, node)
        return self._joins.admit(uid, candidates, inside, time.monotonic())

    async def _put(self, view: View, body: JSON, existing: Partition | None) -> None:
        """Write the partition. Its node list names only nodes Slurm has: when Slurm says a
        name is invalid (a node deleted since the informer's last poll), the list is
        filtered by a live read of the nodes and written once more. Raises SlurmError."""
        assert view.conn is not None
        client = view.conn.client
        try:
            await client.put_partition(body)
        except errors.SlurmError as e:
            if errors.ESLURM_INVALID_NODE_NAME not in e.error_numbers:
                raise
            listed, _ = await client.list_nodes()
            have = {n.name for n in listed or []}
            nodes = [n for n in body["nodes"]["configured"].split(",") if n in have]
            body = {**body, "nodes": {"configured": ",".join(nodes)}}
            await client.put_partition(body)
            view.conn.informer.poke(full=True)  # a delta poll does not show a deleted node
        uid = str(view.obj["metadata"]["uid"])
        before = self._written.get(uid, frozenset())
        if existing is not None:
            before |= named_by(existing.nodes)
        self._wrote(uid, before, named_by(body["nodes"]["configured"]))
        view.conn.informer.poke(partitions=True)

    def _wrote(self, uid: str, before: Iterable[str], now_in: set[str]) -> None:
        """Our write of the partition with `now_in` was accepted; `before` is what it named
        until then (our last write, and what Slurm listed): those not in it left now."""
        at = time.monotonic()
        left = {n: t for n, t in self._left.get(uid, {}).items() if at - t < FORGET_LEFT_S}
        self._left[uid] = left
        for node in set(before) - now_in:
            left[node] = at
        for node in now_in:
            left.pop(node, None)
        self._written[uid] = frozenset(now_in)
        self._wrote_at[uid] = at

    def _observed(self, uid: str, shown: set[str]) -> None:
        """Slurm shows the partition as we want it: what it lists is what we wrote (after a
        restart of the operator, the first sight stands for the write)."""
        if uid not in self._written:
            self._written[uid] = frozenset(shown)

    def forget(self, uid: str) -> None:
        """The NodeSet is gone, its partition deleted: nothing more to remember."""
        for book in (self._written, self._left, self._wrote_at):
            book.pop(uid, None)
        self._joins.forget(uid)

    def _vanished(self, view: View, uid: str) -> bool:
        """A node of our last write that Slurm no longer has (someone deleted it while it
        was in the partition): slurmctld dropped it from the partition in memory, but its
        saved partition state still names it until the partition is written again."""
        written = self._written.get(uid)
        if not written or view.conn is None:
            return False
        nodes = view.conn.informer.nodes
        return any(n not in nodes for n in written)

    def record_free_in(self, view: View, node: str) -> float | None:
        """Seconds until the Slurm node `node` may be deleted, as far as the partition goes:
        0 for a NodeSet without one of its own; None while the node may be in it (our last
        write names it, or Slurm's listing does, or neither is known yet: after a restart,
        before the first partition list); otherwise what is left of `STATE_SAVE_S` since
        it left (since it was first seen out, for one this process did not take out)."""
        name = self.claimed(view)
        uid = str(view.obj["metadata"]["uid"])
        now = time.monotonic()
        if name is None or view.conn is None:
            # No partition (any more): only one deleted a moment ago still counts.
            since = self._left.get(uid, {}).get(node)
            return 0.0 if since is None else max(0.0, since + STATE_SAVE_S - now)
        informer = view.conn.informer
        informer.want_partitions(view.key, True)  # also while deleting or renamed
        written = self._written.get(uid)
        shown: set[str] | None = None
        if informer.partitions_synced:
            listed = informer.partitions.get(name)
            shown = named_by(listed.nodes) if listed is not None else set()
        if written is None and shown is None:
            return None  # cannot tell yet: the first list is on its way
        in_written = written is not None and node in written
        # Slurm's listing, unless it was asked for before our last write.
        current = written is None or informer.partitions_read_at > self._wrote_at.get(uid, 0.0)
        in_shown = shown is not None and node in shown and current
        if in_written or in_shown:
            if not in_written:
                # Put back since our write (by an admin, or a slurmctld restarted from older
                # state): its wait starts again once it is out.
                self._left.get(uid, {}).pop(node, None)
            return None
        since = self._left.setdefault(uid, {}).setdefault(node, now)
        return max(0.0, since + STATE_SAVE_S - now)

    async def release(self, view: View, names: set[str]) -> dict[str, float | None]:
        """The nodes `names` are about to go (their pods drained, or gone): take them out of
        the NodeSet's partition (one write) if it may still have them. Returns, by name, the
        seconds until each Slurm node may be deleted (`record_free_in`; None: still in the
        partition, as the write failed)."""
        view.leaving |= names
        if self.claimed(view) is None or view.conn is None:
            return {n: self.record_free_in(view, n) for n in names}
        if any(self.record_free_in(view, n) is None for n in names):
            if not view.conn.informer.partitions_synced:
                # After a restart, before the first list: which nodes are in the partition
                # (and so need not wait to join, joins.py) is not known; the list is asked
                # for (`record_free_in`) and its event brings the NodeSet back.
                return dict.fromkeys(names, None)
            name = str(self.claimed(view))
            existing = view.conn.informer.partitions.get(name)
            nodes, _ = self._members(view, name)
            body: JSON = {"name": name, "nodes": {"configured": ",".join(nodes)}}
            try:
                await self._put(view, self._whole(view, body, existing), existing)
            except errors.SlurmError as e:
                try:  # the options may be what Slurm refuses: the nodes alone
                    await self._put(view, body, existing)
                except errors.SlurmError:
                    log.info(
                        "nodeset %s: partition %s keeps %s for now: %s", view.key, name, names, e
                    )
                    return dict.fromkeys(names, None)
        return {n: self.record_free_in(view, n) for n in names}

    @staticmethod
    def _whole(view: View, body: JSON, existing: Partition | None) -> JSON:
        """`body` with the partition's options when Slurm may not have it (lost, or not read
        yet), so that a partition Slurm lost comes back as the partition step makes it."""
        spec = view.spec.partition
        if existing is not None or spec is None or not spec.enabled or view.deleting:
            return body
        try:
            return {**parse_config(spec.config), **body}
        except PartitionConfigError:
            return body

    @staticmethod
    def _message(body: JSON, joining_in: float | None = None) -> str:
        nodes = body["nodes"]["configured"]
        out = f"Slurm partition {body['name']}: nodes {nodes or '(none yet)'}"
        if joining_in is not None:
            out += f"; new nodes join in {math.ceil(joining_in)}s, once slurmctld has saved them"
        return out

    async def _claim(self, ctx: Context, view: View, name: str) -> None:
        """Mark the partition as this NodeSet's before creating it, so a crash between the
        two never leaves a partition the operator would later call foreign."""
        meta = view.obj["metadata"]
        patch = {"metadata": {"annotations": {ANNOTATION_PARTITION: name}}}
        view.obj = await ctx.kube.patch(NODESETS, meta["name"], patch, meta["namespace"])

    async def _delete_disabled(self, ctx: Context, view: View) -> Outcome | None:
        name = self.claimed(view) or partition_name(view)
        if view.conn is None or not view.slurm_ready:
            return Outcome(
                False, "SlurmNotReady", f"partition {name} is deleted once Slurm is reachable"
            )
        if not await self.delete(ctx, view):
            return Outcome(
                False, "PartitionDeleteFailed", f"partition {name} could not be deleted; retrying"
            )
        uid = str(view.obj["metadata"]["uid"])
        shown = view.conn.informer.partitions.get(name) if view.conn is not None else None
        before = self._written.get(uid, frozenset()) | named_by(shown.nodes if shown else "")
        self._wrote(uid, before, set())
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

    async def queued_jobs(self, ctx: Context, view: View) -> str | None:
        """The NodeSet is being deleted: its partition is set DRAIN (Slurm takes no new jobs
        into it, and still runs the queued ones), and while jobs queued in it can still run
        (the NodeSet has pods to run them; not held or waiting for a far begin time) the
        nodes are not drained. Returns why the deletion waits, or None when it need not."""
        name = self.claimed(view)
        if name is None or view.conn is None or not view.slurm_ready:
            return None
        client = view.conn.client
        shown = view.conn.informer.partitions.get(name)
        if shown is None or "DRAIN" not in shown.state.split(","):
            try:
                await client.put_partition({"name": name, "partition": {"state": ["DRAIN"]}})
            except errors.SlurmNotFound:
                return None
            except errors.SlurmError as e:
                return f"partition {name} cannot be set DRAIN yet ({e}); retrying"
            view.conn.informer.poke(partitions=True)
            ctx.recorder.event(
                view.obj,
                events.NORMAL,
                "PartitionDraining",
                f"Slurm partition {name} set DRAIN: no new jobs; the queued ones run first",
            )
        if not view.active:
            return None  # no node to run them: the partition's deletion says what waits
        try:
            jobs, _ = await client.list_jobs()  # only while a deletion waits
        except errors.SlurmError as e:
            return f"cannot read the jobs queued in partition {name} ({e}); retrying"
        queued = sorted(j.job_id for j in jobs or [] if runs_first(j, name))
        if not queued:
            return None
        shown_ids = ", ".join(map(str, queued[:10])) + (" ..." if len(queued) > 10 else "")
        return (
            f"{len(queued)} jobs queued in Slurm partition {name} run first on this NodeSet's "
            f"nodes (jobs {shown_ids}); the partition is DRAIN, so no new ones come. To stop "
            f'waiting: cancel them, or annotate the NodeSet {ANNOTATION_SKIP_DRAIN}="true" '
            "(running jobs are then killed too)"
        )

    async def delete(self, ctx: Context, view: View) -> bool:
        """Delete the partition if it is this NodeSet's; True when it is gone (or was never
        ours). Called by the deletion finalizer once every pod is gone."""
        name = self.claimed(view)
        if name is None:
            return True
        if view.conn is not None:
            view.conn.informer.want_partitions(view.key, False)
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
            self.forget(str(view.obj["metadata"]["uid"]))
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
        self.forget(str(view.obj["metadata"]["uid"]))
        return True
