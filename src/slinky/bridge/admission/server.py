"""The webhook's HTTPS server: AdmissionReview v1 in, allow/deny (+ JSON Patch) out.

The serving certificate and key are read from files and followed on change (see
`slinky.kube.tls.ServingCertificate`).
"""

from __future__ import annotations

import base64
import json
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import Counter, Histogram

from slinky import jsonio
from slinky.bridge.admission import mutate, validate
from slinky.bridge.config import BridgeConfig
from slinky.kube.tls import ServingCertificate
from slinky.types import JSON

log = logging.getLogger(__name__)

MUTATE_PATH = "/mutate-v1-pod"
VALIDATE_PATH = "/validate-v1-pod"

REQUESTS = Counter(
    "controller_runtime_webhook_requests_total",
    "Total number of admission requests by HTTP status code.",
    ["code", "webhook"],
)
LATENCY = Histogram(
    "controller_runtime_webhook_latency_seconds",
    "Histogram of the latency of processing admission requests",
    ["webhook"],
)
DECISIONS = Counter(
    "slurm_bridge_admission_decisions_total",
    "Admission decisions of the bridge's webhook",
    ["webhook", "decision"],
)

IsManaged = Callable[[str], Awaitable[bool]]


def review_response(
    uid: str, *, allowed: bool, message: str = "", patch: list[JSON] | None = None
) -> JSON:
    """An AdmissionReview response for request `uid`: allowed or denied, and a JSON Patch."""
    response: JSON = {"uid": uid, "allowed": allowed}
    if not allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": message}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


class AdmissionHandlers:
    """The two webhooks. `is_managed(namespace)` says whether a namespace is the bridge's."""

    def __init__(self, config: BridgeConfig, is_managed: IsManaged) -> None:
        self.config = config
        self.is_managed = is_managed

    async def _review(self, request: web.Request) -> JSON | None:
        """The review's `request`, or None when the body is not one the rules can read (the
        apiserver never sends such a body; anyone else gets a 400, not a 500)."""
        try:
            body = jsonio.loads(await request.read())
        except ValueError:
            return None
        req = body.get("request") if isinstance(body, dict) else None
        if not isinstance(req, dict) or not isinstance(req.get("uid"), str):
            return None
        for part in ("kind", "object", "oldObject"):
            if not isinstance(req.get(part, {}), dict | None):
                return None
        return req

    @staticmethod
    def _is_pod(req: JSON) -> bool:
        kind = req.get("kind") or {}
        return bool(kind.get("kind") == "Pod" and not kind.get("group"))

    async def mutate(self, request: web.Request) -> web.Response:
        return await self._serve("mutate", request, self._mutate)

    async def validate(self, request: web.Request) -> web.Response:
        return await self._serve("validate", request, self._validate)

    async def _serve(
        self, webhook: str, request: web.Request, decide: Callable[[JSON], Awaitable[JSON]]
    ) -> web.Response:
        t0 = time.perf_counter()
        req = await self._review(request)
        if req is None:
            REQUESTS.labels("400", webhook).inc()
            return web.Response(
                status=400, text="expected an admission.k8s.io/v1 AdmissionReview\n"
            )
        try:
            out = await decide(req)
        except Exception:
            REQUESTS.labels("500", webhook).inc()
            raise  # aiohttp logs it and answers 500; failurePolicy decides for the apiserver
        finally:
            LATENCY.labels(webhook).observe(time.perf_counter() - t0)
        REQUESTS.labels("200", webhook).inc()
        return web.json_response(out)

    async def _mutate(self, req: JSON) -> JSON:
        uid = str(req["uid"])
        pod = req.get("object") or {}
        namespace = str(req.get("namespace") or "")
        if req.get("operation") != "CREATE" or not self._is_pod(req) or req.get("subResource"):
            return review_response(uid, allowed=True)
        if not await self.is_managed(namespace):
            DECISIONS.labels("mutate", "unmanaged").inc()
            return review_response(uid, allowed=True)
        patch = mutate.pod_patch(pod, self.config)
        DECISIONS.labels("mutate", "patched" if patch else "unchanged").inc()
        if patch:
            log.debug("pod %s/%s: %s", namespace, _pod_name(req), patch)
        return review_response(uid, allowed=True, patch=patch)

    async def _validate(self, req: JSON) -> JSON:
        uid = str(req["uid"])
        if not self._is_pod(req):
            return review_response(uid, allowed=True)
        pod = req.get("object") or {}
        old = req.get("oldObject")
        namespace = str(req.get("namespace") or "")
        ours = self.config.scheduler_name in {
            (o.get("spec") or {}).get("schedulerName") for o in (pod, old or {})
        }
        if not ours and not await self.is_managed(namespace):
            DECISIONS.labels("validate", "unmanaged").inc()
            return review_response(uid, allowed=True)
        problems = validate.violations(
            validate.Request(
                operation=str(req.get("operation") or ""),
                pod=pod,
                old=old,
                sub_resource=str(req.get("subResource") or ""),
                rule=self.config.policy.rule_for(namespace),
                partition=self.config.partition,
                who=f"pods of namespace {namespace}",
            )
        )
        if problems:
            DECISIONS.labels("validate", "denied").inc()
            log.info("pod %s/%s denied: %s", namespace, _pod_name(req), "; ".join(problems))
            return review_response(uid, allowed=False, message="; ".join(problems))
        DECISIONS.labels("validate", "allowed").inc()
        return review_response(uid, allowed=True)


def _pod_name(req: JSON) -> str:
    pod = req.get("object") or {}
    meta = pod.get("metadata") or {}
    return str(req.get("name") or meta.get("name") or meta.get("generateName") or "?")


class AdmissionServer:
    """aiohttp over TLS on one address."""

    def __init__(self, handlers: AdmissionHandlers, certificate: ServingCertificate) -> None:
        self.handlers = handlers
        self.certificate = certificate
        self._runner: web.AppRunner | None = None
        self.port = 0
        self.draining = False

    def drain(self) -> None:
        """Answer from now on with `Connection: close`: a client (the apiserver) that kept a
        connection here opens its next one to the Service again, which no longer leads to this
        terminating replica. Without it the kept connection is reused until the server stops
        and closes it, and a review sent at that moment gets EOF (a pod creation refused)."""
        self.draining = True

    @web.middleware
    async def _close_when_draining(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        resp = await handler(request)
        if self.draining:
            resp.force_close()
        return resp

    async def start(self, address: str) -> None:
        app = web.Application(
            client_max_size=8 * 1024 * 1024, middlewares=[self._close_when_draining]
        )
        app.router.add_post(MUTATE_PATH, self.handlers.mutate)
        app.router.add_post(VALIDATE_PATH, self.handlers.validate)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        host, _, port = address.rpartition(":")
        site = web.TCPSite(
            self._runner, host or "0.0.0.0", int(port), ssl_context=self.certificate.context
        )
        await site.start()
        self.port = int(self._runner.addresses[0][1]) if self._runner.addresses else int(port)
        self.certificate.start()
        log.info("admission webhook serving HTTPS on %s:%d", host or "0.0.0.0", self.port)

    @property
    def serving(self) -> bool:
        return self._runner is not None

    async def stop(self) -> None:
        await self.certificate.stop()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
