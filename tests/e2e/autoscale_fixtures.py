"""The operator's external metrics API installed in the test bed's apiserver (the wiring is
slinky_testbed.metricsapi, shared with `make dev`)."""

from __future__ import annotations

from pathlib import Path

from slinky.kube import rest
from slinky_testbed import metricsapi
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
APISERVICES = rest.Resource(
    "apiregistration.k8s.io", "v1", "apiservices", "APIService", namespaced=False
)
RESOURCES = {
    "Namespace": rest.NAMESPACES,
    "Service": rest.SERVICES,
    "EndpointSlice": rest.Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"),
    "APIService": APISERVICES,
}
metrics_api_args = metricsapi.operator_args


async def install_metrics_api(kube: rest.Kube, testbed: Testbed, port: int) -> None:
    """Point the APIService at the operator process and wait until it is Available."""
    for obj in metricsapi.manifests(testbed, port, REPO / "config/autoscale/apiservice.yaml"):
        await kube.apply(RESOURCES[obj["kind"]], obj, field_manager="slinky-e2e", force=True)

    async def available() -> bool:
        obj = await kube.get(APISERVICES, metricsapi.APISERVICE_NAME)
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Available" and c["status"] == "True" for c in conds)

    await wait_for(available, timeout=60, what="APIService external.metrics.k8s.io Available")
