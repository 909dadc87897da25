"""An indexed, in-memory cache of Kubernetes objects (client-go's `Indexer`).

Reconcilers read from stores, never from the apiserver: "pods of this NodeSet" is an index
lookup by owner UID, "pods on this Node" a lookup by `spec.nodeName`. Objects are raw JSON
dicts as the apiserver sent them; callers must not mutate them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from slinky.types import JSON

IndexFunc = Callable[[JSON], Iterable[str]]

BY_NAMESPACE = "namespace"
BY_OWNER_UID = "owner-uid"
BY_NODE_NAME = "node-name"


def key_of(obj: JSON) -> str:
    """`namespace/name` for namespaced objects, `name` otherwise (client-go's key format)."""
    meta = obj["metadata"]
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else str(meta["name"])


def split_key(key: str) -> tuple[str | None, str]:
    """The inverse of key_of: (namespace or None, name)."""
    ns, sep, name = key.partition("/")
    return (ns, name) if sep else (None, ns)


def index_namespace(obj: JSON) -> list[str]:
    ns = obj["metadata"].get("namespace")
    return [ns] if ns else []


def index_owner_uid(obj: JSON) -> list[str]:
    return [str(o["uid"]) for o in obj["metadata"].get("ownerReferences") or [] if "uid" in o]


def index_node_name(obj: JSON) -> list[str]:
    node = (obj.get("spec") or {}).get("nodeName")
    return [node] if node else []


def index_label(label: str) -> IndexFunc:
    """An index on the value of one label."""

    def index(obj: JSON) -> list[str]:
        value = (obj["metadata"].get("labels") or {}).get(label)
        return [value] if value is not None else []

    return index


DEFAULT_INDEXERS: dict[str, IndexFunc] = {
    BY_NAMESPACE: index_namespace,
    BY_OWNER_UID: index_owner_uid,
}


class Store:
    """Objects by key, plus secondary indexes maintained on every change."""

    def __init__(self, indexers: dict[str, IndexFunc] | None = None) -> None:
        self._items: dict[str, JSON] = {}
        self._indexers: dict[str, IndexFunc] = dict(DEFAULT_INDEXERS)
        self._indexers.update(indexers or {})
        self._indices: dict[str, dict[str, set[str]]] = {n: {} for n in self._indexers}

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def add_indexer(self, name: str, fn: IndexFunc) -> None:
        """Add an index (built at once over what the store holds)."""
        if name in self._indexers:
            return
        self._indexers[name] = fn
        index: dict[str, set[str]] = {}
        for key, obj in self._items.items():
            for value in fn(obj):
                index.setdefault(value, set()).add(key)
        self._indices[name] = index

    def get(self, key: str) -> JSON | None:
        return self._items.get(key)

    def keys(self) -> list[str]:
        return list(self._items)

    def objects(self) -> list[JSON]:
        return list(self._items.values())

    def by_index(self, index: str, value: str) -> list[JSON]:
        """Objects whose index function returned `value`."""
        keys = self._indices[index].get(value, ())
        return [self._items[k] for k in keys]

    def upsert(self, obj: JSON) -> JSON | None:
        """Insert or replace; returns the previous version."""
        key = key_of(obj)
        old = self._items.get(key)
        if old is not None:
            self._unindex(key, old)
        self._items[key] = obj
        self._index(key, obj)
        return old

    def delete(self, key: str) -> JSON | None:
        old = self._items.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    def _index(self, key: str, obj: JSON) -> None:
        for name, fn in self._indexers.items():
            index = self._indices[name]
            for value in fn(obj):
                index.setdefault(value, set()).add(key)

    def _unindex(self, key: str, obj: JSON) -> None:
        for name, fn in self._indexers.items():
            index = self._indices[name]
            for value in fn(obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]
