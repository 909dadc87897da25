"""The admission webhook as a bridge component (runs on every replica: the apiserver may call
any of them)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from slinky.bridge.admission.server import AdmissionHandlers, AdmissionServer
from slinky.bridge.namespaces import ManagedNamespaces
from slinky.bridge.runtime import Context
from slinky.kube.informer import InformerFactory
from slinky.kube.serving import ProbeServer
from slinky.kube.tls import ServingCertificate

log = logging.getLogger(__name__)


class AdmissionComponent:
    """The admission webhook as a bridge component (every replica serves)."""

    name = "admission"
    leader_elected = False

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        args = ctx.args
        cert_dir = Path(args.webhook_cert_path)
        self.certificate = ServingCertificate(
            cert_dir / args.webhook_cert_name,
            cert_dir / args.webhook_cert_key,
            interval=float(args.webhook_cert_reload_interval),
        )
        self.factory = InformerFactory(ctx.kube)
        self.namespaces = ManagedNamespaces(ctx.kube, self.factory, ctx.config, ctx.namespace)
        self.server = AdmissionServer(
            AdmissionHandlers(ctx.config, self.namespaces.managed), self.certificate
        )

    def add_checks(self, probes: ProbeServer) -> None:
        probes.add_ready_check(
            "admission",
            lambda: self.server.serving and self.namespaces.has_synced,
        )

    async def run(self, stop: asyncio.Event) -> None:
        self.factory.start()
        try:
            await self.server.start(self.ctx.args.webhook_bind_address)
            await stop.wait()
            self.server.drain()
            delay = float(self.ctx.args.webhook_shutdown_delay)
            if delay > 0:
                # The apiserver may still send reviews here until the endpoint of this pod,
                # now terminating, is gone from the webhook Service: an answer refused then
                # (failurePolicy Fail) is a pod creation refused.
                log.info("admission webhook: serving %.0fs more before it stops", delay)
                await asyncio.sleep(delay)
        finally:
            await self.server.stop()
            await self.factory.stop()
