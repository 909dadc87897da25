"""Raw JSON access to the Kubernetes API.

lightkube gives typed models and server-side apply; hot paths (informers, status patches,
pod binding) want plain dicts and full control of query parameters (`allowWatchBookmarks`,
`resourceVersionMatch`, preconditions). This module reuses lightkube's kubeconfig handling (TLS and
credentials) and sends its requests over pooled aiohttp connections (`slinky.transport`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.core import exceptions as lightkube_errors
from prometheus_client import Counter

from slinky import jsonio
from slinky.transport import Reply, Session, TransportError
from slinky.types import JSON

__all__ = ["ApiError", "Kube", "Resource", "TransportError"]

REQUESTS = Counter(
    "rest_client_requests_total",
    "Number of HTTP requests to the Kubernetes API, partitioned by status code and method",
    ["code", "method"],
)


@dataclass(frozen=True)
class Resource:
    """A Kubernetes REST resource: enough to build its URLs."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.plural}"
        if name:
            base += f"/{name}"
            if subresource:
                base += f"/{subresource}"
        return base


PODS = Resource("", "v1", "pods", "Pod")
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
SERVICES = Resource("", "v1", "services", "Service")
EVENTS = Resource("events.k8s.io", "v1", "events", "Event")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
REPLICASETS = Resource("apps", "v1", "replicasets", "ReplicaSet")
CONTROLLER_REVISIONS = Resource("apps", "v1", "controllerrevisions", "ControllerRevision")
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
PVCS = Resource("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim")
HPAS = Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")
CRDS = Resource(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    namespaced=False,
)


class ApiError(Exception):
    """A non-2xx answer from the apiserver, with its Status reason and message."""

    def __init__(self, code: int, reason: str, message: str, body: JSON | None = None) -> None:
        super().__init__(f"{code} {reason}: {message}")
        self.code = code
        self.reason = reason
        self.message = message
        self.body = body or {}

    @property
    def not_found(self) -> bool:
        return self.code == 404

    @property
    def conflict(self) -> bool:
        return self.code == 409

    @property
    def gone(self) -> bool:
        return self.code == 410


def _error(resp: Reply, text: str) -> ApiError:
    try:
        body = jsonio.loads(text)
    except ValueError:
        body = {}
    if isinstance(body, dict) and body.get("kind") == "Status":
        return ApiError(
            resp.status_code, str(body.get("reason", "")), str(body.get("message", "")), body
        )
    return ApiError(resp.status_code, resp.reason_phrase, text[:500])


class Credentials:
    """The `Authorization` header for the kubeconfig's user, from lightkube's auth for it
    (a token, a token file the kubelet rotates, an exec plugin, basic auth): asked once, kept,
    and asked again after the apiserver answers 401."""

    def __init__(self, auth: httpx2.Auth | None) -> None:
        self.auth = auth
        self.header: str | None = None
        self._lock = asyncio.Lock()

    async def headers(self) -> dict[str, str]:
        if self.auth is not None and self.header is None:
            await self.refresh(None)
        return {"Authorization": self.header} if self.header else {}

    async def refresh(self, refused: str | None) -> None:
        """Ask the auth flow again; `refused`: the header the apiserver just refused (the
        flow is told of the 401, so a token file is read again, an exec plugin run again)."""
        if self.auth is None:
            return
        async with self._lock:
            if self.header != refused:
                return  # another request refreshed it meanwhile
            req = httpx2.Request("GET", "https://kubernetes.invalid/")
            flow = self.auth.async_auth_flow(req)
            try:
                req = await flow.__anext__()
                if refused is not None and req.headers.get("Authorization") == refused:
                    with contextlib.suppress(StopAsyncIteration):
                        req = await flow.asend(httpx2.Response(401, request=req))
            finally:
                await flow.aclose()
            self.header = req.headers.get("Authorization")


class Kube:
    """A small async JSON client over pooled connections (requests and watches apart)."""

    def __init__(self, http: Session, config: SingleConfig, credentials: Credentials) -> None:
        self.http = http
        self.config = config
        self.credentials = credentials

    @classmethod
    def from_kubeconfig(cls, path: str | Path | None = None, *, timeout: float = 30.0) -> Kube:
        """From a kubeconfig file, else $KUBECONFIG / in-cluster service account."""
        try:
            config = (KubeConfig.from_file(path) if path else KubeConfig.from_env()).get()
            if config is None:
                raise ValueError(f"kubeconfig {path or '$KUBECONFIG'} has no current context")
            params = client_adapter.ConnectionParams(trust_env=False)
            kwargs = params.httpx_params(config)
        except (lightkube_errors.ConfigError, AssertionError) as e:
            raise ValueError(f"kubeconfig: {e or 'no user in the current context'}") from None
        # Every connection kept for reuse: with 20 kept, a scheduler with 16 workers beside
        # its watches closed connections after use and opened (TLS handshake) new ones at
        # every request in a burst (a fifth of its CPU time). Watches are not counted: they
        # have a pool of their own (`Session`).
        server = str(kwargs["base_url"])
        http = Session(
            server,
            ssl=kwargs["verify"] if server.startswith("https") else None,
            timeout=timeout,
            max_connections=100,
        )
        return cls(http, config, Credentials(kwargs["auth"]))

    def own_connections(self, max_connections: int) -> Kube:
        """The same server and credentials over connections of its own: what it sends never
        waits for a connection the rest of the process holds (the leader's Lease)."""
        return Kube(self.http.sibling(max_connections), self.config, self.credentials)

    async def close(self) -> None:
        await self.http.aclose()

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> JSON:
        """Send one request; return the decoded JSON body or raise ApiError (TransportError
        when no answer came)."""
        content = None if body is None else jsonio.dumps(body)
        resp = await self.send(
            method,
            path,
            params=params,
            content=content,
            content_type=content_type,
            timeout=timeout,
        )
        return jsonio.loads(resp.content) if resp.content else {}

    async def send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        content: bytes | None = None,
        content_type: str = "application/json",
        accept: str = "application/json",
        timeout: float | None = None,
    ) -> Reply:
        """One exchange, the answer's bytes as they came (the apiserver's /metrics; a body the
        caller decodes); once more with fresh credentials after a 401. ApiError when not 2xx."""
        for attempt in range(2):
            headers = {"Accept": accept, **await self.credentials.headers()}
            if content is not None:
                headers["Content-Type"] = content_type
            resp = await self.http.request(
                method,
                path,
                params=_params(params),
                content=content,
                headers=headers,
                timeout=timeout,
            )
            REQUESTS.labels(str(resp.status_code), method).inc()
            if resp.status_code == 401 and attempt == 0 and self.credentials.auth is not None:
                await self.credentials.refresh(headers.get("Authorization"))
                continue
            break
        if resp.status_code >= 300:
            raise _error(resp, resp.text)
        return resp

    async def get(self, res: Resource, name: str, namespace: str | None = None) -> JSON:
        return await self.request("GET", res.path(namespace, name))

    async def list(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        params: Mapping[str, Any] | None = None,
    ) -> JSON:
        """One list call (no pagination: use Informer for whole collections). An empty list
        comes back as `"items": null` from some apiservers; it is normalized to []."""
        out = await self.request("GET", res.path(namespace), params=params)
        out["items"] = out.get("items") or []
        return out

    async def create(self, res: Resource, obj: JSON, namespace: str | None = None) -> JSON:
        return await self.request("POST", res.path(namespace), body=obj)

    async def patch(
        self,
        res: Resource,
        name: str,
        patch: Any,
        namespace: str | None = None,
        *,
        subresource: str | None = None,
        kind: str = "merge",
        params: Mapping[str, Any] | None = None,
    ) -> JSON:
        """Patch with `kind` = merge | strategic | json | apply (server-side apply)."""
        ctype = {
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
            "json": "application/json-patch+json",
            "apply": "application/apply-patch+yaml",
        }[kind]
        return await self.request(
            "PATCH",
            res.path(namespace, name, subresource),
            body=patch,
            content_type=ctype,
            params=params,
        )

    async def apply(
        self,
        res: Resource,
        obj: JSON,
        *,
        field_manager: str,
        force: bool = True,
        subresource: str | None = None,
    ) -> JSON:
        """Server-side apply of `obj` (which carries its own name/namespace)."""
        meta = obj["metadata"]
        return await self.patch(
            res,
            meta["name"],
            obj,
            meta.get("namespace"),
            subresource=subresource,
            kind="apply",
            params={"fieldManager": field_manager, "force": "true" if force else "false"},
        )

    async def delete(
        self,
        res: Resource,
        name: str,
        namespace: str | None = None,
        *,
        uid: str | None = None,
        grace_period: int | None = None,
        propagation: str | None = None,
    ) -> JSON:
        """Delete; `uid` adds a precondition so a recreated object of the same name is safe."""
        body: JSON = {"kind": "DeleteOptions", "apiVersion": "v1"}
        if uid:
            body["preconditions"] = {"uid": uid}
        if grace_period is not None:
            body["gracePeriodSeconds"] = grace_period
        if propagation:
            body["propagationPolicy"] = propagation
        return await self.request("DELETE", res.path(namespace, name), body=body)

    async def watch(
        self,
        res: Resource,
        namespace: str | None = None,
        *,
        params: Mapping[str, Any] | None = None,
    ) -> AsyncIterator[JSON]:
        """One watch stream: yields raw watch events until the server closes it.
        An ERROR event is raised as ApiError (410 Gone among them). It holds a connection of
        the streams' pool, never one a request waits for."""
        query = {"watch": "true", **(params or {})}
        headers = {"Accept": "application/json", **await self.credentials.headers()}
        async with self.http.stream(
            "GET", res.path(namespace), params=_params(query), headers=headers
        ) as resp:
            REQUESTS.labels(str(resp.status_code), "WATCH").inc()
            if resp.status_code == 401:
                await self.credentials.refresh(headers.get("Authorization"))
            if resp.status_code >= 300:
                body = await resp.read()
                raise _error(
                    Reply(resp.status_code, body, resp.reason_phrase), body.decode(errors="replace")
                )
            async for line in resp.lines():
                if not line.strip():
                    continue
                event = jsonio.loads(line)
                if event.get("type") == "ERROR":
                    st = event.get("object") or {}
                    raise ApiError(
                        int(st.get("code", 500)),
                        str(st.get("reason", "")),
                        str(st.get("message", "")),
                        st,
                    )
                yield event


def _params(params: Mapping[str, Any] | None) -> dict[str, str] | None:
    if not params:
        return None
    out = {}
    for k, v in params.items():
        if v is None:
            continue
        out[k] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return out
