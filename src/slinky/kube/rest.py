"""Raw JSON access to the Kubernetes API.

lightkube gives typed models and server-side apply; hot paths (informers, status patches,
pod binding) want plain dicts and full control of query parameters (`allowWatchBookmarks`,
`resourceVersionMatch`, preconditions). This module reuses lightkube's kubeconfig handling and
its pooled httpx2 client so both paths share one configuration and one connection pool.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx2
from lightkube.config import client_adapter
from lightkube.config.kubeconfig import KubeConfig, SingleConfig
from lightkube.core import exceptions as lightkube_errors
from prometheus_client import Counter

from slinky.types import JSON

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


def _error(resp: httpx2.Response, text: str) -> ApiError:
    try:
        body = json.loads(text)
    except ValueError:
        body = {}
    if isinstance(body, dict) and body.get("kind") == "Status":
        return ApiError(
            resp.status_code, str(body.get("reason", "")), str(body.get("message", "")), body
        )
    return ApiError(resp.status_code, resp.reason_phrase, text[:500])


class Kube:
    """A small async JSON client over one pooled connection set."""

    def __init__(self, http: httpx2.AsyncClient, config: SingleConfig) -> None:
        self.http = http
        self.config = config

    @classmethod
    def from_kubeconfig(cls, path: str | Path | None = None, *, timeout: float = 30.0) -> Kube:
        """From a kubeconfig file, else $KUBECONFIG / in-cluster service account."""
        try:
            config = (KubeConfig.from_file(path) if path else KubeConfig.from_env()).get()
            if config is None:
                raise ValueError(f"kubeconfig {path or '$KUBECONFIG'} has no current context")
            params = client_adapter.ConnectionParams(
                timeout=httpx2.Timeout(timeout), trust_env=False
            )
            kwargs = params.httpx_params(config)
        except (lightkube_errors.ConfigError, AssertionError) as e:
            raise ValueError(f"kubeconfig: {e or 'no user in the current context'}") from None
        # Every connection kept for reuse: with 20 kept, a scheduler with 16 workers beside
        # its watches closed connections after use and opened (TLS handshake) new ones at
        # every request in a burst (a fifth of its CPU time).
        kwargs["limits"] = httpx2.Limits(max_connections=100, max_keepalive_connections=100)
        return cls(httpx2.AsyncClient(**kwargs), config)

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
        """Send one request; return the decoded JSON body or raise ApiError."""
        headers = {"Accept": "application/json"}
        content = None
        if body is not None:
            content = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        extra: dict[str, Any] = {}
        if timeout is not None:
            extra["timeout"] = timeout
        resp = await self.http.request(
            method, path, params=_params(params), content=content, headers=headers, **extra
        )
        REQUESTS.labels(str(resp.status_code), method).inc()
        text = resp.text
        if resp.status_code >= 300:
            raise _error(resp, text)
        return json.loads(text) if text else {}

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
        An ERROR event is raised as ApiError (410 Gone among them)."""
        query = {"watch": "true", **(params or {})}
        async with self.http.stream(
            "GET",
            res.path(namespace),
            params=_params(query),
            timeout=httpx2.Timeout(30.0, read=None),
        ) as resp:
            REQUESTS.labels(str(resp.status_code), "WATCH").inc()
            if resp.status_code >= 300:
                raise _error(resp, (await resp.aread()).decode(errors="replace"))
            async for line in resp.aiter_lines():
                if not line:
                    continue
                event = json.loads(line)
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
