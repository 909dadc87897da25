"""`slurm-operator`: run the Cluster (and NodeSet) controllers.

Flags use kubebuilder's names where they exist. The operator installs nothing itself: CRDs
come from `kubectl apply -f config/crd/`, RBAC from `config/rbac/`. SIGTERM stops the work
queues, lets in-flight reconciles finish, releases the leader Lease and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from pathlib import Path

from prometheus_client import REGISTRY

from slinky import __version__, process
from slinky.kube import events, flags, rest
from slinky.kube.controller import Controller, run_all
from slinky.kube.informer import InformerFactory, InformerObjects
from slinky.kube.nodehealth import NodeHealth
from slinky.kube.store import BY_OWNER_UID
from slinky.operator.autoscale import extapi
from slinky.operator.autoscale.metrics import Gauges, ObjectGauges, SlurmMetrics
from slinky.operator.clients import ClusterClients
from slinky.operator.cluster import controller as cluster_controller
from slinky.operator.cluster.sync import Options
from slinky.operator.nodeset import controller as nodeset_controller
from slinky.operator.nodeset import pods as pod_fields
from slinky.operator.nodeset.sync import BY_HPA_TARGET
from slinky.operator.nodeset.view import Placement
from slinky.operator.resources import CLUSTERS, NODESETS

log = logging.getLogger("slurm-operator")


def build_parser() -> argparse.ArgumentParser:
    """Every flag (docs/operator.md lists them all; a unit test checks)."""
    p = process.parser("slurm-operator", "Slurm on Kubernetes: operator")
    process.add_common_flags(
        p,
        leader_elect_help="elect a leader on a Lease so only one replica acts",
        lease_id="slurm-operator.slinky.slurm.net",
        lease_id_help="name of the Lease",
    )
    p.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="namespace to watch (repeatable; default all)",
    )
    p.add_argument(
        "--leader-election-namespace",
        default=None,
        help="namespace of the Lease (default: the pod's namespace, else default)",
    )
    p.add_argument("--cluster-workers", type=int, default=1)
    p.add_argument("--nodeset-workers", type=int, default=4)
    flags.add_duration(
        p,
        "--slurm-token-lifetime",
        default="15m",
        help="lifetime of tokens minted from spec.jwtKeyRef (renewed at 2/3)",
    )
    flags.add_duration(
        p,
        "--cluster-ping-interval",
        default="60s",
        help="how often each Cluster's slurmctld is checked (status lastPingTime): a node poll "
        "answered within the interval counts, else slurmctld is pinged",
    )
    flags.add_duration(
        p,
        "--slurm-idle-poll-interval",
        default="60s",
        help="how often Slurm nodes are polled while nothing waits on them (a Cluster's "
        "spec.pollInterval applies while a pod is drained or an update runs); an unchanged "
        "poll costs one small request",
    )
    flags.add_bool(
        p,
        "--slurm-watch-jobs",
        default=False,
        help="poll Slurm jobs with every node poll, so the slurm_*_jobs_* gauges on /metrics "
        "are always exported (for Prometheus-based autoscalers); otherwise jobs are polled "
        "only when the external metrics API is asked",
    )
    flags.add_bool(
        p,
        "--drain-not-ready-nodes",
        default=True,
        help="drain the Slurm nodes of the pods on a Kubernetes node whose Ready condition is "
        "False or Unknown (reason: the node and its condition's reason); undrained when it is "
        "Ready again",
    )
    p.add_argument(
        "--drain-node-conditions",
        default="",
        help="comma-separated Node condition types (e.g. Node Problem Detector's "
        "KernelDeadlock,ReadonlyFilesystem) that drain the Slurm nodes of the pods on the "
        "node while True; undrained when False again",
    )
    p.add_argument(
        "--gres-resources",
        default="nvidia.com/gpu=gpu,amd.com/gpu=gpu",
        help="comma-separated <extended resource>=<GRES name>: a slurmd container's limit of "
        "such a resource registers its Slurm node with Gres=<name>:<count> (the GRES must be "
        "in slurm.conf's GresTypes)",
    )
    p.add_argument(
        "--node-feature-labels",
        default="",
        help="comma-separated Kubernetes node label keys, or prefixes ending in / (e.g. "
        "feature.node.kubernetes.io/), whose labels become features of the Slurm nodes of the "
        "pods on the node: the value, or for a value of true the key's last part",
    )
    p.add_argument(
        "--topology-labels",
        default="",
        help="comma-separated Kubernetes node label keys, outermost first (e.g. "
        "topology.kubernetes.io/zone,example.com/rack): the Slurm nodes of the pods on a node "
        "are placed under --topology-root in switches named by the values (the last is the "
        "leaf); a node annotated topology.slinky.slurm.net/spec gets that value instead",
    )
    p.add_argument(
        "--topology-root",
        default="default:root",
        help="<topology>:<switch>: the Slurm tree topology and the switch in it (declared in "
        "topology.yaml, with a child) under which --topology-labels make their switches",
    )
    p.add_argument(
        "--metrics-api-bind-address",
        default="0",
        help="host:port of the external.metrics.k8s.io aggregated API over HTTPS "
        '(issue 13; "0" disables)',
    )
    p.add_argument("--metrics-api-cert-file", default="", help="serving certificate (PEM)")
    p.add_argument("--metrics-api-key-file", default="", help="serving key (PEM)")
    p.add_argument(
        "--metrics-api-client-ca-file",
        default="",
        help="CA of the apiserver's front-proxy client certificate (default: read from "
        "ConfigMap kube-system/extension-apiserver-authentication)",
    )
    p.add_argument(
        "--metrics-api-allowed-names",
        default="",
        help="comma-separated client certificate names accepted (default: the ConfigMap's "
        "requestheader-allowed-names; empty there means any name signed by the CA)",
    )
    return p


def parse_gres_resources(text: str) -> dict[str, str]:
    """`nvidia.com/gpu=gpu,example.com/widget=widget` -> {resource: GRES name}."""
    out: dict[str, str] = {}
    for item in filter(None, (i.strip() for i in text.split(","))):
        resource, sep, name = item.partition("=")
        if not sep or not resource.strip() or not name.strip() or "/" not in resource:
            raise ValueError(f"{item!r} is not <extended resource>=<GRES name>")
        out[resource.strip()] = name.strip()
    return out


def parse_placement(features: str, topology: str, root: str) -> Placement:
    """The placement flags, checked (a label key has at most one `/`)."""

    def keys(flag: str, text: str, *, prefixes: bool) -> tuple[str, ...]:
        out = tuple(k.strip() for k in text.split(",") if k.strip())
        for k in out:
            if k.count("/") > 1 or k.startswith("/") or (not prefixes and k.endswith("/")):
                kind = "label key or prefix ending in /" if prefixes else "label key"
                raise ValueError(f"argument {flag}: {k!r} is not a {kind}")
        return out

    name, _, switch = root.partition(":")
    if not all(part and all(c.isalnum() or c in "._-" for c in part) for part in (name, switch)):
        raise ValueError(f"argument --topology-root: {root!r} is not <topology>:<switch>")
    return Placement(
        feature_labels=keys("--node-feature-labels", features, prefixes=True),
        topology_labels=keys("--topology-labels", topology, prefixes=False),
        topology_root=root,
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    try:
        args.gres_resources = parse_gres_resources(args.gres_resources)
    except ValueError as e:
        p.error(f"argument --gres-resources: {e}")
    args.drain_node_conditions = frozenset(
        c.strip() for c in args.drain_node_conditions.split(",") if c.strip()
    )
    try:
        args.placement = parse_placement(
            args.node_feature_labels, args.topology_labels, args.topology_root
        )
    except ValueError as e:
        p.error(str(e))
    process.check_common_flags(p, args)
    return args


class Operator:
    """The process: shared informers, controllers, probes, leader election."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.kube = rest.Kube.from_kubeconfig(args.kubeconfig)
        self.identity = process.identity()
        self.factory = InformerFactory(self.kube, namespaces=args.namespace or None)
        self.clients = ClusterClients(watch_jobs=self.args.slurm_watch_jobs)
        self.recorder = events.EventRecorder(
            self.kube, controller="slinky.slurm.net/slurm-operator", instance=self.identity
        )
        self.server = process.probe_server(args, self.kube)
        self.controllers: list[Controller] = []
        self.leading = False
        self.metrics = SlurmMetrics(self.clients)
        self.metrics_api: extapi.MetricsAPI | None = None

    def build(self) -> None:
        opts = Options(
            token_lifetime=float(self.args.slurm_token_lifetime),
            ping_interval=float(self.args.cluster_ping_interval),
            idle_poll_interval=float(self.args.slurm_idle_poll_interval),
        )
        self.controllers.append(
            cluster_controller.build(
                self.kube,
                self.factory,
                self.clients,
                self.recorder,
                workers=self.args.cluster_workers,
                opts=opts,
            )
        )
        self.controllers.append(
            nodeset_controller.build(
                self.kube,
                self.factory,
                self.clients,
                self.recorder,
                workers=self.args.nodeset_workers,
                node_health=NodeHealth(
                    conditions=self.args.drain_node_conditions,
                    not_ready=self.args.drain_not_ready_nodes,
                ),
                gres_resources=self.args.gres_resources,
                placement=self.args.placement,
            )
        )
        nodesets = self.factory.shared(NODESETS)
        # The nodeset controller's HPA informer (same key: the same cache): a NodeSet's
        # maxReplicas bounds the demand its gauges count.
        hpas = self.factory.shared(rest.HPAS, transform=nodeset_controller.slim_hpa)
        self.metrics.hpas_of = lambda key: hpas.by_index(BY_HPA_TARGET, key)
        self.gauges = Gauges(self.metrics, nodesets.objects)
        REGISTRY.register(self.gauges)
        self.cached = InformerObjects(self.factory)
        REGISTRY.register(self.cached)
        pods = self.factory.shared(
            rest.PODS, label_selector=nodeset_controller.MANAGED, transform=pod_fields.slim
        )
        self.objects = ObjectGauges(
            nodesets.objects,
            self.factory.shared(CLUSTERS).objects,
            lambda uid: pods.by_index(BY_OWNER_UID, uid),
        )
        REGISTRY.register(self.objects)
        if self.args.metrics_api_bind_address not in ("", "0"):
            ca = self.args.metrics_api_client_ca_file
            self.metrics_api = extapi.MetricsAPI(
                kube=self.kube,
                clients=self.clients,
                metrics=self.metrics,
                nodeset_get=nodesets.get,
                leading=lambda: self.leading,
                tls=extapi.TLSFiles(
                    Path(self.args.metrics_api_cert_file),
                    Path(self.args.metrics_api_key_file),
                    Path(ca) if ca else None,
                ),
                allowed_names=[n for n in self.args.metrics_api_allowed_names.split(",") if n],
                recorder=self.recorder,
            )
        self.server.add_health_check("loops", self.loops_healthy)
        # Not the Lease: every replica syncs its caches and is ready, so a rolling update of
        # a two-replica Deployment proceeds while only one of them leads.
        self.server.add_ready_check("informers", lambda: self.factory.has_synced)

    def loops_healthy(self) -> bool:
        """Every informer loop runs (one that died is being restarted meanwhile)."""
        loops = [*self.factory.informers, *self.clients.informers()]
        down = [repr(loop) for loop in loops if not loop.healthy]
        if down:
            log.warning("background loops down: %s", "; ".join(down))
        return not down

    async def lead(self, stop: asyncio.Event) -> None:
        """Everything that only the leader does. Cancelled when leadership is lost: then
        it stops at once, without waiting for in-flight work."""
        self.leading = True
        try:
            await run_all(self.controllers, stop)
        finally:
            self.leading = False
            await self.clients.close_all()
            if stop.is_set():
                await self.recorder.flush()

    async def run(self, stop: asyncio.Event) -> int:
        self.build()
        await self.server.start(
            metrics_addr=self.args.metrics_bind_address,
            probe_addr=self.args.health_probe_bind_address,
        )
        log.info(
            "slurm-operator %s starting as %s (namespaces: %s)",
            __version__,
            self.identity,
            ", ".join(self.args.namespace) or "all",
        )
        if self.metrics_api is not None:
            await self.metrics_api.start_serving(self.args.metrics_api_bind_address)
        self.factory.start()  # caches run on every replica, leader or not
        work = asyncio.create_task(
            process.lead(
                self.kube,
                self.args,
                name=self.args.leader_election_id,
                namespace=process.pod_namespace(self.args.leader_election_namespace),
                identity=self.identity,
                work=self.lead,
                stop=stop,
            ),
            name="operator",
        )
        try:
            code = await process.until_stopped(
                work, stop, float(self.args.graceful_shutdown_timeout)
            )
        finally:
            await self.factory.stop()
            if self.metrics_api is not None:
                await self.metrics_api.stop_serving()
            REGISTRY.unregister(self.gauges)
            REGISTRY.unregister(self.cached)
            REGISTRY.unregister(self.objects)
            await self.server.stop()
            await self.kube.close()
        log.info("slurm-operator stopped")
        return code


async def start(args: argparse.Namespace, stop: asyncio.Event) -> int:
    try:
        op = Operator(args)
    except (OSError, ValueError) as e:
        log.error("cannot start: %s", e)
        return process.CANNOT_START
    return await op.run(stop)


def main() -> None:
    process.main(parse_args, start)


if __name__ == "__main__":
    main()
