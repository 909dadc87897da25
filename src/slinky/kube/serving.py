"""HTTP endpoints for operations: /metrics (Prometheus), /healthz and /readyz.

`/metrics` may be served securely (`--metrics-secure`, as controller-runtime's
`--metrics-secure`): over HTTPS with the certificate in `--metrics-cert-path`, to bearer
tokens allowed to `get /metrics` (see `metricsauth`). The probes stay plain HTTP (the kubelet
calls them), so they need an address of their own then.
"""

from __future__ import annotations

import argparse
import errno
import os
import re
from collections.abc import Callable
from pathlib import Path

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from slinky.kube import flags, rest
from slinky.kube.metricsauth import MetricsAccess
from slinky.kube.tls import ServingCertificate

Check = Callable[[], bool]

# What a bind refused says (errno): in use, not an address of this host, a privileged port.
BIND_ERRNOS = {errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES}
# asyncio's "error while attempting to bind on address ('127.0.0.1', 8080): ..."
_BIND_AT = re.compile(r"bind on address \('[^']*', (\d+)")


def bind_failure(args: argparse.Namespace, error: BaseException) -> str | None:
    """One line for a listener that could not bind, naming the `--*-bind-address` flag of
    that port and its value ("--metrics-bind-address :8080: address already in use"); None
    when `error` is no such failure or names no port one of the flags gave."""
    if not isinstance(error, OSError) or error.errno not in BIND_ERRNOS:
        return None
    found = _BIND_AT.search(str(error))
    if found is None:
        return None
    named = [
        f"--{name.replace('_', '-')} {value}"
        for name, value in sorted(vars(args).items())
        if name.endswith("_bind_address")
        and isinstance(value, str)
        and value not in ("", "0")
        and value.rpartition(":")[2] == found.group(1)
    ]
    if not named:
        return None
    reason = os.strerror(error.errno or 0).lower()  # asyncio put its whole text in strerror
    return f"{' and '.join(named)}: {reason}"


def add_metrics_flags(p: argparse.ArgumentParser) -> None:
    """`--metrics-secure` and where its certificate is, as kubebuilder's scaffold names them."""
    flags.add_bool(
        p,
        "--metrics-secure",
        default=False,
        help="serve /metrics over HTTPS, only to bearer tokens allowed to get /metrics "
        "(TokenReview + SubjectAccessReview); needs --metrics-cert-path",
    )
    p.add_argument(
        "--metrics-cert-path",
        default="",
        help="directory of the /metrics serving certificate and key (read again on change)",
    )
    p.add_argument("--metrics-cert-name", default="tls.crt")
    p.add_argument("--metrics-cert-key", default="tls.key")


def check_metrics_flags(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit 2 naming the flag when secure metrics cannot be served as asked."""
    if not args.metrics_secure:
        return
    if not args.metrics_cert_path:
        p.error("--metrics-cert-path: required by --metrics-secure=true (tls.crt and tls.key)")
    for name in (args.metrics_cert_name, args.metrics_cert_key):
        if not (Path(args.metrics_cert_path) / name).is_file():
            p.error(f"--metrics-cert-path: {Path(args.metrics_cert_path) / name}: no such file")
    if args.metrics_bind_address not in ("", "0") and (
        args.metrics_bind_address == args.health_probe_bind_address
    ):
        p.error(
            "--metrics-bind-address: must differ from --health-probe-bind-address with "
            "--metrics-secure=true (the probes stay plain HTTP for the kubelet)"
        )


def metrics_protection(
    args: argparse.Namespace, kube: rest.Kube
) -> tuple[ServingCertificate | None, MetricsAccess | None]:
    """The certificate and the access check of secure metrics (None, None: plain HTTP)."""
    if not args.metrics_secure:
        return None, None
    directory = Path(args.metrics_cert_path)
    cert = ServingCertificate(directory / args.metrics_cert_name, directory / args.metrics_cert_key)
    return cert, MetricsAccess(kube)


class ProbeServer:
    """Serves metrics and probes on one or two addresses (like controller-runtime's
    `--metrics-bind-address` and `--health-probe-bind-address`)."""

    def __init__(
        self,
        *,
        metrics_tls: ServingCertificate | None = None,
        metrics_access: MetricsAccess | None = None,
    ) -> None:
        self.health_checks: dict[str, Check] = {}
        self.ready_checks: dict[str, Check] = {}
        self._runners: list[web.AppRunner] = []
        self.ports: dict[str, int] = {}
        self.metrics_tls = metrics_tls
        self.metrics_access = metrics_access

    def add_health_check(self, name: str, check: Check) -> None:
        self.health_checks[name] = check

    def add_ready_check(self, name: str, check: Check) -> None:
        self.ready_checks[name] = check

    async def _metrics(self, req: web.Request) -> web.Response:
        if self.metrics_access is not None:
            decision = await self.metrics_access.decide(req.headers.get("Authorization"))
            if decision.status != 200:
                return web.Response(status=decision.status, text=decision.reason + "\n")
        return web.Response(
            body=generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST}
        )

    def _probe(self, checks: dict[str, Check]) -> Callable[[web.Request], object]:
        async def handler(_req: web.Request) -> web.Response:
            failed = []
            for name, check in checks.items():
                try:
                    ok = check()
                except Exception:
                    ok = False
                if not ok:
                    failed.append(name)
            if failed:
                return web.Response(status=503, text="failed: " + ", ".join(failed) + "\n")
            return web.Response(text="ok\n")

        return handler

    async def start(self, *, metrics_addr: str | None, probe_addr: str | None) -> None:
        """Bind `host:port` addresses ("0" or empty disables one); both may be the same."""
        routes: dict[str, list[tuple[str, object]]] = {}
        if metrics_addr and metrics_addr != "0":
            routes.setdefault(metrics_addr, []).append(("/metrics", self._metrics))
        if probe_addr and probe_addr != "0":
            routes.setdefault(probe_addr, []).extend(
                [
                    ("/healthz", self._probe(self.health_checks)),
                    ("/readyz", self._probe(self.ready_checks)),
                ]
            )
        for addr, handlers in routes.items():
            app = web.Application()
            for path, handler in handlers:
                app.router.add_get(path, handler)  # type: ignore[arg-type]
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            host, _, port = addr.rpartition(":")
            secure = self.metrics_tls is not None and addr == metrics_addr
            site = web.TCPSite(
                runner,
                host or "0.0.0.0",
                int(port),
                ssl_context=self.metrics_tls.context if secure and self.metrics_tls else None,
            )
            await site.start()
            bound = runner.addresses[0][1] if runner.addresses else int(port)
            for path, _ in handlers:
                self.ports[path] = int(bound)
            self._runners.append(runner)

        if self.metrics_tls is not None and metrics_addr and metrics_addr != "0":
            self.metrics_tls.start()

    async def stop(self) -> None:
        if self.metrics_tls is not None:
            await self.metrics_tls.stop()
        for r in self._runners:
            await r.cleanup()
        self._runners = []
