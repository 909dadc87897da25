"""Common writes: status patches, finalizers, owner references."""

from __future__ import annotations

from slinky.kube import rest
from slinky.types import JSON


def owner_reference(owner: JSON, *, controller: bool = True) -> JSON:
    """An ownerReference to `owner` (blockOwnerDeletion so foreground deletion waits)."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": controller,
        "blockOwnerDeletion": True,
    }


async def patch_status(kube: rest.Kube, res: rest.Resource, obj: JSON, status: JSON) -> JSON:
    """Merge-patch the status subresource."""
    meta = obj["metadata"]
    return await kube.patch(
        res, meta["name"], {"status": status}, meta.get("namespace"), subresource="status"
    )


def has_finalizer(obj: JSON, finalizer: str) -> bool:
    return finalizer in (obj["metadata"].get("finalizers") or [])


async def add_finalizer(kube: rest.Kube, res: rest.Resource, obj: JSON, finalizer: str) -> JSON:
    """Add `finalizer` unless present. Optimistic: fails with 409 if `obj` is stale."""
    if has_finalizer(obj, finalizer):
        return obj
    meta = obj["metadata"]
    finalizers = [*(meta.get("finalizers") or []), finalizer]
    patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
    return await kube.patch(res, meta["name"], patch, meta.get("namespace"))


async def remove_finalizer(
    kube: rest.Kube, res: rest.Resource, obj: JSON, finalizer: str
) -> JSON | None:
    """Remove `finalizer` if present; None when the object is gone afterwards."""
    if not has_finalizer(obj, finalizer):
        return obj
    meta = obj["metadata"]
    finalizers = [f for f in meta.get("finalizers") or [] if f != finalizer]
    patch = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
    try:
        return await kube.patch(res, meta["name"], patch, meta.get("namespace"))
    except rest.ApiError as e:
        if e.not_found:
            return None
        raise
