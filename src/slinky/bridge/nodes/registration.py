"""Pure rules of the node controller: which Slurm node a Kubernetes node is, whether it should
be registered in Slurm as an EXTERNAL node, and with what.

A Kubernetes node labelled `scheduler.slinky.slurm.net/external-node` becomes a Slurm node
`NodeName=<slurm name> NodeAddr=<InternalIP> CPUs=<allocatable cpu> RealMemory=<allocatable
MiB> Features=<partitions> State=EXTERNAL`. Its partitions are the comma-separated annotation
`scheduler.slinky.slurm.net/external-node-partitions` (default: the bridge's partition); they
become the node's features, and the partition picks the node up through a `NodeSet=<p>
Feature=<p>` line in slurm.conf (REST cannot create Slurm NodeSets, and rewriting a
partition's node list would fight with slurm.conf and other tools).

The bridge marks the Slurm nodes it registered with a JSON comment naming the Kubernetes
node, so a Node deleted while the bridge was down is still recognised (from the Slurm side)
and its Slurm node drained and removed; no finalizer on Nodes is needed.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import dataclass

from slinky.bridge.labels import EXTERNAL_NODE, EXTERNAL_NODE_PARTITIONS, SLURM_NODENAME
from slinky.kube.quantity import parse_quantity
from slinky.slurm.models import Node
from slinky.types import JSON

REGISTERED_BY = "slurm-bridge"
_FEATURE = re.compile(r"^[A-Za-z0-9_.+-]+$")
MIB = 1024 * 1024


class RegistrationProblem(Exception):
    """The node cannot be registered as it is; `reason` is the Event reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def slurm_name(node: JSON) -> str:
    """The Slurm node name of a Kubernetes node: its slurm-nodename label, else its name."""
    labels = node["metadata"].get("labels") or {}
    return str(labels.get(SLURM_NODENAME) or node["metadata"]["name"])


def wants_external(node: JSON) -> bool:
    """Labelled for registration (any value but "false", as `kubectl label x key=` allows)."""
    labels = node["metadata"].get("labels") or {}
    return EXTERNAL_NODE in labels and str(labels[EXTERNAL_NODE]).lower() != "false"


def partitions(node: JSON, default: str) -> tuple[str, ...]:
    """The partitions named by the annotation (order kept, duplicates dropped)."""
    annotations = node["metadata"].get("annotations") or {}
    raw = annotations.get(EXTERNAL_NODE_PARTITIONS)
    if raw is None:
        return (default,)
    names = tuple(dict.fromkeys(p.strip() for p in str(raw).split(",") if p.strip()))
    for name in names:
        if not _FEATURE.match(name):
            raise RegistrationProblem(
                "InvalidPartitions",
                f"annotation {EXTERNAL_NODE_PARTITIONS}: {name!r} is not a valid partition name",
            )
    return names


def internal_ip(node: JSON) -> str:
    """The node's InternalIP (Slurm's NodeAddr); RegistrationProblem when it has none."""
    for addr in (node.get("status") or {}).get("addresses") or []:
        if addr.get("type") == "InternalIP" and addr.get("address"):
            return str(addr["address"])
    raise RegistrationProblem(
        "NoInternalIP",
        "node has no InternalIP address; Slurm needs NodeAddr (an unresolvable name stalls "
        "slurmctld), so it is not registered",
    )


def capacity(node: JSON) -> tuple[int, int]:
    """(CPUs, RealMemory MiB) from the node's allocatable resources, rounded down."""
    alloc = (node.get("status") or {}).get("allocatable") or {}
    try:
        cpus = math.floor(parse_quantity(alloc["cpu"]))
        memory = math.floor(parse_quantity(alloc["memory"]) / MIB)
    except (KeyError, ValueError) as e:
        raise RegistrationProblem(
            "NoAllocatable", f"node status.allocatable has no usable cpu and memory ({e})"
        ) from None
    if cpus < 1 or memory < 1:
        raise RegistrationProblem(
            "NoAllocatable",
            f"allocatable cpu {alloc['cpu']} and memory {alloc['memory']} are too small for a "
            "Slurm node (at least 1 CPU and 1 MiB)",
        )
    return int(cpus), int(memory)


@dataclass(frozen=True)
class Registration:
    """What Slurm should know about an external node."""

    name: str
    kube_node: str
    address: str
    cpus: int
    real_memory: int
    features: tuple[str, ...]
    cluster: str = ""  # the bridge's cluster id, written into the mark

    def node_conf(self) -> str:
        """The slurm.conf NodeName line for `POST /new/node/`."""
        parts = [
            f"NodeName={self.name}",
            f"NodeAddr={self.address}",
            f"CPUs={self.cpus}",
            f"RealMemory={self.real_memory}",
        ]
        if self.features:
            parts.append(f"Features={','.join(self.features)}")
        parts.append("State=EXTERNAL")
        return " ".join(parts)

    def comment(self) -> str:
        return owner_comment(self.kube_node, self.cluster)

    def needs_new_node(self, current: Node) -> bool:
        """CPUs, memory and address are fixed when a Slurm node is created, and slurmctld
        places a node in NodeSet partitions only then (a later feature change does not move
        it): any difference means removing the node and creating it again."""
        return (
            current.cpus != self.cpus
            or current.real_memory != self.real_memory
            or (bool(current.address) and current.address != self.address)
            or sorted(current.features) != sorted(self.features)
        )

    def adoptable(self, current: Node) -> bool:
        """An unmarked EXTERNAL node that is exactly what the bridge would register: a
        registration interrupted between creating the node and marking it (slurmctld takes
        no comment in `POST /new/node/`), finished by marking it now."""
        return (
            not current.comment
            and current.state.has("EXTERNAL")
            and not self.needs_new_node(current)
        )


def desired(node: JSON, default_partition: str, cluster: str = "") -> Registration:
    """The registration of a labelled node; RegistrationProblem when it cannot have one."""
    cpus, memory = capacity(node)
    return Registration(
        name=slurm_name(node),
        kube_node=str(node["metadata"]["name"]),
        address=internal_ip(node),
        cpus=cpus,
        real_memory=memory,
        features=partitions(node, default_partition),
        cluster=cluster,
    )


def owner_comment(kube_node: str, cluster: str = "") -> str:
    """The Slurm node comment that marks a node as registered by the bridge of `cluster` for
    `kube_node`."""
    mark = {"registeredBy": REGISTERED_BY, "node": kube_node, "cluster": cluster}
    return json.dumps(mark, separators=(",", ":"))


def registered_for(node: Node | None, cluster: str | None = None) -> str | None:
    """The Kubernetes node a Slurm node was registered for by the bridge (by the bridge of
    `cluster`, when given: another bridge's node is not ours to drain or delete), else None."""
    if node is None or not node.comment.startswith("{"):
        return None
    with contextlib.suppress(ValueError):
        data = json.loads(node.comment)
        if isinstance(data, dict) and data.get("registeredBy") == REGISTERED_BY:
            if cluster is not None and str(data.get("cluster") or "") not in ("", cluster):
                return None
            name = data.get("node")
            return str(name) if name else None
    return None
