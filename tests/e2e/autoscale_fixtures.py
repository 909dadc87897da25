"""The operator's external metrics API wired into the test bed's apiserver: a serving
certificate from the test bed CA, the operator bound to the test bed's service address (an
address EndpointSlices accept, unlike loopback), a selector-less Service with an
EndpointSlice pointing at it, and the APIService from config/autoscale."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from slinky.kube import rest
from slinky_testbed import pki, procs
from slinky_testbed.bed import Testbed
from slinky_testbed.waiting import wait_for

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "slinky-system"
SERVICE = "slurm-operator-metrics-api"
APISERVICES = rest.Resource(
    "apiregistration.k8s.io", "v1", "apiservices", "APIService", namespaced=False
)
ENDPOINTSLICES = rest.Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
APISERVICE_NAME = "v1beta1.external.metrics.k8s.io"


def metrics_api_args(testbed: Testbed) -> tuple[list[str], int]:
    """Operator flags serving the metrics API on the test bed's service address."""
    (port,) = procs.free_ports(1)
    addr = testbed.service_address
    crt, key = pki.serving_cert(testbed.pki, SERVICE, [addr, f"{SERVICE}.{NAMESPACE}.svc"])
    args = [
        f"--metrics-api-bind-address={addr}:{port}",
        f"--metrics-api-cert-file={crt}",
        f"--metrics-api-key-file={key}",
        f"--metrics-api-client-ca-file={testbed.pki / 'front-proxy-ca.crt'}",
        f"--metrics-api-allowed-names={pki.FRONT_PROXY_CLIENT}",
    ]
    return args, port


async def install_metrics_api(kube: rest.Kube, testbed: Testbed, port: int) -> None:
    """Point the APIService at the operator process and wait until it is Available."""
    docs = [d for d in yaml.safe_load_all((REPO / "config/autoscale/apiservice.yaml").read_text())]
    apiservice: dict[str, Any] = next(d for d in docs if d["kind"] == "APIService")
    ca = (testbed.pki / "ca.crt").read_bytes()
    apiservice["spec"]["caBundle"] = base64.b64encode(ca).decode()
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE},
        # No selector: the operator runs outside the cluster; the EndpointSlice says where.
        "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
    }
    slice_ = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": SERVICE,
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": SERVICE},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [testbed.service_address], "conditions": {"ready": True}}],
        "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
    }
    await kube.apply(rest.SERVICES, service, field_manager="slinky-e2e", force=True)
    await kube.apply(ENDPOINTSLICES, slice_, field_manager="slinky-e2e", force=True)
    await kube.apply(APISERVICES, apiservice, field_manager="slinky-e2e", force=True)

    async def available() -> bool:
        obj = await kube.get(APISERVICES, APISERVICE_NAME)
        conds = (obj.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Available" and c["status"] == "True" for c in conds)

    await wait_for(available, timeout=60, what="APIService external.metrics.k8s.io Available")
