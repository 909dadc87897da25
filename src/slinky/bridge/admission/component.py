"""The admission webhook as a bridge component (runs on every replica: the apiserver may call
any of them)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from slinky.bridge.admission.server import AdmissionHandlers, AdmissionServer, ServingCertificate
from slinky.bridge.config import NEVER_MANAGED
from slinky.bridge.runtime import Context
from slinky.kube import rest
from slinky.kube.informer import Informer, InformerFactory
from slinky.kube.serving import ProbeServer

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
        # Namespace labels are needed only to evaluate managedNamespaceSelector.
        self.namespaces: Informer | None = None
        if ctx.config.managed_namespace_selector is not None:
            self.namespaces = self.factory.informer(rest.NAMESPACES)
        self.server = AdmissionServer(
            AdmissionHandlers(ctx.config, self.is_managed), self.certificate
        )

    async def is_managed(self, namespace: str) -> bool:
        """Whether pods of `namespace` are the bridge's (never kube-system or its own)."""
        if not namespace or namespace in NEVER_MANAGED or namespace == self.ctx.namespace:
            return False
        if self.namespaces is None:
            return self.ctx.config.is_managed_namespace(namespace, None)
        obj = self.namespaces.store.get(namespace)
        if obj is None:  # created a moment ago and not yet in the cache
            try:
                obj = await self.ctx.kube.get(rest.NAMESPACES, namespace)
            except rest.ApiError as e:
                if e.not_found:
                    return False
                raise
        return self.ctx.config.is_managed_namespace(namespace, obj["metadata"].get("labels"))

    def add_checks(self, probes: ProbeServer) -> None:
        probes.add_ready_check(
            "admission",
            lambda: self.server.serving and (self.namespaces is None or self.namespaces.has_synced),
        )

    async def run(self, stop: asyncio.Event) -> None:
        self.factory.start()
        try:
            await self.server.start(self.ctx.args.webhook_bind_address)
            await stop.wait()
        finally:
            await self.server.stop()
            await self.factory.stop()
