"""One source of truth for the custom resources: Python dataclasses that both generate the
CRD's structural OpenAPI schema and parse objects (with defaults) for the controllers.

Field names are snake_case in Python and camelCase on the wire. Per-field facts (description,
default, bounds, enum, pattern, CEL rules, or a whole schema override for embedded Kubernetes
types such as a PodTemplateSpec) live in `dataclasses.field(metadata=...)`, built with `prop()`.
"""

from __future__ import annotations

import copy
import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints

from slinky.types import JSON

T = TypeVar("T")


class IntOrString:
    """Marker type for Kubernetes' int-or-string (e.g. maxUnavailable: 1 or "10%")."""


def prop(
    *,
    description: str = "",
    default: Any = dataclasses.MISSING,
    required: bool = False,
    minimum: int | None = None,
    maximum: int | None = None,
    enum: list[str] | None = None,
    pattern: str | None = None,
    format: str | None = None,
    rules: list[tuple[str, str]] | None = None,
    schema: JSON | Callable[[], JSON] | None = None,
    name: str | None = None,
) -> Any:
    """A dataclass field carrying its schema facts. `rules` are (CEL rule, message) pairs.
    `schema` replaces the generated one; a function is called only when a CRD is generated
    (for a schema read from a file, which the controllers never need)."""
    meta = {
        "description": description,
        "required": required,
        "minimum": minimum,
        "maximum": maximum,
        "enum": enum,
        "pattern": pattern,
        "format": format,
        "rules": rules or [],
        "schema": schema,
        "name": name,
        "has_default": default is not dataclasses.MISSING,
        "default": default,
    }
    if default is dataclasses.MISSING:
        return dataclasses.field(default=None, metadata=meta)
    if isinstance(default, list | dict):
        return dataclasses.field(
            default_factory=lambda: typing.cast(Any, default).copy(), metadata=meta
        )
    return dataclasses.field(default=default, metadata=meta)


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def _unwrap_optional(tp: Any) -> Any:
    if get_origin(tp) in (Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return tp


def wire_name(f: dataclasses.Field[Any]) -> str:
    return f.metadata.get("name") or camel(f.name)


# ---------------------------------------------------------------- schema generation


def schema_of(tp: Any) -> JSON:
    """Structural OpenAPI v3 schema of a type."""
    tp = _unwrap_optional(tp)
    if tp is IntOrString:
        return {"x-kubernetes-int-or-string": True}
    if tp is str:
        return {"type": "string"}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer", "format": "int32"}
    if tp is float:
        return {"type": "number"}
    origin = get_origin(tp)
    if origin is list:
        return {"type": "array", "items": schema_of(get_args(tp)[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": schema_of(get_args(tp)[1])}
    if dataclasses.is_dataclass(tp):
        return object_schema(tp)  # type: ignore[arg-type]
    raise TypeError(f"no schema for {tp!r}")


def object_schema(cls: type) -> JSON:
    hints = get_type_hints(cls)
    props: JSON = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        m = f.metadata
        key = wire_name(f)
        given = m.get("schema")
        if callable(given):
            given = given()
        s = dict(given) if given else schema_of(hints[f.name])
        if m.get("description"):
            s = {"description": m["description"], **s}
        for k in ("minimum", "maximum", "enum", "pattern", "format"):
            if m.get(k) is not None:
                s[k] = m[k]
        if m.get("has_default"):
            s["default"] = m["default"]
        if m.get("rules"):
            s["x-kubernetes-validations"] = [{"rule": r, "message": msg} for r, msg in m["rules"]]
        props[key] = s
        if m.get("required"):
            required.append(key)
    out: JSON = {"type": "object", "properties": props}
    if required:
        out["required"] = required
    doc = (cls.__doc__ or "").strip()
    if doc and not doc.startswith(cls.__name__ + "("):
        out = {"description": " ".join(doc.split()), **out}
    rules = getattr(cls, "__validations__", None)
    if rules:
        out["x-kubernetes-validations"] = [
            {"rule": r, "message": msg, **({"fieldPath": path} if path else {})}
            for r, msg, path in rules
        ]
    return out


# ---------------------------------------------------------------- parsing


class ParseError(ValueError):
    """A value does not fit the model; `path` names the field (e.g. spec.replicas)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path


def parse(cls: type[T], data: Any, path: str = "") -> T:
    """Build a dataclass from wire JSON, applying defaults. Unknown keys are ignored (the
    apiserver's schema already rejected them where it matters)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParseError(path or cls.__name__, f"expected an object, got {type(data).__name__}")
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        key = wire_name(f)
        sub = f"{path}.{key}" if path else key
        if key in data and data[key] is not None:
            if f.metadata.get("schema"):
                kwargs[f.name] = data[key]
            else:
                kwargs[f.name] = _value(hints[f.name], data[key], sub)
        elif f.metadata.get("required"):
            raise ParseError(sub, "required")
        elif f.metadata.get("has_default") and not f.metadata.get("schema"):
            # As the apiserver would default it (nested defaults included).
            kwargs[f.name] = _value(hints[f.name], copy.deepcopy(f.metadata["default"]), sub)
    return cls(**kwargs)


def _value(tp: Any, value: Any, path: str) -> Any:
    tp = _unwrap_optional(tp)
    if tp is IntOrString:
        if isinstance(value, int | str):
            return value
        raise ParseError(path, "expected an integer or a string")
    if tp in (str, int, float, bool):
        if tp is float and isinstance(value, int):
            return float(value)
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            raise ParseError(path, f"expected {tp.__name__}, got {type(value).__name__}")
        return value
    origin = get_origin(tp)
    if origin is list:
        (item,) = get_args(tp)
        return [_value(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = get_args(tp)
        return {k: _value(item, v, f"{path}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return parse(tp, value, path)  # type: ignore[arg-type]
    return value


def dump(obj: Any) -> Any:
    """Wire JSON of a dataclass (None fields omitted)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: JSON = {}
        for f in dataclasses.fields(obj):
            v = getattr(obj, f.name)
            if v is not None:
                out[wire_name(f)] = dump(v)
        return out
    if isinstance(obj, list):
        return [dump(v) for v in obj]
    if isinstance(obj, dict):
        return {k: dump(v) for k, v in obj.items()}
    return obj
