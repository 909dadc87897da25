"""The chaos soak's own test bed: `make dev`'s setup on three real nodes (two for slurmd
pods, the last set aside for slurm-bridge) and two kwok nodes (the bridge's too), with a
second NodeSet beside dev's HPA-driven `compute`: `batch`, its own partition, no HPA, scaled
by the soak; jobs are accounted (MariaDB and slurmdbd in the Slurm root,
`Testbed.up(accounting=True)`). The operator and the bridge run as processes started exactly
as `make dev` starts them (`slinky_testbed.dev`, `slinky_testbed.dev_bridge`), so a restart
is the same call again: new ports, the webhook and the metrics APIService re-registered."""

from __future__ import annotations

import contextlib
import copy
import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from slinky_testbed import dev, dev_bridge, paths
from slinky_testbed.bed import Testbed

DEFAULT_DIR = paths.cache_dir() / "testbeds" / "soak"
NAMESPACE = dev.NAMESPACE
BRIDGE_NAMESPACE = dev_bridge.MANAGED_NAMESPACE
HPA_NODESET = "compute"
SCALED_NODESET = "batch"
NODESETS = (HPA_NODESET, SCALED_NODESET)
REAL_NODES = 3
KWOK_NODES = 2


@dataclass
class Ports:
    """Where the operator and the bridge serve /metrics and /readyz (new at every start)."""

    operator_metrics: int = 0
    operator_health: int = 0
    bridge_metrics: int = 0
    bridge_health: int = 0


def up(bed: Testbed, *, log: Callable[[str], None]) -> None:
    """A fresh test bed (whatever ran in this directory before is stopped first)."""
    if bed.status_lines(only_running=True):
        bed.down(log=log)
    bed.up(real_nodes=REAL_NODES, kwok_nodes=KWOK_NODES, accounting=True, log=log)


def scaled_nodeset(bed: Testbed) -> dict[str, Any]:
    """dev's `compute` NodeSet under another name, with a partition of its own."""
    compute = next(o for o in dev.sample_objects(bed) if o["kind"] == "NodeSet")
    out: dict[str, Any] = copy.deepcopy(compute)
    labels = {"app.kubernetes.io/instance": SCALED_NODESET}
    out["metadata"] = {"name": SCALED_NODESET, "namespace": NAMESPACE}
    spec: dict[str, Any] = out["spec"]
    spec["replicas"] = 1
    spec["selector"] = {"matchLabels": labels}
    spec["template"]["metadata"] = {"labels": labels}
    return out


def install(bed: Testbed, ports: Ports) -> None:
    """What `make dev` installs (CRDs, the bridge's node set aside, the operator, Cluster,
    NodeSet `compute` with its HPA, the bridge), plus NodeSet `batch`. dev's own help text
    is swallowed: the soak prints its report instead."""
    with contextlib.redirect_stdout(io.StringIO()):
        dev.install_crds(bed)
        dev_bridge.reserve_node(bed)
        start_operator(bed, ports)
        objects = dev.sample_objects(bed)
        rest = [o for o in objects if o["kind"] != "NodeSet"]
        nodesets = [o for o in objects if o["kind"] == "NodeSet"] + [scaled_nodeset(bed)]
        apply(bed, rest)
        dev.kubectl(
            bed,
            "wait",
            "--for=condition=Ready",
            "-n",
            NAMESPACE,
            "slurmcluster/slurm",
            "--timeout=60s",
        )
        apply(bed, nodesets)
        start_bridge(bed, ports)


def apply(bed: Testbed, objects: list[dict[str, Any]]) -> None:
    dev.kubectl(
        bed,
        "apply",
        "--server-side",
        "--field-manager=slinky-soak",
        "-f",
        "-",
        stdin=yaml.safe_dump_all(objects),
    )


def start_operator(bed: Testbed, ports: Ports) -> None:
    """Start slurm-operator as `make dev` does (blocking until /readyz answers)."""
    ports.operator_metrics, ports.operator_health = dev.start_operator(bed)


def start_bridge(bed: Testbed, ports: Ports) -> None:
    """Start slurm-bridge as `make dev` does and register its webhook at the new port
    (blocking until /readyz answers)."""
    with contextlib.redirect_stdout(io.StringIO()):
        dev_bridge.setup(bed)
    metrics, health, _webhook = (int(p) for p in bridge_ports_file(bed).read_text().split())
    ports.bridge_metrics, ports.bridge_health = metrics, health


def bridge_ports_file(bed: Testbed) -> Path:
    return bed.dir / "bridge" / "ports"
