"""`slurm-bridge`: run some or all of the bridge's components in one process.

    slurm-bridge --config /etc/slurm-bridge/config.yaml                    # everything
    slurm-bridge --config ... --components=admission                       # the webhook only
    slurm-bridge --config ... --components=nodes --leader-elect=false

Flags follow the operator (and kubebuilder where a name exists). A bad config file stops
start-up with exit code 2 and a message naming the key. SIGTERM stops every component: work
queues drain, in-flight reconciles finish, Leases are released, the webhook stops serving.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import os
import signal
import socket
import sys
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx2

from slinky import __version__
from slinky.background import Backoff
from slinky.bridge.admission.component import AdmissionComponent
from slinky.bridge.config import BridgeConfig, ConfigError, load_config
from slinky.bridge.connection import SlurmConnection
from slinky.bridge.nodes.component import NodeComponent
from slinky.bridge.runtime import Component, Context
from slinky.bridge.scheduler.component import SchedulerComponent
from slinky.bridge.workload.component import WorkloadComponent
from slinky.kube import flags, logs, rest, serving
from slinky.kube.leader import LeaderElector, LeadershipLost
from slinky.kube.serving import ProbeServer

log = logging.getLogger("slurm-bridge")
CLUSTER_ID_WAIT_S = 60.0

SA_NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

# The components this process can run, by name, in start-up order.
COMPONENTS: dict[str, Callable[[Context], Component]] = {
    "admission": AdmissionComponent,
    "nodes": NodeComponent,
    "scheduler": SchedulerComponent,
    "workload": WorkloadComponent,
}


def _components(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names or "all" in names:
        return list(COMPONENTS)
    unknown = [n for n in names if n not in COMPONENTS]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown component {unknown[0]!r} (available: all, {', '.join(COMPONENTS)})"
        )
    return list(dict.fromkeys(names))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="slurm-bridge", description="Slurm on Kubernetes: bridge")
    p.add_argument("--config", default=None, help="the bridge's YAML config file")
    p.add_argument(
        "--components",
        type=_components,
        default=list(COMPONENTS),
        help=f"comma-separated components to run: all (default), {', '.join(COMPONENTS)}",
    )
    p.add_argument(
        "--kubeconfig",
        default=os.environ.get("KUBECONFIG"),
        help="kubeconfig file (default $KUBECONFIG, else in-cluster)",
    )
    p.add_argument(
        "--namespace",
        default=None,
        help="the bridge's own namespace: never managed, holds the Leases "
        "(default: the pod's namespace, else default)",
    )
    flags.add_bool(
        p,
        "--leader-elect",
        default=True,
        help="elect a leader per component on a Lease so one replica of each acts",
    )
    p.add_argument(
        "--leader-election-id",
        default="slurm-bridge",
        help="prefix of the Lease names (<id>-<component>)",
    )
    flags.add_duration(p, "--leader-election-lease-duration", default="15s")
    flags.add_duration(p, "--leader-election-renew-deadline", default="10s")
    flags.add_duration(p, "--leader-election-retry-period", default="2s")
    p.add_argument("--metrics-bind-address", default=":8080", help='"0" disables')
    serving.add_metrics_flags(p)
    p.add_argument("--health-probe-bind-address", default=":8081", help='"0" disables')
    p.add_argument("--webhook-bind-address", default=":9443", help="the webhook's HTTPS address")
    p.add_argument(
        "--webhook-cert-path",
        default="/tmp/k8s-webhook-server/serving-certs",
        help="directory of the webhook's serving certificate and key",
    )
    p.add_argument("--webhook-cert-name", default="tls.crt")
    p.add_argument("--webhook-cert-key", default="tls.key")
    flags.add_duration(
        p,
        "--webhook-shutdown-delay",
        default="0s",
        help="how long the webhook keeps serving after SIGTERM, while its terminating pod "
        "leaves the webhook Service (the chart sets 5s)",
    )
    flags.add_duration(
        p,
        "--webhook-cert-reload-interval",
        default="2s",
        help="how often the certificate files are checked for changes",
    )
    p.add_argument("--node-workers", type=int, default=2)
    p.add_argument("--scheduler-workers", type=int, default=4)
    p.add_argument("--workload-workers", type=int, default=4)
    flags.add_duration(
        p,
        "--job-recheck-interval",
        default="10s",
        help="how often a pending placeholder job is looked at, at most, when nothing "
        "suggests it changed",
    )
    flags.add_duration(
        p,
        "--running-job-recheck-interval",
        default="60s",
        help="how often placeholder jobs that hold their nodes (and cancelled ones, until "
        "Slurm purges them) are looked at when nothing suggests they changed: all in one "
        "request",
    )
    flags.add_duration(
        p,
        "--graceful-shutdown-timeout",
        default="25s",
        help="how long SIGTERM waits for running work before giving up",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="text", choices=["text", "json"])
    p.add_argument("--version", action="version", version=f"slurm-bridge {__version__}")
    args = p.parse_args(argv)
    serving.check_metrics_flags(p, args)
    return args


def own_namespace(args: argparse.Namespace) -> str:
    """The bridge's own namespace: the flag, else the pod's service-account namespace."""
    if args.namespace:
        return str(args.namespace)
    if SA_NAMESPACE_FILE.exists():
        return SA_NAMESPACE_FILE.read_text().strip()
    return "default"


async def cluster_id(kube: rest.Kube, config: BridgeConfig) -> str:
    """The config's clusterId, else the UID of this Kubernetes cluster's kube-system
    namespace (stable for the cluster's life, different in every cluster), asked with
    backoff for up to a minute while the apiserver does not answer."""
    if config.cluster_id:
        return config.cluster_id
    backoff = Backoff(1.0, 10.0)
    deadline = asyncio.get_running_loop().time() + CLUSTER_ID_WAIT_S
    while True:
        try:
            ns = await kube.get(rest.NAMESPACES, "kube-system")
            return str(ns["metadata"]["uid"])
        except (rest.ApiError, OSError, httpx2.HTTPError) as e:
            if asyncio.get_running_loop().time() > deadline:
                raise ValueError(
                    f"cannot read namespace kube-system for the cluster id ({e}); set "
                    "clusterId in the config, or grant get on namespaces"
                ) from None
            delay = backoff.next()
            log.warning(
                "cluster id: cannot read namespace kube-system (%s); retry in %.0fs", e, delay
            )
            await asyncio.sleep(delay)


class Bridge:
    """The process: the chosen components, probes and metrics, one Lease per component."""

    def __init__(self, args: argparse.Namespace, kube: rest.Kube, config: BridgeConfig) -> None:
        self.args = args
        self.kube = kube
        self.ctx = Context(
            kube=self.kube,
            config=config,
            args=args,
            identity=f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}",
            namespace=own_namespace(args),
        )
        self.components = [COMPONENTS[name](self.ctx) for name in args.components]
        tls, access = serving.metrics_protection(args, kube)
        self.server = ProbeServer(metrics_tls=tls, metrics_access=access)
        self.server.add_health_check("ping", lambda: True)
        for component in self.components:
            component.add_checks(self.server)

    @classmethod
    async def create(cls, args: argparse.Namespace) -> Bridge:
        """The process, with its config and its cluster id known (see `cluster_id`)."""
        config = load_config(args.config)
        # A missing Slurm setting is refused before anything waits on the apiserver.
        for name in args.components:
            if needed_by := getattr(COMPONENTS[name], "needs_slurm", ""):
                SlurmConnection.check(config, needed_by=needed_by)
        kube = rest.Kube.from_kubeconfig(args.kubeconfig)
        try:
            config = dataclasses.replace(config, cluster_id=await cluster_id(kube, config))
            return cls(args, kube, config)
        except BaseException:
            await kube.close()
            raise

    async def _run_component(self, component: Component, stop: asyncio.Event) -> None:
        if not (component.leader_elected and self.args.leader_elect):
            await component.run(stop)
            return
        elector = LeaderElector(
            self.kube,
            name=f"{self.args.leader_election_id}-{component.name}",
            namespace=self.ctx.namespace,
            identity=self.ctx.identity,
            lease_duration=float(self.args.leader_election_lease_duration),
            renew_deadline=float(self.args.leader_election_renew_deadline),
            retry_period=float(self.args.leader_election_retry_period),
        )
        await elector.run(component.run, stop)

    async def _run_all(self, stop: asyncio.Event) -> None:
        """Every component; if one fails, the others are stopped too."""
        tasks = [
            asyncio.create_task(self._run_component(c, stop), name=f"component {c.name}")
            for c in self.components
        ]
        try:
            done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in done:
                task.result()
        finally:
            stop.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _report_stuck(self, grace: float) -> None:
        log.error("shutdown did not finish within %.0fs; pending tasks:", grace)
        for task in asyncio.all_tasks():
            if task is asyncio.current_task():
                continue
            frames = task.get_stack(limit=3)
            where = " <- ".join(f"{f.f_code.co_filename}:{f.f_lineno}" for f in frames)
            log.error("  %s: %s", task.get_name(), where or "(no frame)")

    async def run(self, stop: asyncio.Event) -> int:
        await self.server.start(
            metrics_addr=self.args.metrics_bind_address,
            probe_addr=self.args.health_probe_bind_address,
        )
        log.info(
            "slurm-bridge %s starting as %s: components %s, scheduler name %s, cluster id %s",
            __version__,
            self.ctx.identity,
            ", ".join(self.args.components),
            self.ctx.config.scheduler_name,
            self.ctx.config.cluster_id,
        )
        code = 0
        work = asyncio.create_task(self._run_all(stop), name="bridge")
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
                work.result()
        except LeadershipLost:
            log.error("lost leadership; exiting so a restart starts clean")
            code = 1
        finally:
            await self.server.stop()
            await self.kube.close()
        log.info("slurm-bridge stopped")
        return code


async def amain(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logs.setup(args.log_level, args.log_format)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        bridge = await Bridge.create(args)
    except ConfigError as e:
        log.error("invalid config %s: %s", args.config, e)
        return 2
    except (OSError, ValueError) as e:
        log.error("cannot start: %s", e)
        return 2
    return await bridge.run(stop)


def main() -> None:
    sys.exit(asyncio.run(amain()))


if __name__ == "__main__":
    main()
