"""`slurm-operator`: run the Cluster (and NodeSet) controllers.

Flags use kubebuilder's names where they exist. The operator installs nothing itself: CRDs
come from `kubectl apply -f config/crd/`, RBAC from `config/rbac/`. SIGTERM stops the work
queues, lets in-flight reconciles finish, releases the leader Lease and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
import uuid
from pathlib import Path

from prometheus_client import REGISTRY

from slinky import __version__
from slinky.kube import events, flags, logs, rest, serving
from slinky.kube.controller import Controller, run_all
from slinky.kube.informer import InformerFactory, InformerObjects
from slinky.kube.leader import LeaderElector, LeadershipLost
from slinky.kube.serving import ProbeServer
from slinky.operator.autoscale import extapi
from slinky.operator.autoscale.metrics import Gauges, SlurmMetrics
from slinky.operator.clients import ClusterClients
from slinky.operator.cluster import controller as cluster_controller
from slinky.operator.cluster.sync import Options
from slinky.operator.nodeset import controller as nodeset_controller
from slinky.operator.resources import NODESETS

log = logging.getLogger("slurm-operator")

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slurm-operator", description="Slurm on Kubernetes: operator")
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default $KUBECONFIG, else in-cluster)",
    )
    p.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="namespace to watch (repeatable; default all)",
    )
    flags.add_bool(
        p,
        "--leader-elect",
        default=True,
        help="elect a leader on a Lease so only one replica acts",
    )
    p.add_argument(
        "--leader-election-namespace",
        default=None,
        help="namespace of the Lease (default: the pod's namespace, else default)",
    )
    p.add_argument("--leader-election-id", default="slurm-operator.slinky.slurm.net")
    flags.add_duration(p, "--leader-election-lease-duration", default="15s")
    flags.add_duration(p, "--leader-election-renew-deadline", default="10s")
    flags.add_duration(p, "--leader-election-retry-period", default="2s")
    p.add_argument("--metrics-bind-address", default=":8080", help='"0" disables')
    serving.add_metrics_flags(p)
    p.add_argument("--health-probe-bind-address", default=":8081", help='"0" disables')
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
    flags.add_duration(
        p,
        "--graceful-shutdown-timeout",
        default="25s",
        help="how long SIGTERM waits for running reconciles before giving up",
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
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="text", choices=["text", "json"])
    p.add_argument("--version", action="version", version=f"slurm-operator {__version__}")
    args = p.parse_args(argv)
    serving.check_metrics_flags(p, args)
    return args


def lease_namespace(args: argparse.Namespace) -> str:
    if args.leader_election_namespace:
        return str(args.leader_election_namespace)
    if SA_NAMESPACE_FILE.exists():
        return SA_NAMESPACE_FILE.read_text().strip()
    return "default"


class Operator:
    """The process: shared informers, controllers, probes, leader election."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.kube = rest.Kube.from_kubeconfig(args.kubeconfig)
        self.identity = f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        self.factory = InformerFactory(self.kube, namespaces=args.namespace or None)
        self.clients = ClusterClients(watch_jobs=self.args.slurm_watch_jobs)
        self.recorder = events.EventRecorder(
            self.kube, controller="slinky.slurm.net/slurm-operator", instance=self.identity
        )
        tls, access = serving.metrics_protection(args, self.kube)
        self.server = ProbeServer(metrics_tls=tls, metrics_access=access)
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
            )
        )
        nodesets = self.factory.shared(NODESETS)
        self.gauges = Gauges(self.metrics, nodesets.objects)
        REGISTRY.register(self.gauges)
        self.cached = InformerObjects(self.factory)
        REGISTRY.register(self.cached)
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
            )
        self.server.add_health_check("ping", lambda: True)
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

    async def _elect_and_lead(self, stop: asyncio.Event) -> None:
        if not self.args.leader_elect:
            await self.lead(stop)
            return
        elector = LeaderElector(
            self.kube,
            name=self.args.leader_election_id,
            namespace=lease_namespace(self.args),
            identity=self.identity,
            lease_duration=float(self.args.leader_election_lease_duration),
            renew_deadline=float(self.args.leader_election_renew_deadline),
            retry_period=float(self.args.leader_election_retry_period),
        )
        await elector.run(self.lead, stop)

    def _report_stuck(self, grace: float) -> None:
        """Shutdown overran its grace period: say what is still running, then give up."""
        log.error("shutdown did not finish within %.0fs; pending tasks:", grace)
        for task in asyncio.all_tasks():
            if task is asyncio.current_task():
                continue
            frames = task.get_stack(limit=3)
            where = " <- ".join(f"{f.f_code.co_filename}:{f.f_lineno}" for f in frames)
            log.error("  %s: %s", task.get_name(), where or "(no frame)")

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
        code = 0
        self.factory.start()  # caches run on every replica, leader or not
        work = asyncio.create_task(self._elect_and_lead(stop), name="operator")
        try:
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait([work, stopping], return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            grace = float(self.args.graceful_shutdown_timeout)
            done, _ = await asyncio.wait([work], timeout=grace)
            if not done:
                self._report_stuck(grace)
                work.cancel()
                code = 3
            else:
                work.result()  # re-raises what the operator died of
        except LeadershipLost:
            log.error("lost leadership; exiting so a restart starts clean")
            code = 1
        finally:
            await self.factory.stop()
            if self.metrics_api is not None:
                await self.metrics_api.stop_serving()
            REGISTRY.unregister(self.gauges)
            REGISTRY.unregister(self.cached)
            await self.server.stop()
            await self.kube.close()
        log.info("slurm-operator stopped")
        return code


async def amain(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logs.setup(args.log_level, args.log_format)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        op = Operator(args)
    except (OSError, ValueError) as e:
        log.error("cannot start: %s", e)
        return 2
    return await op.run(stop)


def main() -> None:
    sys.exit(asyncio.run(amain()))


if __name__ == "__main__":
    main()
