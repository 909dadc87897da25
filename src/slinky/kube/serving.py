"""HTTP endpoints for operations: /metrics (Prometheus), /healthz and /readyz."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

Check = Callable[[], bool]


class ProbeServer:
    """Serves metrics and probes on one or two addresses (like controller-runtime's
    `--metrics-bind-address` and `--health-probe-bind-address`)."""

    def __init__(self) -> None:
        self.health_checks: dict[str, Check] = {}
        self.ready_checks: dict[str, Check] = {}
        self._runners: list[web.AppRunner] = []
        self.ports: dict[str, int] = {}

    def add_health_check(self, name: str, check: Check) -> None:
        self.health_checks[name] = check

    def add_ready_check(self, name: str, check: Check) -> None:
        self.ready_checks[name] = check

    async def _metrics(self, _req: web.Request) -> web.Response:
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
            site = web.TCPSite(runner, host or "0.0.0.0", int(port))
            await site.start()
            bound = runner.addresses[0][1] if runner.addresses else int(port)
            for path, _ in handlers:
                self.ports[path] = int(bound)
            self._runners.append(runner)

    async def stop(self) -> None:
        for r in self._runners:
            await r.cleanup()
        self._runners = []
