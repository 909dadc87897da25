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
from collections.abc import Callable

from slinky import __version__, process
from slinky.background import Backoff
from slinky.bridge.admission.component import AdmissionComponent
from slinky.bridge.config import BridgeConfig, ConfigError, load_config
from slinky.bridge.connection import SlurmConnection
from slinky.bridge.nodes.component import NodeComponent
from slinky.bridge.runtime import Component, Context
from slinky.bridge.scheduler.component import SchedulerComponent
from slinky.bridge.workload.component import WorkloadComponent
from slinky.kube import flags, rest

log = logging.getLogger("slurm-bridge")
CLUSTER_ID_WAIT_S = 60.0

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


def build_parser() -> argparse.ArgumentParser:
    """Every flag (docs/bridge.md lists them all; a unit test checks)."""
    p = process.parser("slurm-bridge", "Slurm on Kubernetes: bridge")
    process.add_common_flags(
        p,
        leader_elect_help="elect a leader per component on a Lease so one replica of each acts",
        lease_id="slurm-bridge",
        lease_id_help="prefix of the Lease names (<id>-<component>)",
    )
    p.add_argument("--config", default=None, help="the bridge's YAML config file")
    p.add_argument(
        "--components",
        type=_components,
        default=list(COMPONENTS),
        help=f"comma-separated components to run: all (default), {', '.join(COMPONENTS)}",
    )
    p.add_argument(
        "--namespace",
        default=None,
        help="the bridge's own namespace: never managed, holds the Leases "
        "(default: the pod's namespace, else default)",
    )
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
    p.add_argument("--scheduler-workers", type=int, default=16)
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
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    args = p.parse_args(argv)
    process.check_common_flags(p, args)
    return args


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
        except (rest.ApiError, OSError, rest.TransportError) as e:
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
            identity=process.identity(),
            namespace=process.pod_namespace(args.namespace),
        )
        self.components = [COMPONENTS[name](self.ctx) for name in args.components]
        self.server = process.probe_server(args, kube)
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
        if not component.leader_elected:
            await component.run(stop)
            return
        await process.lead(
            self.kube,
            self.args,
            name=f"{self.args.leader_election_id}-{component.name}",
            namespace=self.ctx.namespace,
            identity=self.ctx.identity,
            work=component.run,
            stop=stop,
        )

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
        work = asyncio.create_task(self._run_all(stop), name="bridge")
        try:
            code = await process.until_stopped(
                work, stop, float(self.args.graceful_shutdown_timeout)
            )
        finally:
            await self.server.stop()
            await self.kube.close()
        log.info("slurm-bridge stopped")
        return code


async def start(args: argparse.Namespace, stop: asyncio.Event) -> int:
    try:
        bridge = await Bridge.create(args)
    except ConfigError as e:
        log.error("invalid config %s: %s", args.config, e)
        return process.CANNOT_START
    except (OSError, ValueError) as e:
        log.error("cannot start: %s", e)
        return process.CANNOT_START
    return await bridge.run(stop)


def main() -> None:
    process.main(parse_args, start)


if __name__ == "__main__":
    main()
