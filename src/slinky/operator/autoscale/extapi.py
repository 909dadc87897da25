"""`external.metrics.k8s.io/v1beta1`, served by the operator as an aggregated API.

The kube-apiserver proxies `GET /apis/external.metrics.k8s.io/v1beta1/namespaces/<ns>/<metric>
?labelSelector=...` here after it authenticated and authorized the caller (the HPA controller
needs RBAC on `external.metrics.k8s.io`). This server accepts only the apiserver: TLS with a
client certificate signed by the request-header CA (`--requestheader-client-ca-file` of the
apiserver, published in `kube-system/extension-apiserver-authentication`) whose common name is
an allowed name. It does no TokenReview/SubjectAccessReview of its own (no auth-delegator
binding): the metrics are read-only and the caller was already authorized by the apiserver.

Metrics (see `metrics.py`): `slurm_partition_*` with `labelSelector=partition=<name>` (one item
per Slurm cluster of the namespace that has the partition; the HPA sums them), optionally
narrowed with `cluster=<Cluster name>`; `slurm_nodeset_*` with `labelSelector=nodeset=<name>`.
An unknown metric, a missing or unknown selector, or an unknown partition/NodeSet is a 404
with a Status that says which; no empty success.

Serving certificate and CA files are re-read when they change (cert-manager rotation).
A request is answered from a poll of the jobs of each Cluster it asks about at most
ANSWER_AGE_S old, made for it (jobs alone, one request) when the last one is older: an HPA
asking every 15 s (Kubernetes' default) costs 4 requests a minute and sees a job submitted
just before it asked; nothing polls jobs between questions. DEMAND_WINDOW_S after the last
request the job cache is let go (the job gauges are then left out of `/metrics`).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import Histogram

from slinky.background import BackgroundLoop
from slinky.kube import events, rest
from slinky.operator.autoscale.metrics import (
    NODESET_METRICS,
    PARTITION_METRICS,
    SlurmMetrics,
    is_job_metric,
    nodeset_value,
)
from slinky.operator.clients import ClusterClients
from slinky.types import JSON

log = logging.getLogger(__name__)

GROUP = "external.metrics.k8s.io"
VERSION = "v1beta1"
GROUP_VERSION = f"{GROUP}/{VERSION}"
DEMAND_KEY = "external-metrics-api"
DEMAND_WINDOW_S = 60.0
# Several HPAs asking at once share one poll; an HPA asking every few seconds (a test bed's
# sync period) costs at most 60/ANSWER_AGE_S requests a minute.
ANSWER_AGE_S = 10.0
REFRESH_TIMEOUT_S = 5.0  # then: answer 503, the HPA keeps the current scale
NEVER_FITS_REASON = "JobNeverFits"
AUTH_CONFIGMAP = ("kube-system", "extension-apiserver-authentication")
SERVED = Histogram(
    "slinky_external_metrics_request_duration_seconds",
    "external.metrics.k8s.io metric requests answered, by HTTP code",
    ["code"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25),
)


def status(code: int, reason: str, message: str) -> web.Response:
    return web.json_response(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        },
        status=code,
    )


class SelectorError(ValueError):
    pass


def parse_selector(text: str) -> dict[str, str]:
    """`a=b,c==d` → {a: b, c: d}. Only equality: the metrics are keyed by exact names."""
    out: dict[str, str] = {}
    for term in filter(None, (t.strip() for t in text.split(","))):
        key, sep, value = term.partition("==") if "==" in term else term.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value or "!" in key:
            raise SelectorError(f"label selector term {term!r}: only key=value is supported")
        out[key] = value
    return out


@dataclass
class TLSFiles:
    cert: Path
    key: Path
    client_ca: Path | None  # None: read from the extension-apiserver-authentication ConfigMap


class MetricsAPI(BackgroundLoop):
    """The HTTPS server and its file/ConfigMap reloader."""

    def __init__(
        self,
        *,
        kube: rest.Kube,
        clients: ClusterClients,
        metrics: SlurmMetrics,
        nodeset_get: Callable[[str], JSON | None],
        leading: Callable[[], bool],
        tls: TLSFiles,
        allowed_names: list[str],
        reload_interval: float = 10.0,
        recorder: events.EventRecorder | None = None,
    ) -> None:
        self.kube = kube
        self.clients = clients
        self.metrics = metrics
        self.nodeset_get = nodeset_get
        self.leading = leading
        self.tls = tls
        self.allowed_names = list(allowed_names)
        self.reload_interval = reload_interval
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._ssl.minimum_version = ssl.TLSVersion.TLSv1_2
        self._ssl.verify_mode = ssl.CERT_REQUIRED
        self._stamps: tuple[Any, ...] = ()
        self._ca_pem = ""
        self._last_request = 0.0
        self.recorder = recorder
        # NodeSet uid -> the jobs an event said it can never run.
        self._told: dict[str, set[int]] = {}

    def task_name(self) -> str:
        return "external metrics API reloader"

    # ------------------------------------------------------------ TLS material

    @staticmethod
    def _stamp(path: Path | None) -> tuple[int, int] | None:
        if path is None:
            return None
        st = path.stat()
        return (st.st_mtime_ns, st.st_size)

    async def _client_ca(self) -> tuple[str, list[str]]:
        """The request-header CA (PEM) and allowed names."""
        if self.tls.client_ca is not None:
            return self.tls.client_ca.read_text(), self.allowed_names
        ns, name = AUTH_CONFIGMAP
        cm = await self.kube.get(rest.CONFIGMAPS, name, ns)
        data = cm.get("data") or {}
        pem = str(data.get("requestheader-client-ca-file") or "")
        if not pem:
            raise ValueError(f"ConfigMap {ns}/{name} has no requestheader-client-ca-file")
        names = self.allowed_names
        if not names and data.get("requestheader-allowed-names"):
            names = [str(n) for n in json.loads(data["requestheader-allowed-names"])]
        return pem, names

    async def load(self) -> bool:
        """(Re)load the serving certificate and the client CA; True when something changed.
        A failed reload keeps serving with what was loaded before."""
        stamps = (self._stamp(self.tls.cert), self._stamp(self.tls.key))
        pem, names = await self._client_ca()
        if stamps == self._stamps and pem == self._ca_pem and names == self.allowed_names:
            return False
        self._ssl.load_cert_chain(self.tls.cert, self.tls.key)
        if pem != self._ca_pem:
            self._ssl.load_verify_locations(cadata=pem)
        self._stamps, self._ca_pem, self.allowed_names = stamps, pem, names
        log.info("external metrics API: TLS material loaded (allowed names: %s)", names or "any")
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.reload_interval)
            try:
                await self.load()
            except (OSError, ValueError, ssl.SSLError, rest.ApiError) as e:
                log.warning("external metrics API: reload failed, keeping the old: %s", e)
            if self._last_request and time.monotonic() - self._last_request > DEMAND_WINDOW_S:
                for informer in self.clients.informers():
                    informer.release_jobs(DEMAND_KEY)
                    informer.want_partitions(DEMAND_KEY, False)

    # ------------------------------------------------------------ serving

    async def start_serving(self, addr: str) -> None:
        await self.load()
        app = web.Application(middlewares=[self._authenticate])
        app.router.add_get("/apis", self._groups)
        app.router.add_get(f"/apis/{GROUP}", self._group)
        app.router.add_get(f"/apis/{GROUP_VERSION}", self._resources)
        app.router.add_get(f"/apis/{GROUP_VERSION}/namespaces/{{namespace}}/{{metric}}", self._get)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        host, _, port = addr.rpartition(":")
        site = web.TCPSite(self._runner, host or "0.0.0.0", int(port), ssl_context=self._ssl)
        await site.start()
        self.port = int(self._runner.addresses[0][1]) if self._runner.addresses else int(port)
        self.start()
        log.info("external metrics API serving on %s:%d", host or "0.0.0.0", self.port)

    async def stop_serving(self) -> None:
        await self.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Any]
    ) -> web.StreamResponse:
        cert = request.transport.get_extra_info("peercert") if request.transport else None
        cn = ""
        for rdn in (cert or {}).get("subject", ()):
            for k, v in rdn:
                if k == "commonName":
                    cn = v
        if not cert or (self.allowed_names and cn not in self.allowed_names):
            return status(403, "Forbidden", f"client certificate {cn!r} is not an allowed name")
        response: web.StreamResponse = await handler(request)
        return response

    async def _groups(self, _req: web.Request) -> web.Response:
        gv = {"groupVersion": GROUP_VERSION, "version": VERSION}
        group = {"name": GROUP, "versions": [gv], "preferredVersion": gv}
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group]})

    async def _group(self, _req: web.Request) -> web.Response:
        gv = {"groupVersion": GROUP_VERSION, "version": VERSION}
        return web.json_response(
            {
                "kind": "APIGroup",
                "apiVersion": "v1",
                "name": GROUP,
                "versions": [gv],
                "preferredVersion": gv,
            }
        )

    async def _resources(self, _req: web.Request) -> web.Response:
        resources = [
            {
                "name": m,
                "singularName": "",
                "namespaced": True,
                "kind": "ExternalMetricValueList",
                "verbs": ["get"],
            }
            for m in (*PARTITION_METRICS, *NODESET_METRICS)
        ]
        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": GROUP_VERSION,
                "resources": resources,
            }
        )

    async def _fresh(self, cluster_keys: list[str]) -> set[str]:
        """A view of these Clusters' jobs at most ANSWER_AGE_S old; the Clusters whose jobs
        could not be polled within REFRESH_TIMEOUT_S (their job metrics answer 503: an HPA
        keeps the current scale rather than act on an old queue)."""
        self._last_request = time.monotonic()
        conns = [(k, c) for k in cluster_keys if (c := self.clients.get(k)) is not None]
        for _, conn in conns:  # names the partitions that have nothing pending
            conn.informer.want_partitions(DEMAND_KEY, True)
        fresh = await asyncio.gather(
            *(
                c.informer.refresh_jobs(DEMAND_KEY, max_age=ANSWER_AGE_S, timeout=REFRESH_TIMEOUT_S)
                for _, c in conns
            )
        )
        return {key for (key, _), ok in zip(conns, fresh, strict=True) if not ok}

    async def _get(self, request: web.Request) -> web.Response:
        start = time.perf_counter()
        response = await self._answer(request)
        SERVED.labels(str(response.status)).observe(time.perf_counter() - start)
        return response

    async def _answer(self, request: web.Request) -> web.Response:
        ns = request.match_info["namespace"]
        metric = request.match_info["metric"]
        if metric not in PARTITION_METRICS and metric not in NODESET_METRICS:
            return status(
                404,
                "NotFound",
                f"unknown metric {metric!r}; served: "
                f"{', '.join((*PARTITION_METRICS, *NODESET_METRICS))}",
            )
        if not self.leading():
            return status(503, "ServiceUnavailable", "this operator replica is not the leader")
        try:
            selector = parse_selector(request.query.get("labelSelector", ""))
        except SelectorError as e:
            return status(404, "NotFound", f"{metric}: {e}")
        if metric in PARTITION_METRICS:
            return await self._partition(ns, metric, selector)
        return await self._nodeset(ns, metric, selector)

    async def _partition(self, ns: str, metric: str, selector: dict[str, str]) -> web.Response:
        extra = set(selector) - {"partition", "cluster"}
        name = selector.get("partition")
        if name is None or extra:
            return status(
                404,
                "NotFound",
                f"{metric} needs labelSelector partition=<name> (and optionally "
                f"cluster=<Cluster>); got {sorted(selector) or 'none'}",
            )
        keys = [k for k in self.clients.keys() if k.partition("/")[0] == ns]
        if "cluster" in selector:
            keys = [k for k in keys if k == f"{ns}/{selector['cluster']}"]
        stale = await self._fresh(keys)
        items = []
        for key in keys:
            stats = self.metrics.cluster(key)
            if stats is not None and (
                not stats.jobs_known or (key in stale and name in stats.partitions)
            ):
                return status(
                    503,
                    "ServiceUnavailable",
                    f"{metric}: cannot read the jobs and partitions of Cluster {key} now",
                )
            if stats is None or name not in stats.partitions:
                continue
            labels = {"partition": name, "cluster": key.partition("/")[2]}
            items.append(item(metric, labels, stats.partitions[name].value(metric)))
        if not items:
            where = (
                f"Cluster {selector['cluster']}"
                if "cluster" in selector
                else (f"any connected Slurm cluster of namespace {ns} ({len(keys)} connected)")
            )
            return status(404, "NotFound", f"{metric}: partition {name!r} not found in {where}")
        return value_list(items)

    async def _nodeset(self, ns: str, metric: str, selector: dict[str, str]) -> web.Response:
        name = selector.get("nodeset")
        if name is None or set(selector) != {"nodeset"}:
            return status(
                404,
                "NotFound",
                f"{metric} needs labelSelector nodeset=<name>; got {sorted(selector) or 'none'}",
            )
        obj = self.nodeset_get(f"{ns}/{name}")
        if obj is None:
            return status(404, "NotFound", f"{metric}: NodeSet {ns}/{name} not found")
        cluster = (obj.get("spec") or {}).get("clusterName")
        stale = await self._fresh([f"{ns}/{cluster}"])
        stats = self.metrics.cluster(f"{ns}/{cluster}")
        if stats is None or (is_job_metric(metric) and (not stats.jobs_known or stale)):
            return status(
                503,
                "ServiceUnavailable",
                f"{metric}: Cluster {ns}/{cluster} of NodeSet {name} has no synced Slurm view",
            )
        if is_job_metric(metric):
            self.tell_never_fits(obj, self.metrics.nodeset_demand(stats, obj).never)
        value = nodeset_value(self.metrics, stats, obj, metric)
        return value_list([item(metric, {"nodeset": name}, value)])

    def tell_never_fits(self, obj: JSON, never: list[tuple[int, str]]) -> None:
        """A Warning event on the NodeSet for each job newly left out of its demand because
        it can never run there (once per job while it stays so)."""
        uid = str(obj["metadata"].get("uid") or obj["metadata"]["name"])
        told = self._told.setdefault(uid, set())
        for job_id, why in never:
            if job_id not in told and self.recorder is not None:
                self.recorder.event(
                    obj,
                    events.WARNING,
                    NEVER_FITS_REASON,
                    f"job {job_id} {why}: it can never run here, so it is not counted as "
                    "demand (slurm_nodeset_jobs_pending*); it pends until changed or cancelled",
                    action="Autoscale",
                )
        self._told[uid] = {job_id for job_id, _ in never}


def item(metric: str, labels: dict[str, str], value: int) -> JSON:
    return {
        "metricName": metric,
        "metricLabels": labels,
        "timestamp": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "value": str(value),
    }


def value_list(items: list[JSON]) -> web.Response:
    return web.json_response(
        {
            "kind": "ExternalMetricValueList",
            "apiVersion": GROUP_VERSION,
            "metadata": {},
            "items": items,
        }
    )
