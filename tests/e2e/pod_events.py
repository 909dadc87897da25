"""The Events about one pod, as `kubectl describe pod` finds them (core/v1 Events by
involvedObject), for e2e tests of what a pod's containers record (the slurm chart's
reconfigure container: Reconfigured, ConfigRefused)."""

from __future__ import annotations

from slinky.kube import rest

CORE_EVENTS = rest.Resource("", "v1", "events", "Event")


async def pod_events(kube: rest.Kube, namespace: str, pod: str, reason: str) -> list[str]:
    """The messages of the Events with this reason about pod `pod`, oldest first."""
    got = await kube.list(
        CORE_EVENTS,
        namespace,
        params={"fieldSelector": f"involvedObject.kind=Pod,involvedObject.name={pod}"},
    )
    items = [e for e in got["items"] if e.get("reason") == reason]
    items.sort(key=lambda e: e.get("eventTime") or e.get("lastTimestamp") or "")
    return [str(e.get("message", "")) for e in items]
