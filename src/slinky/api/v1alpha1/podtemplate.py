"""The NodeSet's pod template schema: core/v1 PodTemplateSpec as Kubernetes itself describes it.

A typo in the template (`resurces:`) must be refused as a StatefulSet refuses it, so the CRD
carries the real structure instead of `x-kubernetes-preserve-unknown-fields`. The structure
comes from a checked-in copy of the definitions PodTemplateSpec reaches in the Kubernetes
OpenAPI v3 document (`api/openapi-spec/v3/api__v1_openapi.json` of the release the test bed
builds), descriptions removed: `python -m slinky.api.v1alpha1.podtemplate PATH` refreshes it.

`schema()` inlines the references into a structural CRD schema. It keeps what validates a
value (types, formats, required fields, properties) and leaves out what would change a stored
template: defaults (the apiserver would add them on every read, so every NodeSet's revision
hash, hence its pods, would change on a CRD upgrade) and the list/map merge markers (the old
schema merged lists atomically; server-side apply of templates keeps that).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from slinky.types import JSON

COPY = Path(__file__).with_name("podtemplatespec.openapi.json")
ROOT = "io.k8s.api.core.v1.PodTemplateSpec"
_PREFIX = "#/components/schemas/"
_QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
_INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
# Schema keys a structural CRD schema takes from the Kubernetes document.
_KEEP = {"type", "format", "required", "properties", "items", "additionalProperties"}


def extract(document: JSON) -> JSON:
    """The definitions ROOT reaches in a Kubernetes OpenAPI v3 document, without prose."""
    schemas: JSON = document["components"]["schemas"]
    out: JSON = {}

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                visit(node["$ref"].removeprefix(_PREFIX))
            out_node: JSON = {}
            for key, value in node.items():
                if key == "properties":
                    out_node[key] = {p: strip(s) for p, s in value.items()}
                elif key in ("required", "enum"):
                    out_node[key] = value
                elif key != "description":
                    out_node[key] = strip(value)
            return out_node
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    def visit(name: str) -> None:
        if name not in out:
            out[name] = {}
            out[name] = strip(schemas[name])

    visit(ROOT)
    return dict(sorted(out.items()))


def _expand(defs: JSON, node: JSON, path: tuple[str, ...]) -> JSON:
    ref = node.get("$ref")
    if ref is None and len(node.get("allOf", ())) == 1:
        ref = node["allOf"][0].get("$ref")
    if ref is not None:
        name = ref.removeprefix(_PREFIX)
        if name == _QUANTITY:
            # An int, a float (`cpu: 0.5`) or a string: more than int-or-string allows, so
            # any value; the pod's own validation reads the quantity.
            return {"x-kubernetes-preserve-unknown-fields": True}
        if name == _INT_OR_STRING:
            return {"x-kubernetes-int-or-string": True}
        if name in path:
            raise ValueError(f"recursive schema: {' -> '.join((*path, name))}")
        return _expand(defs, defs[name], (*path, name))
    out: JSON = {}
    for key, value in node.items():
        if key not in _KEEP:
            continue
        if key == "properties":
            out[key] = {p: _expand(defs, s, path) for p, s in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = _expand(defs, value, path)
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" in out:
        raise ValueError(f"both properties and additionalProperties under {path[-1]}")
    return out


def load() -> JSON:
    defs: JSON = json.loads(COPY.read_text())
    return defs


def schema(labels: JSON, max_containers: int) -> JSON:
    """The structural schema of a pod template. `labels` is the schema of metadata.labels
    (bounded, for the CEL rules that read it) and containers hold at most `max_containers`."""
    defs = load()
    out = _expand(defs, defs[ROOT], (ROOT,))
    out["properties"]["metadata"]["properties"]["labels"] = labels
    out["properties"]["spec"]["properties"]["containers"]["maxItems"] = max_containers
    return out


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.exit(
            "usage: python -m slinky.api.v1alpha1.podtemplate "
            "<kubernetes>/api/openapi-spec/v3/api__v1_openapi.json"
        )
    defs = extract(json.loads(Path(args[0]).read_text()))
    COPY.write_text(json.dumps(defs, indent=1, sort_keys=True) + "\n")
    print(f"wrote {COPY} ({len(defs)} definitions)")


if __name__ == "__main__":
    main()
