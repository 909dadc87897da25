"""The webhook registrations (MutatingWebhookConfiguration, ValidatingWebhookConfiguration)
for a bridge config, so the apiserver calls the webhook for exactly the right pods.

- Pods of managed namespaces: mutated on CREATE and validated on CREATE/UPDATE (and the
  `pods/resize` sub-resource) with `failurePolicy: Fail`, since a pod the webhook never saw
  would be scheduled by the wrong scheduler.
- Pods anywhere else that name the bridge's scheduler: validated with `failurePolicy:
  Ignore` and a `matchCondition` on `schedulerName`, so the webhook is not even called for
  other pods, and a webhook that is down never blocks them.
- `kube-system` and the bridge's own namespace are excluded by the namespaceSelector of
  every webhook, whatever the config says (the bridge must be able to start its own pods).

`config/webhook/` holds these objects rendered for the default config; `python -m
slinky.bridge.admission.manifests --config FILE ...` renders them for another.
"""

from __future__ import annotations

import argparse
import base64
import sys
from pathlib import Path

import yaml

from slinky.bridge.admission.server import MUTATE_PATH, VALIDATE_PATH
from slinky.bridge.config import NEVER_MANAGED, BridgeConfig, load_config
from slinky.types import JSON

NAME_LABEL = "kubernetes.io/metadata.name"
DEFAULT_NAME = "slurm-bridge"
DEFAULT_NAMESPACE = "slinky-system"
DEFAULT_SERVICE = "slurm-bridge-webhook"


def _excluded(own_namespace: str) -> JSON:
    return {
        "key": NAME_LABEL,
        "operator": "NotIn",
        "values": sorted({*NEVER_MANAGED, own_namespace}),
    }


def managed_selector(config: BridgeConfig, own_namespace: str) -> JSON:
    """The namespaceSelector of the managed namespaces (never kube-system or our own)."""
    if config.managed_namespace_selector is not None:
        selector = config.managed_namespace_selector.to_json()
        exprs = [*selector.get("matchExpressions", []), _excluded(own_namespace)]
        return {**selector, "matchExpressions": exprs}
    return {
        "matchExpressions": [
            {"key": NAME_LABEL, "operator": "In", "values": list(config.managed_namespaces)},
            _excluded(own_namespace),
        ]
    }


def other_selector(config: BridgeConfig, own_namespace: str) -> JSON:
    exprs = [_excluded(own_namespace)]
    if config.managed_namespace_selector is None:
        exprs.append(
            {"key": NAME_LABEL, "operator": "NotIn", "values": list(config.managed_namespaces)}
        )
    return {"matchExpressions": exprs}


def client_config(
    path: str,
    *,
    url: str | None,
    ca_bundle: bytes | None,
    service: tuple[str, str, int] | None,
) -> JSON:
    out: JSON = {}
    if url is not None:
        out["url"] = url.rstrip("/") + path
    else:
        assert service is not None
        name, namespace, port = service
        out["service"] = {"name": name, "namespace": namespace, "path": path, "port": port}
    if ca_bundle is not None:
        out["caBundle"] = base64.b64encode(ca_bundle).decode()
    return out


def webhook_configurations(
    config: BridgeConfig,
    *,
    own_namespace: str = DEFAULT_NAMESPACE,
    name: str = DEFAULT_NAME,
    url: str | None = None,
    ca_bundle: bytes | None = None,
    service: tuple[str, str, int] | None = None,
) -> list[JSON]:
    """Both registrations. Give `url` (e.g. https://127.0.0.1:9443) or `service`
    (name, namespace, port); `ca_bundle` is the PEM CA that signed the serving cert."""
    if url is None and service is None:
        service = (DEFAULT_SERVICE, own_namespace, 443)
    mutate_client = client_config(MUTATE_PATH, url=url, ca_bundle=ca_bundle, service=service)
    validate_client = client_config(VALIDATE_PATH, url=url, ca_bundle=ca_bundle, service=service)
    common = {"sideEffects": "None", "admissionReviewVersions": ["v1"]}
    sched = config.scheduler_name
    names_scheduler = (
        f"object.spec.schedulerName == '{sched}' || "
        f"(oldObject != null && oldObject.spec.schedulerName == '{sched}')"
    )
    validate_rules = [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE", "UPDATE"],
            "resources": ["pods", "pods/resize"],
            "scope": "Namespaced",
        }
    ]
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": f"pods.{name}.slinky.slurm.net",
                "clientConfig": mutate_client,
                "rules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                        "scope": "Namespaced",
                    }
                ],
                "namespaceSelector": managed_selector(config, own_namespace),
                "failurePolicy": "Fail",
                "reinvocationPolicy": "IfNeeded",
                "timeoutSeconds": 10,
                **common,
            }
        ],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": f"pods.{name}.slinky.slurm.net",
                "clientConfig": validate_client,
                "rules": validate_rules,
                "namespaceSelector": managed_selector(config, own_namespace),
                "failurePolicy": "Fail",
                "timeoutSeconds": 10,
                **common,
            },
            {
                "name": f"scheduled-pods.{name}.slinky.slurm.net",
                "clientConfig": validate_client,
                "rules": validate_rules,
                "namespaceSelector": other_selector(config, own_namespace),
                "matchConditions": [
                    {"name": "names-bridge-scheduler", "expression": names_scheduler}
                ],
                "failurePolicy": "Ignore",
                "timeoutSeconds": 5,
                **common,
            },
        ],
    }
    return [mutating, validating]


HEADER = """\
# Generated by `python -m slinky.bridge.admission.manifests` for the default bridge config
# (managedNamespaces: [slurm-bridge], schedulerName: slurm-bridge-scheduler), the bridge in
# namespace slinky-system behind Service slurm-bridge-webhook. Set caBundle to the CA of the
# webhook's serving certificate (or let cert-manager's CA injector do it). A test checks
# that this file is what the code renders.
"""


def render(objects: list[JSON]) -> str:
    return yaml.safe_dump_all(objects, sort_keys=False)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(
        prog="python -m slinky.bridge.admission.manifests",
        description="Print the webhook registrations for a bridge config.",
    )
    p.add_argument("--config", default=None)
    p.add_argument("--namespace", default=DEFAULT_NAMESPACE, help="the bridge's namespace")
    p.add_argument("--name", default=DEFAULT_NAME)
    p.add_argument("--url", default=None, help="call the webhook at this https URL")
    p.add_argument("--ca-file", type=Path, default=None, help="PEM CA for caBundle")
    p.add_argument("--output", type=Path, default=None, help="write here (with a header)")
    args = p.parse_args(argv)
    objects = webhook_configurations(
        load_config(args.config),
        own_namespace=args.namespace,
        name=args.name,
        url=args.url,
        ca_bundle=args.ca_file.read_bytes() if args.ca_file else None,
    )
    if args.output:
        args.output.write_text(HEADER + render(objects))
    else:
        sys.stdout.write(render(objects))


if __name__ == "__main__":
    main()
