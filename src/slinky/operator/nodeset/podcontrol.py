"""Kubernetes-side effects of the NodeSet controller.

Creates and deletes go through expectations so that a reconcile working from a cache that
has not yet seen its own writes does not repeat them. Annotations it writes (`condemned`)
are laid over the cached pod (`as_written`) until the cache shows them, so the next pass
never takes a pod it just condemned for one that is not (and picks a second victim). Deletes
carry the pod's UID as a precondition: a pod re-created under the same name is never
deleted by mistake.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from slinky.kube import rest
from slinky.kube.expectations import Expectations
from slinky.operator.nodeset.pods import CachedPod
from slinky.types import JSON

log = logging.getLogger(__name__)

PDBS = rest.PDBS
# How long a written annotation is laid over a cache that does not show it: far longer than
# a watch event takes, short enough that a write someone else undid is not hidden for long.
WRITTEN_GRACE_S = 30.0


class PodControl:
    def __init__(self, kube: rest.Kube, expectations: Expectations) -> None:
        self.kube = kube
        self.expectations = expectations
        # Pod UID -> annotations this process wrote there (None: removed), and when.
        self._written: dict[str, tuple[dict[str, Any], float]] = {}

    def as_written(self, pod: JSON) -> JSON:
        """The cached pod, with the annotations written here that the cache does not show
        yet."""
        uid = pod["metadata"].get("uid")
        entry = self._written.get(uid) if uid else None
        if entry is None:
            return pod
        wrote, at = entry
        have = pod["metadata"].get("annotations") or {}
        if all(have.get(k) == v for k, v in wrote.items()) or (
            time.monotonic() - at > WRITTEN_GRACE_S
        ):
            del self._written[uid]  # the cache caught up (or someone else wrote since)
            return pod
        merged = {k: v for k, v in {**have, **wrote}.items() if v is not None}
        return CachedPod({**pod, "metadata": {**pod["metadata"], "annotations": merged}})

    def _wrote(self, uid: str, annotations: JSON) -> None:
        now = time.monotonic()
        if len(self._written) > 1024:  # pods deleted before the cache caught up
            self._written = {
                u: e for u, e in self._written.items() if now - e[1] <= WRITTEN_GRACE_S
            }
        earlier = self._written.get(uid, ({}, now))[0]
        self._written[uid] = ({**earlier, **annotations}, now)

    async def create_pod(self, exp_key: str, pod: JSON) -> bool:
        """Create; False if it already exists (the cache will catch up)."""
        self.expectations.expect_creations(exp_key, 1)
        try:
            await self.kube.create(rest.PODS, pod, pod["metadata"]["namespace"])
        except rest.ApiError as e:
            self.expectations.creation_failed(exp_key)
            if e.conflict:
                return False
            raise
        except BaseException:
            self.expectations.creation_failed(exp_key)
            raise
        return True

    async def delete_pod(self, exp_key: str, pod: JSON) -> bool:
        meta = pod["metadata"]
        self.expectations.expect_deletions(exp_key, [meta["uid"]])
        try:
            await self.kube.delete(rest.PODS, meta["name"], meta["namespace"], uid=meta["uid"])
        except rest.ApiError as e:
            self.expectations.deletion_observed(exp_key, meta["uid"])
            if e.not_found or e.conflict:
                return False
            raise
        except BaseException:
            # No answer (apiserver gone mid-request, soak run 8): the deletion may never
            # happen, so it is not waited for; if it did happen, its event changes nothing.
            # Left expected, the NodeSet waited 5 minutes for the expectation to expire.
            self.expectations.deletion_observed(exp_key, meta["uid"])
            raise
        # Every pod deletion of the operator, in one line (the chaos soak reads them).
        log.info("deleted pod %s/%s (uid %s)", meta["namespace"], meta["name"], meta["uid"])
        return True

    async def patch_metadata(
        self, pod: JSON, *, labels: JSON | None = None, annotations: JSON | None = None
    ) -> None:
        """Merge-patch labels/annotations; a None value removes the key."""
        meta: JSON = {}
        if labels:
            meta["labels"] = labels
        if annotations:
            meta["annotations"] = annotations
        if not meta:
            return
        m = pod["metadata"]
        try:
            await self.kube.patch(rest.PODS, m["name"], {"metadata": meta}, m["namespace"])
        except rest.ApiError as e:
            if not e.not_found:
                raise
            return
        if annotations and m.get("uid"):
            self._wrote(str(m["uid"]), annotations)

    async def patch_conditions(self, pod: JSON, conditions: list[JSON]) -> None:
        """Strategic-merge the given pod conditions (merged by type, others untouched)."""
        m = pod["metadata"]
        try:
            await self.kube.patch(
                rest.PODS,
                m["name"],
                {"status": {"conditions": conditions}},
                m["namespace"],
                subresource="status",
                kind="strategic",
            )
        except rest.ApiError as e:
            if not e.not_found:
                raise

    async def create_if_absent(self, res: rest.Resource, obj: JSON) -> bool:
        """Create; True if created now, False if it already existed."""
        try:
            await self.kube.create(res, obj, obj["metadata"].get("namespace"))
        except rest.ApiError as e:
            if e.conflict:
                return False
            raise
        return True

    async def delete_object(self, res: rest.Resource, obj: JSON) -> None:
        m = obj["metadata"]
        try:
            await self.kube.delete(res, m["name"], m.get("namespace"), uid=m.get("uid"))
        except rest.ApiError as e:
            if not (e.not_found or e.conflict):
                raise
