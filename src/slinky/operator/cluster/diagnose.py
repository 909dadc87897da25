"""Why slurmctld does not answer, when Kubernetes can tell: its pod, found through the Service
named by the Cluster's `spec.controller.host` (`<service>[.<namespace>[.svc[.<domain>]]]`),
is missing, Pending (with the scheduler's words and the claims that wait for a volume) or not
Ready. Read only when a ping failed: a few list calls, never in steady state. A host that is
not a Service of this cluster (hybrid: slurmctld outside Kubernetes) gets no diagnosis.
"""

from __future__ import annotations

from slinky.kube import conditions, rest
from slinky.types import JSON


def service_of(host: str, namespace: str) -> tuple[str, str] | None:
    """(namespace, service) named by a controller host, or None (an IP, an outside name)."""
    parts = host.split(".")
    if not parts[0] or parts[0].isdigit():
        return None
    if len(parts) == 1:
        return namespace, parts[0]
    if len(parts) == 2 or parts[2] == "svc":
        return parts[1], parts[0]
    return None


async def controller_problem(
    kube: rest.Kube, host: str | None, namespace: str
) -> tuple[str, str] | None:
    """(reason, message) when slurmctld's pod explains the failure, else None."""
    where = service_of(host or "", namespace)
    if where is None or where[0] != namespace:
        # Only the Cluster's own namespace: its status must not tell what is in another.
        return None
    ns, name = where
    try:
        services = await kube.list(
            rest.SERVICES, ns, params={"fieldSelector": f"metadata.name={name}"}
        )
        if not services["items"]:
            return None
        selector = (services["items"][0].get("spec") or {}).get("selector") or {}
        if not selector:
            return None
        label_selector = ",".join(f"{k}={v}" for k, v in sorted(selector.items()))
        found = await kube.list(rest.PODS, ns, params={"labelSelector": label_selector})
        pods = found["items"]
        if not pods:
            return (
                "SlurmctldPodMissing",
                f"no pod behind Service {ns}/{name} (spec.controller.host): slurmctld is not "
                "running (its StatefulSet scaled to 0, or not created yet)",
            )
        pod = sorted(pods, key=lambda p: str(p["metadata"]["name"]))[0]
        return await _pod_problem(kube, ns, pod)
    except rest.ApiError:
        return None  # no right to look, or the apiserver is away: say nothing more


async def _pod_problem(kube: rest.Kube, ns: str, pod: JSON) -> tuple[str, str] | None:
    name = str(pod["metadata"]["name"])
    status = pod.get("status") or {}
    conds = status.get("conditions")
    if conditions.is_true(conds, "Ready"):
        return None
    phase = status.get("phase") or "Pending"
    containers = [
        *(status.get("initContainerStatuses") or []),
        *(status.get("containerStatuses") or []),
    ]
    waiting = [
        f"{c.get('name')}: {(c.get('state') or {}).get('waiting', {}).get('reason')}"
        for c in containers
        if (c.get("state") or {}).get("waiting")
    ]
    if phase == "Pending":
        scheduled = conditions.find(conds, "PodScheduled") or {}
        unscheduled = (
            "" if scheduled.get("status") == "True" else str(scheduled.get("message") or "")
        )
        said = ", ".join(x for x in (unscheduled, *waiting) if x)
        message = f"waiting for slurmctld's pod {ns}/{name}: Pending" + (
            f" ({said})" if said else ""
        )
        claims = await _pending_claims(kube, ns, pod)
        if claims:
            message += "; " + "; ".join(claims)
        return "SlurmctldPodPending", message
    return (
        "SlurmctldPodNotReady",
        f"slurmctld's pod {ns}/{name} is {phase} but not Ready"
        + (f" ({', '.join(waiting)})" if waiting else "")
        + f"; see kubectl -n {ns} logs {name}",
    )


async def _pending_claims(kube: rest.Kube, ns: str, pod: JSON) -> list[str]:
    names = {
        str(v["persistentVolumeClaim"]["claimName"])
        for v in (pod.get("spec") or {}).get("volumes") or []
        if v.get("persistentVolumeClaim")
    }
    if not names:
        return []
    out = []
    for claim in (await kube.list(rest.PVCS, ns))["items"]:
        cname = str(claim["metadata"]["name"])
        if cname not in names or (claim.get("status") or {}).get("phase") == "Bound":
            continue
        klass = (claim.get("spec") or {}).get("storageClassName")
        out.append(
            f"its claim {cname} is Pending "
            + (
                f"(storageClassName {klass}: is there such a StorageClass, with a provisioner?)"
                if klass
                else "(no storageClassName and no default StorageClass: set one, or create a "
                "PersistentVolume it can bind)"
            )
        )
    return sorted(out)
