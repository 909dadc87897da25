"""The operator's external metrics API (issue 13) wired into the test bed's apiserver.

The operator runs outside the cluster, so the APIService points at a selector-less Service
whose EndpointSlice names the test bed's service address (a 10.x address on a bridge this
test bed owns: EndpointSlices refuse loopback). The serving certificate is signed by the
test bed CA (the APIService's caBundle) for the Service's DNS name; the operator accepts
only the apiserver's front-proxy client certificate.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from slinky_testbed import pki, procs
from slinky_testbed.bed import Testbed

NAMESPACE = "slinky-system"
SERVICE = "slurm-operator-metrics-api"
APISERVICE_NAME = "v1beta1.external.metrics.k8s.io"


def operator_args(bed: Testbed) -> tuple[list[str], int]:
    """slurm-operator flags serving the metrics API on the test bed's service address."""
    (port,) = procs.free_ports(1)
    addr = bed.service_address
    crt, key = pki.serving_cert(bed.pki, SERVICE, [addr, f"{SERVICE}.{NAMESPACE}.svc"])
    args = [
        f"--metrics-api-bind-address={addr}:{port}",
        f"--metrics-api-cert-file={crt}",
        f"--metrics-api-key-file={key}",
        f"--metrics-api-client-ca-file={bed.pki / 'front-proxy-ca.crt'}",
        f"--metrics-api-allowed-names={pki.FRONT_PROXY_CLIENT}",
    ]
    return args, port


def manifests(bed: Testbed, port: int, apiservice_yaml: Path) -> list[dict[str, Any]]:
    """Namespace, Service, EndpointSlice and the APIService of `apiservice_yaml` (the one in
    config/autoscale) with the test bed CA as its caBundle."""
    docs = [d for d in yaml.safe_load_all(apiservice_yaml.read_text()) if d]
    apiservice: dict[str, Any] = next(d for d in docs if d["kind"] == "APIService")
    apiservice["spec"]["caBundle"] = base64.b64encode((bed.pki / "ca.crt").read_bytes()).decode()
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": SERVICE, "namespace": NAMESPACE},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": SERVICE,
                "namespace": NAMESPACE,
                "labels": {"kubernetes.io/service-name": SERVICE},
            },
            "addressType": "IPv4",
            "endpoints": [{"addresses": [bed.service_address], "conditions": {"ready": True}}],
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
        },
        apiservice,
    ]
