"""Where a Slurm node sits, from the Kubernetes node its pod runs on: features and topology.

Features: each label of the Kubernetes node whose key is one of `--node-feature-labels`
(an exact key, or a prefix ending in `/`, like Node Feature Discovery's
`feature.node.kubernetes.io/`) gives the Slurm node one feature, so `--constraint` selects
on it. A label whose value is `true` gives the key's last part (`.../cpu-cpuid.AVX512F` ->
`cpu-cpuid.AVX512F`); `false` gives nothing; any other value gives the value
(`topology.kubernetes.io/zone=zone-a` -> `zone-a`). A name Slurm cannot take in a feature
(outside `[A-Za-z0-9._-]`) is left out.

The operator remembers which features it added in the pod annotation
`nodeset.slinky.slurm.net/slurm-features`: a feature slurmd registered with (`--conf
"Features=..."`) or an admin set stays, and one whose label went is removed.

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

import json
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
        feature = key.rsplit("/", 1)[-1] if value == "true" else value
        if FEATURE_NAME.fullmatch(feature):
            out.add(feature)
    return sorted(out)


def wanted_features(node: Node, added_before: list[str], from_labels: list[str]) -> list[str]:
    """The node's features with those the operator added before replaced by `from_labels`:
    what slurmd registered with and what an admin set stay, in their order."""
    before = set(added_before)
    kept = [f for f in node.features if f not in before]
    return kept + [f for f in from_labels if f not in kept]


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


def added(pod: Mapping[str, object]) -> list[str]:
    """The features the operator added to the pod's Slurm node (its annotation)."""
    text = pods.annotation(dict(pod), ANNOTATION_SLURM_FEATURES) or ""
    return [f for f in text.split(",") if f]


async def sync_placement(ctx: Context, view: View) -> None:
    """Features and topology of each pod's Slurm node follow its Kubernetes node's labels;
    a write happens only when they differ (cached views on both sides)."""
    placement = ctx.placement
    if view.conn is None:
        return
    for pod, node in view.pods_with_nodes():
        kube_node = ctx.nodes.store.get(pods.node_name(pod) or "")
        if kube_node is None or not belongs_to(node, view.namespace, node.name):
            continue
        labels = kube_node["metadata"].get("labels") or {}
        body: dict[str, object] = {}
        mine = label_features(labels, placement)
        before = added(pod)
        if placement.feature_labels:
            want = wanted_features(node, before, mine)
            if set(want) != set(node.features):  # Slurm may list them in its own order
                body["features"] = want
                body["features_act"] = want
        unit = topology_unit(kube_node, placement)
        if unit is not None and unit != node.topology:
            body["topology_str"] = unit
        if body and not _written_lately(ctx, node.name, body):
            try:
                await view.conn.client.update_node(node.name, extra=body)
            except errors.SlurmNotFound:
                continue
            except errors.SlurmError as e:
                _remember(ctx, node.name, body, accepted=False)
                log.info("nodeset %s: cannot place Slurm node %s (%s)", view.key, node.name, e)
                ctx.recorder.event(
                    view.obj,
                    events.WARNING,
                    "SlurmNodePlacementFailed",
                    f"Slurm node {node.name}: {', '.join(sorted(body))} not set: {e}",
                )
                continue
            _remember(ctx, node.name, body, accepted=True)
            log.info("nodeset %s: Slurm node %s placed: %s", view.key, node.name, body)
        if placement.feature_labels and mine != before:
            await ctx.podcontrol.patch_metadata(
                pod, annotations={ANNOTATION_SLURM_FEATURES: ",".join(mine) or None}
            )


# The same write is not sent again this soon: an accepted one until the Slurm view shows it
# (a reconcile in between would send it twice), a refused one (a topology topology.yaml
# lacks) until someone may have fixed the cause, not at every reconcile.
ACCEPTED_GRACE_S = 30.0
REFUSED_RETRY_S = 300.0


def _written_lately(ctx: Context, node: str, body: Mapping[str, object]) -> bool:
    last = ctx.placement_writes.get(node)
    if last is None or last[0] != json.dumps(body, sort_keys=True):
        return False
    return time.monotonic() - last[1] < (ACCEPTED_GRACE_S if last[2] else REFUSED_RETRY_S)


def _remember(ctx: Context, node: str, body: Mapping[str, object], *, accepted: bool) -> None:
    now = time.monotonic()
    writes = ctx.placement_writes
    if len(writes) > 4096:  # nodes gone since: forget what is past every grace
        for name in [n for n, w in writes.items() if now - w[1] > REFUSED_RETRY_S]:
            del writes[name]
    writes[node] = (json.dumps(body, sort_keys=True), now, accepted)
