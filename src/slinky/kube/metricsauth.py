"""Who may read `/metrics` when it is served securely (`--metrics-secure`), as
controller-runtime's `WithAuthenticationAndAuthorization` filter decides it: the request's
bearer token must be one the apiserver authenticates (a TokenReview), and its user must be
allowed to `get` the non-resource URL `/metrics` (a SubjectAccessReview; the
`<release>-metrics-reader` ClusterRole of the charts grants it).

The answer for a token is kept for a minute, so a Prometheus scraping every 15 s costs the
apiserver two reviews a minute; an apiserver that does not answer is not an answer: the
scrape gets 503 and nothing is kept.
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass

from slinky.kube import rest

log = logging.getLogger(__name__)

TOKEN_REVIEWS = "/apis/authentication.k8s.io/v1/tokenreviews"
ACCESS_REVIEWS = "/apis/authorization.k8s.io/v1/subjectaccessreviews"
CACHE_S = 60.0
MAX_CACHED = 1024
REVIEW_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Decision:
    status: int  # 200, 401, 403, or 503 (not decided: the apiserver did not answer)
    reason: str = ""


class MetricsAccess:
    """Bearer token -> may it read `path`? (See the module docstring.)"""

    def __init__(self, kube: rest.Kube, *, path: str = "/metrics") -> None:
        self.kube = kube
        self.path = path
        self._cache: dict[str, tuple[float, Decision]] = {}
        self.reviews = 0

    async def decide(self, authorization: str | None) -> Decision:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return Decision(401, "a bearer token is needed (Authorization: Bearer <token>)")
        key = hashlib.sha256(token.strip().encode()).hexdigest()
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        try:
            decision = await self._review(token.strip())
        except (rest.ApiError, rest.TransportError) as e:
            log.info("cannot review a /metrics token now: %s", e)
            return Decision(503, "the apiserver did not answer the token review; try again")
        if len(self._cache) >= MAX_CACHED:
            self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
            if len(self._cache) >= MAX_CACHED:
                self._cache.clear()
        self._cache[key] = (now + CACHE_S, decision)
        return decision

    async def _review(self, token: str) -> Decision:
        self.reviews += 1
        review = await self.kube.request(
            "POST",
            TOKEN_REVIEWS,
            timeout=REVIEW_TIMEOUT_S,
            body={
                "apiVersion": "authentication.k8s.io/v1",
                "kind": "TokenReview",
                "spec": {"token": token},
            },
        )
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return Decision(401, str(status.get("error") or "the token is not valid"))
        user = status.get("user") or {}
        username = str(user.get("username") or "")
        access = await self.kube.request(
            "POST",
            ACCESS_REVIEWS,
            timeout=REVIEW_TIMEOUT_S,
            body={
                "apiVersion": "authorization.k8s.io/v1",
                "kind": "SubjectAccessReview",
                "spec": {
                    "user": username,
                    "uid": user.get("uid"),
                    "groups": user.get("groups") or [],
                    "extra": user.get("extra") or {},
                    "nonResourceAttributes": {"path": self.path, "verb": "get"},
                },
            },
        )
        if (access.get("status") or {}).get("allowed"):
            return Decision(200)
        return Decision(403, f'user "{username}" may not get {self.path}')
