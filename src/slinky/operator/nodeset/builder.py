"""Pure builders: NodeSet spec in, Kubernetes objects out. No I/O, tested by value.

A NodeSet pod is `<nodeset>-<ordinal>`; its hostname is its name (so slurmd registers under
that name) and its subdomain the NodeSet's headless Service (stable DNS for MPI). The
container named `slurmd` becomes a dynamic Slurm node: `slurmd -D -Z --conf-server <ctld>
--conf "Features=<nodeset> ..."`, keeping any of those flags the user already set, with a
preStop hook that marks the node DOWN and deletes its record before the pod goes away.

Node size: when the slurmd container has resource limits, the node registers with them
(`CPUs=` the CPU limit rounded down, at least 1; `RealMemory=` the memory limit in MiB less
what slurmd and its slurmstepds keep, `memory_reserve_mib`), not with the host's hardware
that slurmd would detect. Jobs run inside the slurmd container, so its limits are theirs;
other containers of the pod have limits of their own. An extended resource the operator
maps to a GRES (`--gres-resources`, by default `nvidia.com/gpu` and `amd.com/gpu` to `gpu`)
adds `Gres=<name>:<count>`. A `CPUs=`/`RealMemory=`/`Gres=` in the user's `--conf` wins.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import re
import shlex
from collections.abc import Mapping

from slinky.api.v1alpha1 import API_VERSION
from slinky.api.v1alpha1.nodeset import KIND, LabelSelector, NodeSetSpec
from slinky.kube import objects
from slinky.kube.quantity import parse_quantity
from slinky.types import JSON

SLURMD_CONTAINER = "slurmd"
LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_REVISION = "controller-revision-hash"
LABEL_NODESET = "nodeset.slinky.slurm.net/name"
LABEL_PROTECT = "nodeset.slinky.slurm.net/pod-protect"
ANNOTATION_CORDON = "nodeset.slinky.slurm.net/pod-cordon"
ANNOTATION_DELETION_COST = "nodeset.slinky.slurm.net/pod-deletion-cost"
ANNOTATION_DEADLINE = "nodeset.slinky.slurm.net/pod-deadline"
ANNOTATION_NODE_CORDON_REASON = "nodeset.slinky.slurm.net/node-cordon-reason"
ANNOTATION_CONDEMNED = "nodeset.slinky.slurm.net/condemned"
# When the pod was first condemned, and when every job on its Slurm node ends at the latest
# (start + time limit, as Slurm reported it right after the drain): RFC 3339.
ANNOTATION_CONDEMNED_AT = "nodeset.slinky.slurm.net/condemned-at"
ANNOTATION_DRAIN_DEADLINE = "nodeset.slinky.slurm.net/drain-deadline"
# The Slurm features the operator added to the pod's node from Kubernetes node labels
# (`placement`), so that those whose label went are removed and no other is.
ANNOTATION_SLURM_FEATURES = "nodeset.slinky.slurm.net/slurm-features"
MANAGER = "slurm-operator"
REASON_PREFIX = "slurm-operator: "
PRESTOP_REASON = f"{REASON_PREFIX}pod terminating"
# The slurmd container's variable naming the NodeSet's own Slurm partition (pre_stop), and
# how long slurmctld needs to save the partition without a node (see `partition`).
ENV_PARTITION = "SLINKY_PARTITION"
# On a NodeSet: the Slurm partition it made (written before the partition is created).
ANNOTATION_PARTITION = "nodeset.slinky.slurm.net/partition"
STATE_SAVE_S = 10.0
PRESTOP_PARTITION_WAIT_S = 60


def pod_name(nodeset: str, ordinal: int) -> str:
    return f"{nodeset}-{ordinal}"


def ordinal_of(nodeset: str, name: str) -> int | None:
    """The ordinal of a pod of `nodeset`, or None if the name is not `<nodeset>-<n>`."""
    m = re.fullmatch(re.escape(nodeset) + r"-(0|[1-9][0-9]*)", name)
    return int(m.group(1)) if m else None


def service_name(nodeset_obj: JSON, spec: NodeSetSpec) -> str:
    return spec.service_name or str(nodeset_obj["metadata"]["name"])


def selector_string(selector: LabelSelector) -> str:
    """The selector in kubectl/HPA string form."""
    parts = [f"{k}={v}" for k, v in sorted((selector.match_labels or {}).items())]
    for req in selector.match_expressions or []:
        values = ",".join(req.values or [])
        if req.operator == "In":
            parts.append(f"{req.key} in ({values})")
        elif req.operator == "NotIn":
            parts.append(f"{req.key} notin ({values})")
        elif req.operator == "Exists":
            parts.append(req.key)
        else:
            parts.append(f"!{req.key}")
    return ",".join(parts)


def revision_hash(template: JSON, conf_server: str | None, service: str = "") -> str:
    """A short stable hash of what the pods are built from: the template, slurmd's
    `--conf-server` (so changing the Cluster's `spec.controller` rolls the pods) and the
    Service giving them DNS (their subdomain)."""
    data = json.dumps(
        {"template": template, "confServer": conf_server, "service": service},
        sort_keys=True,
        separators=(",", ":"),
    ).encode()
    return hashlib.sha256(data).hexdigest()[:10]


def owner_ref(nodeset_obj: JSON) -> JSON:
    return objects.owner_reference(
        {"apiVersion": API_VERSION, "kind": KIND, "metadata": nodeset_obj["metadata"]}
    )


def template_sets_conf_server(template: JSON) -> bool:
    """Whether the template's slurmd container already passes `--conf-server`."""
    for c in (template.get("spec") or {}).get("containers") or []:
        if c.get("name") == SLURMD_CONTAINER:
            return _has_flag([str(a) for a in c.get("args") or []], "--conf-server")
    return False


def _has_flag(args: list[str], *flags: str) -> bool:
    return any(a in flags or any(a.startswith(f + "=") for f in flags) for a in args)


def slurmd_args(
    args: list[str],
    *,
    nodeset: str,
    conf_server: str | None,
    node_conf: dict[str, str] | None = None,
) -> list[str]:
    """slurmd's arguments with the operator's flags added unless the user set them;
    `node_conf` (e.g. the node size) goes into `--conf` after `Features=<nodeset>`."""
    out = list(args)
    if not _has_flag(out, "-D"):
        out.append("-D")
    if not _has_flag(out, "-Z"):
        out.append("-Z")
    if conf_server and not _has_flag(out, "--conf-server"):
        out += ["--conf-server", conf_server]
    ours = {"Features": nodeset, **(node_conf or {})}
    for i, a in enumerate(out):
        if a == "--conf" and i + 1 < len(out):
            out[i + 1] = conf_with(out[i + 1], ours)
            break
        if a.startswith("--conf="):
            out[i] = f"--conf={conf_with(a.removeprefix('--conf='), ours)}"
            break
    else:
        out += ["--conf", conf_with("", ours)]
    return out


def conf_with(conf: str, ours: dict[str, str]) -> str:
    """A slurmd `--conf` line with our `Key=value`s in front, except the keys it already
    has (Slurm's keys are case-insensitive)."""
    have = {part.split("=", 1)[0].lower() for part in conf.split()}
    add = [f"{k}={v}" for k, v in ours.items() if k.lower() not in have]
    return " ".join([*add, conf]).strip()


def memory_reserve_mib(limit_mib: int) -> int:
    """Memory of the slurmd container kept out of the Slurm node's RealMemory for slurmd and
    one slurmstepd per job step: 128 MiB, at most a quarter of a small limit."""
    return min(128, limit_mib // 4)


DEFAULT_GRES_RESOURCES: Mapping[str, str] = {"nvidia.com/gpu": "gpu", "amd.com/gpu": "gpu"}


def node_size(
    container: JSON, gres_resources: Mapping[str, str] = DEFAULT_GRES_RESOURCES
) -> dict[str, str]:
    """`CPUs`, `RealMemory` and `Gres` from the slurmd container's limits ({} for what has
    none, or a limit Kubernetes would refuse: the pod's creation then fails naming it).
    `gres_resources`: extended resource -> GRES name (several may count into one)."""
    limits = (container.get("resources") or {}).get("limits") or {}
    out: dict[str, str] = {}
    gres: dict[str, int] = {}
    try:
        if "cpu" in limits:
            out["CPUs"] = str(max(1, math.floor(parse_quantity(limits["cpu"]))))
        if "memory" in limits:
            mib = int(parse_quantity(limits["memory"]) // 2**20)
            out["RealMemory"] = str(max(1, mib - memory_reserve_mib(mib)))
        for resource, name in gres_resources.items():
            if resource in limits:
                gres[name] = gres.get(name, 0) + int(parse_quantity(limits[resource]))
    except ValueError:
        return {}
    if any(gres.values()):
        out["Gres"] = ",".join(f"{n}:{c}" for n, c in sorted(gres.items()) if c > 0)
    return out


def pre_stop() -> JSON:
    """DRAIN, wait while jobs run (bounded by the pod's terminationGracePeriodSeconds),
    then DOWN (with the operator's reason) and delete the Slurm node record. A state Slurm
    cannot say (slurmctld down or restarting) is waited on as a busy one: only slurmctld's
    own "not found" says the node is gone; a failed read never lets slurmd stop under a job.

    The operator drains before it deletes a pod; the wait is for deletions it does not
    control (a namespace being deleted, `kubectl delete pod`), so those do not kill a job
    that ends within the grace period. A drain made by someone else keeps its reason.

    With `$SLINKY_PARTITION` set (the NodeSet has its own partition), the record is deleted
    only after the node has left that partition (the operator takes a terminating pod's node
    out) and `partition.STATE_SAVE_S` more, so slurmctld has saved the partition without it
    (see `partition`); if the operator does not take it out within a minute, the record is
    left DOWN for the operator to delete later. A node the operator already deleted (the
    deletions it makes) ends the hook at once."""
    reason = shlex.quote(f"reason={PRESTOP_REASON}")
    script = (
        'out=$(scontrol -o show node "$HOSTNAME" 2>&1) || case "$out" in '
        "*' not found'*) exit 0;; esac; "
        # The node's state; GONE only on Slurm's own "not found", UNKNOWN when slurmctld
        # cannot be asked (down, restarting): a job may still run, so that is "busy".
        'state() { s=$(scontrol -o show node "$HOSTNAME" 2>&1) || { case "$s" in '
        "*' not found'*) echo GONE;; *) echo UNKNOWN;; esac; return 0; }; "
        's=${s#*State=}; echo "${s%% *}"; }; '
        # In the partition, or cannot tell (slurmctld unreachable): yes; no such node: no.
        'inside() { s=$(scontrol -o show node "$HOSTNAME" 2>&1) || { case "$s" in '
        "*' not found'*) return 1;; esac; return 0; }; "
        'case "$s" in *" Partitions="*) s=${s#* Partitions=}; s=${s%% *};; *) s=;; esac; '
        f'case ",$s," in *",${ENV_PARTITION},"*) return 0;; esac; return 1; }}; '
        'case "$(state)" in *DRAIN*) ;; *) '
        f'scontrol update nodename="$HOSTNAME" state=DRAIN {reason} || true;; esac; '
        'while :; do case "$(state)" in GONE) exit 0;; '
        "*ALLOCATED*|*MIXED*|*COMPLETING*|UNKNOWN) sleep 1;; *) break;; esac; done; "
        f'scontrol update nodename="$HOSTNAME" state=DOWN {reason} || true; '
        # Out of the partition, then long enough for slurmctld to save it so, and still out.
        f'if [ -n "${{{ENV_PARTITION}:-}}" ]; then n=0; while :; do '
        f'while inside; do n=$((n+1)); [ "$n" -gt {PRESTOP_PARTITION_WAIT_S} ] && exit 0; '
        f"sleep 1; done; sleep {STATE_SAVE_S:.0f}; inside || break; done; fi; "
        'scontrol delete nodename="$HOSTNAME" || true'
    )
    return {"exec": {"command": ["/bin/sh", "-c", script]}}


def partition_of(nodeset_obj: JSON, spec: NodeSetSpec) -> str | None:
    """The NodeSet's own Slurm partition: the one it made (its annotation), else the one
    `spec.partition` asks for."""
    made = (nodeset_obj["metadata"].get("annotations") or {}).get(ANNOTATION_PARTITION)
    if made:
        return str(made)
    if spec.partition is None or not spec.partition.enabled:
        return None
    return spec.partition.name or str(nodeset_obj["metadata"]["name"])


def build_pod(
    nodeset_obj: JSON,
    spec: NodeSetSpec,
    ordinal: int,
    *,
    revision: str,
    conf_server: str | None,
    gres_resources: Mapping[str, str] = DEFAULT_GRES_RESOURCES,
) -> JSON:
    """The pod for one ordinal of a NodeSet at `revision`."""
    name = str(nodeset_obj["metadata"]["name"])
    namespace = str(nodeset_obj["metadata"]["namespace"])
    template = copy.deepcopy(spec.template)
    tmeta = template.get("metadata") or {}
    pspec = template.get("spec") or {}
    pname = pod_name(name, ordinal)
    labels = {
        **(tmeta.get("labels") or {}),
        LABEL_NAME: "slurmd",
        LABEL_INSTANCE: name,
        LABEL_MANAGED_BY: MANAGER,
        LABEL_COMPONENT: "compute",
        LABEL_NODESET: name,
        LABEL_REVISION: revision,
    }
    # The template's own values win for labels the selector relies on.
    labels.update(
        {k: v for k, v in (tmeta.get("labels") or {}).items() if k in (LABEL_NAME, LABEL_INSTANCE)}
    )
    annotations = dict(tmeta.get("annotations") or {})

    pspec["hostname"] = pname
    pspec["subdomain"] = service_name(nodeset_obj, spec)
    containers = pspec.get("containers") or []
    for c in containers:
        if c.get("name") != SLURMD_CONTAINER:
            continue
        if not c.get("command"):
            c["command"] = ["slurmd"]
        c["args"] = slurmd_args(
            list(c.get("args") or []),
            nodeset=name,
            conf_server=conf_server,
            node_conf=node_size(c, gres_resources),
        )
        lifecycle = c.setdefault("lifecycle", {})
        lifecycle.setdefault("preStop", pre_stop())
        if part := partition_of(nodeset_obj, spec):
            env = [e for e in c.get("env") or [] if e.get("name") != ENV_PARTITION]
            c["env"] = [*env, {"name": ENV_PARTITION, "value": part}]
    pspec["containers"] = containers

    volumes = list(pspec.get("volumes") or [])
    have = {v.get("name") for v in volumes}
    for claim in spec.volume_claim_templates or []:
        cname = claim.get("metadata", {}).get("name")
        if cname and cname not in have:
            volumes.append(
                {"name": cname, "persistentVolumeClaim": {"claimName": f"{cname}-{pname}"}}
            )
    if volumes:
        pspec["volumes"] = volumes

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pname,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [owner_ref(nodeset_obj)],
        },
        "spec": pspec,
    }


def build_pvcs(nodeset_obj: JSON, spec: NodeSetSpec, ordinal: int) -> list[JSON]:
    """PVCs for one ordinal; owned by the NodeSet only when whenDeleted is Delete."""
    name = str(nodeset_obj["metadata"]["name"])
    out = []
    for claim in spec.volume_claim_templates or []:
        c = copy.deepcopy(claim)
        cname = c.get("metadata", {}).get("name")
        if not cname:
            continue
        meta = c.setdefault("metadata", {})
        meta["name"] = f"{cname}-{pod_name(name, ordinal)}"
        meta["namespace"] = nodeset_obj["metadata"]["namespace"]
        meta.setdefault("labels", {}).update({LABEL_INSTANCE: name, LABEL_NODESET: name})
        if spec.persistent_volume_claim_retention_policy.when_deleted == "Delete":
            meta["ownerReferences"] = [owner_ref(nodeset_obj)]
        c["apiVersion"], c["kind"] = "v1", "PersistentVolumeClaim"
        out.append(c)
    return out


def build_service(nodeset_obj: JSON, spec: NodeSetSpec) -> JSON:
    """The headless Service giving every pod `<pod>.<service>` DNS."""
    name = str(nodeset_obj["metadata"]["name"])
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": service_name(nodeset_obj, spec),
            "namespace": nodeset_obj["metadata"]["namespace"],
            "labels": {LABEL_INSTANCE: name, LABEL_MANAGED_BY: MANAGER},
            "ownerReferences": [owner_ref(nodeset_obj)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_NODESET: name},
            "ports": [{"name": "slurmd", "port": 6818, "targetPort": 6818}],
        },
    }


def build_pdb(nodeset_obj: JSON) -> JSON:
    """No voluntary disruption of pods whose Slurm node runs jobs."""
    name = str(nodeset_obj["metadata"]["name"])
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": f"{name}-protect",
            "namespace": nodeset_obj["metadata"]["namespace"],
            "labels": {LABEL_INSTANCE: name, LABEL_MANAGED_BY: MANAGER},
            "ownerReferences": [owner_ref(nodeset_obj)],
        },
        "spec": {
            "maxUnavailable": 0,
            "selector": {"matchLabels": {LABEL_NODESET: name, LABEL_PROTECT: "true"}},
        },
    }


def build_revision(
    nodeset_obj: JSON, spec: NodeSetSpec, revision: str, number: int, conf_server: str | None
) -> JSON:
    name = str(nodeset_obj["metadata"]["name"])
    return {
        "apiVersion": "apps/v1",
        "kind": "ControllerRevision",
        "metadata": {
            "name": f"{name}-{revision}",
            "namespace": nodeset_obj["metadata"]["namespace"],
            "labels": {LABEL_NODESET: name, LABEL_REVISION: revision},
            "ownerReferences": [owner_ref(nodeset_obj)],
        },
        "data": {"spec": {"template": spec.template}, "confServer": conf_server},
        "revision": number,
    }


def slurm_comment(pod: JSON) -> str:
    """The Slurm node comment: the pod's identity as JSON, so Slurm users can find it."""
    meta = pod["metadata"]
    owner = next(
        (o["name"] for o in meta.get("ownerReferences") or [] if o.get("kind") == "NodeSet"), ""
    )
    return json.dumps(
        {
            "namespace": meta.get("namespace"),
            "podName": meta["name"],
            "nodeSet": owner,
            "node": (pod.get("spec") or {}).get("nodeName", ""),
        },
        separators=(",", ":"),
    )
