"""Where a Slurm node sits, from the Kubernetes node its pod runs on: features and topology.

Features: each label of the Kubernetes node whose key is one of `--node-feature-labels`
(an exact key, or a prefix ending in `/`, like Node Feature Discovery's
`feature.node.kubernetes.io/`) gives the Slurm node one feature, so `--constraint` selects
on it. A label whose value is `true` gives the key's last part (`.../cpu-cpuid.AVX512F` ->
`cpu-cpuid.AVX512F`); `false` gives nothing; under an exact key, any other value gives the
value (`topology.kubernetes.io/zone=zone-a` -> `zone-a`), under a prefix nothing (NFD's
`cpu-model.family=6` would give a bare `6`). A name Slurm cannot take in a feature (outside
`[A-Za-z0-9._-]`) is left out.

The operator remembers which features it added in the pod annotation
`nodeset.slinky.slurm.net/slurm-features` (not those the node had already): a feature slurmd
registered with (`--conf "Features=..."`) or an admin set stays, and one whose label went is
removed.

Topology: a Kubernetes node annotated `topology.slinky.slurm.net/spec` (upstream's
convention) gives its value as is, e.g. `topo-block:b1`. Otherwise `--topology-labels` names
label keys from the outermost level to the innermost (e.g.
`topology.kubernetes.io/zone,example.com/rack`), and the Slurm node is placed under
`--topology-root` (`<tree topology>:<switch>`, declared in topology.yaml) in switches named
by the values, each inner one prefixed by its parents so that two zones may both have a
rack `r1`: `Topology=default:root:zone-a:zone-a.r1`. slurmctld makes the switches as
needed and keeps them across restarts (in the node state), no reconfigure. A node lacking
one of the labels is left where it is.

A topology a Slurm node was placed in must stay in topology.yaml: slurmctld refuses to start
from state that names a topology it does not have.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from typing import Any

from slinky.kube import events
from slinky.operator.nodeset import pods
from slinky.operator.nodeset.builder import ANNOTATION_SLURM_FEATURES
from slinky.operator.nodeset.view import Context, Placement, View, belongs_to
from slinky.slurm import errors
from slinky.slurm.models import Node
from slinky.types import JSON

log = logging.getLogger(__name__)

FEATURE_NAME = re.compile(r"[A-Za-z0-9._-]+")
TOPOLOGY_SPEC = re.compile(
    r"[A-Za-z0-9._-]+(:[A-Za-z0-9._-]+)+(,[A-Za-z0-9._-]+(:[A-Za-z0-9._-]+)+)*"
)
# Upstream's: the Slurm topology of the nodes of the pods on a Kubernetes node, as is.
ANNOTATION_TOPOLOGY_SPEC = "topology.slinky.slurm.net/spec"


def label_features(labels: Mapping[str, str], placement: Placement) -> list[str]:
    """The Slurm features the labels give (sorted, each once)."""
    out: set[str] = set()
    for key, value in labels.items():
        if not placement.gives_feature(key) or value == "false":
            continue
        if value != "true" and key not in placement.feature_labels:
            continue  # under a prefix only true counts: `...family=6` would give "6"
        feature = key.rsplit("/", 1)[-1] if value == "true" else value
        if FEATURE_NAME.fullmatch(feature):
            out.add(feature)
    return sorted(out)


def topology_unit(node: Mapping[str, Any], placement: Placement) -> str | None:
    """The Slurm `Topology=` of the pods on this Kubernetes node, or None: its annotation,
    or the switch path its labels give (None when one is missing or cannot be a switch
    name)."""
    meta = node.get("metadata") or {}
    spec = (meta.get("annotations") or {}).get(ANNOTATION_TOPOLOGY_SPEC)
    if spec:
        return str(spec) if TOPOLOGY_SPEC.fullmatch(str(spec)) else None
    if not placement.topology_labels:
        return None
    labels = meta.get("labels") or {}
    names = [labels.get(k) for k in placement.topology_labels]
    if any(n is None or not FEATURE_NAME.fullmatch(n) for n in names):
        return None
    path = [".".join(str(n) for n in names[: i + 1]) for i in range(len(names))]
    return ":".join([placement.topology_root, *path])


def added(pod: JSON) -> list[str]:
    """The features the operator added to the pod's Slurm node (its annotation)."""
    text = pods.annotation(pod, ANNOTATION_SLURM_FEATURES) or ""
    return [f for f in text.split(",") if f]


async def sync_placement(ctx: Context, view: View) -> None:
    """Features and topology of each pod's Slurm node follow its Kubernetes node's labels;
    a write happens only when they differ (cached views on both sides), and not while an
    earlier write is still to show in the Slurm view (a decision on that stale view would
    take the old features for someone else's)."""
    placement = ctx.placement
    conn = view.conn
    if conn is None:
        return
    for pod, node in view.pods_with_nodes():
        kube_node = ctx.nodes.store.get(pods.node_name(pod) or "")
        if kube_node is None or not belongs_to(node, view.namespace, node.name):
            continue
        if placement.feature_labels and not _awaiting(ctx, conn.cluster_key, node, "features"):
            labels = kube_node["metadata"].get("labels") or {}
            mine, before = label_features(labels, placement), added(pod)
            others = [f for f in node.features if f not in before]
            want = others + [f for f in mine if f not in others]
            ours = [f for f in mine if f not in others]  # only what the operator adds
            shown = set(want) == set(node.features)  # Slurm may list them in its own order
            if not shown:
                body = {"features": want, "features_act": want}
                shown = await _write(ctx, view, node, "features", body)
            if shown and ours != before:  # what Slurm took, never what it refused
                await ctx.podcontrol.patch_metadata(
                    pod, annotations={ANNOTATION_SLURM_FEATURES: ",".join(ours) or None}
                )
        unit = topology_unit(kube_node, placement)
        if (
            unit is not None
            and unit != node.topology
            and not _awaiting(ctx, conn.cluster_key, node, "topology")
        ):
            await _write(ctx, view, node, "topology", {"topology_str": unit})


async def _write(ctx: Context, view: View, node: Node, kind: str, body: dict[str, Any]) -> bool:
    """One placement write (features or topology: a refused topology must not hold back
    the features). True when Slurm took it. A refusal is told once and tried again in
    minutes; Slurm unreachable is left to the next reconcile."""
    assert view.conn is not None
    key = f"{view.conn.cluster_key}/{node.name}/{kind}"
    last = ctx.placement_writes.get(key)
    if (
        last is not None
        and last[0] == body
        and not last[2]
        and time.monotonic() - last[1] < REFUSED_RETRY_S
    ):
        return False
    try:
        await view.conn.client.update_node(node.name, extra=body)
    except errors.SlurmNotFound:
        return False
    except errors.SlurmUnavailable as e:
        log.info("nodeset %s: cannot place Slurm node %s now (%s)", view.key, node.name, e)
        return False
    except errors.SlurmError as e:
        _remember(ctx, key, body, accepted=False)
        log.info("nodeset %s: Slurm refused %s of node %s (%s)", view.key, kind, node.name, e)
        ctx.recorder.event(
            view.obj,
            events.WARNING,
            "SlurmNodePlacementFailed",
            f"Slurm node {node.name}: {kind} not set: {e}",
        )
        return False
    _remember(ctx, key, body, accepted=True)
    log.info("nodeset %s: Slurm node %s placed: %s", view.key, node.name, body)
    return True


# An accepted write waits this long at most for the Slurm view to show it; a refused one (a
# topology topology.yaml lacks) is tried again after REFUSED_RETRY_S, not at every reconcile.
ACCEPTED_GRACE_S = 30.0
REFUSED_RETRY_S = 300.0


def _awaiting(ctx: Context, conn_key: str, node: Node, kind: str) -> bool:
    """Whether an accepted write of `kind` to `node` is recent and the Slurm view does not
    show it yet: nothing is decided on that view."""
    last = ctx.placement_writes.get(f"{conn_key}/{node.name}/{kind}")
    if last is None or not last[2] or time.monotonic() - last[1] >= ACCEPTED_GRACE_S:
        return False
    written = last[0]
    if kind == "features":
        return set(written["features"]) != set(node.features)
    return bool(written["topology_str"] != node.topology)


def _remember(ctx: Context, key: str, body: dict[str, Any], *, accepted: bool) -> None:
    now = time.monotonic()
    writes = ctx.placement_writes
    if len(writes) > 4096:  # nodes gone since: forget what is past every grace
        for old in [k for k, w in writes.items() if now - w[1] > REFUSED_RETRY_S]:
            del writes[old]
    writes[key] = (body, now, accepted)
