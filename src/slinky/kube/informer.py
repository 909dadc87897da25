"""List-then-watch informers that keep a Store current and tell handlers what changed.

Semantics follow client-go's reflector:

- the first list is paginated (`limit`/`continue`) and gives the resourceVersion to watch from;
- the watch asks for bookmarks, so the resourceVersion keeps moving even when nothing of ours
  changes, and a reconnect resumes from the last version seen instead of re-listing;
- a stream that stays silent longer than `silence_timeout` is presumed dead and reopened;
- `410 Gone` (the version was compacted away while we were disconnected) forces a fresh list,
  which is diffed against the store: objects that vanished meanwhile produce delete events,
  so no handler misses a deletion;
- connection errors back off exponentially and never drop the cache: reconcilers keep reading
  the last known state while the apiserver restarts;
- an optional `transform` (client-go's TransformFunc) is applied to every object before it is
  stored: a controller that reads a few fields of thousands of pods keeps only those.

`NamedInformers` caches single objects by name, each for as long as something references it
(the Secrets that Clusters name), so the process needs no right to list the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from slinky.background import BackgroundLoop, Backoff, cancelling
from slinky.kube import rest
from slinky.kube.store import IndexFunc, Store, key_of
from slinky.types import JSON

log = logging.getLogger(__name__)

Transform = Callable[[JSON], JSON]


@dataclass
class Handler:
    """Callbacks for one subscriber. They run on the event loop and must not block:
    controllers use them only to enqueue keys."""

    on_add: Callable[[JSON], None] | None = None
    on_update: Callable[[JSON, JSON], None] | None = None
    on_delete: Callable[[JSON], None] | None = None


class WatchSilent(Exception):
    """The watch stream sent nothing, not even a bookmark, for too long."""


class Informer(BackgroundLoop):
    """Keeps `store` equal to the apiserver's view of one resource (and selector)."""

    def __init__(
        self,
        kube: rest.Kube,
        res: rest.Resource,
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        indexers: dict[str, IndexFunc] | None = None,
        page_size: int = 500,
        watch_timeout: float = 300.0,
        silence_timeout: float = 90.0,
        backoff: Backoff | None = None,
        transform: Transform | None = None,
    ) -> None:
        self.kube = kube
        self.res = res
        self.transform = transform
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.store = Store(indexers)
        self.page_size = page_size
        self.watch_timeout = watch_timeout
        self.silence_timeout = silence_timeout
        self.backoff = backoff or Backoff()
        self.resource_version = ""
        self.relists = 0
        self.reconnects = 0
        self.last_error: str | None = None  # why the last list or watch failed, until one works
        self._handlers: list[Handler] = []
        self._synced = asyncio.Event()

    def __repr__(self) -> str:
        scope = f" ns={self.namespace}" if self.namespace else ""
        if self.field_selector:
            scope += f" {self.field_selector}"
        return f"<Informer {self.res.plural}{scope} rv={self.resource_version}>"

    # ------------------------------------------------------------ subscribers

    def add_handler(self, handler: Handler) -> None:
        """Subscribe; if the store is already synced, the handler first sees every object
        as an add, so late subscribers start from the same picture."""
        self._handlers.append(handler)
        if self.has_synced and handler.on_add:
            for obj in self.store.objects():
                handler.on_add(obj)

    @property
    def has_synced(self) -> bool:
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        await self._synced.wait()

    # ------------------------------------------------------------ lifecycle

    def task_name(self) -> str:
        return f"informer {self.res.plural}"

    async def run(self) -> None:
        """List once, then watch forever; resume, re-list or back off as needed."""
        while True:
            try:
                if not self.resource_version:
                    await self._relist()
                await self._watch()
                self.backoff.reset()
            except rest.ApiError as e:
                if cancelling():
                    raise asyncio.CancelledError from e
                if e.gone:
                    log.info(
                        "%s: resourceVersion %s is gone; re-listing", self, self.resource_version
                    )
                    self.resource_version = ""
                    continue
                self.last_error = str(e)
                delay = self.backoff.next()
                log.warning("%s: %s; retrying in %.1fs", self, e, delay)
                await asyncio.sleep(delay)
            except WatchSilent:
                log.debug("%s: watch silent for %.0fs; reopening", self, self.silence_timeout)
            except (rest.TransportError, OSError, ValueError) as e:
                if cancelling():
                    raise asyncio.CancelledError from e
                self.last_error = f"connection problem: {e}"
                delay = self.backoff.next()
                log.warning("%s: connection problem (%s); retrying in %.1fs", self, e, delay)
                await asyncio.sleep(delay)
            self.reconnects += 1

    def _selectors(self) -> dict[str, Any]:
        return {"labelSelector": self.label_selector, "fieldSelector": self.field_selector}

    async def _relist(self) -> None:
        items: list[JSON] = []
        cont: str | None = None
        while True:
            page = await self.kube.list(
                self.res,
                self.namespace,
                params={"limit": self.page_size, "continue": cont, **self._selectors()},
            )
            items.extend(page["items"])
            meta = page.get("metadata") or {}
            cont = meta.get("continue") or None
            if not cont:
                break
        for obj in items:  # list items carry no kind/apiVersion; watch events do
            obj.setdefault("apiVersion", self.res.api_version)
            obj.setdefault("kind", self.res.kind)
        if self.transform is not None:
            items = [self.transform(obj) for obj in items]
        self._replace(items)
        self.resource_version = str(meta["resourceVersion"])
        self.relists += 1
        self.last_error = None
        self._synced.set()

    def _replace(self, items: list[JSON]) -> None:
        fresh = {key_of(o): o for o in items}
        for key in self.store.keys():
            if key not in fresh:
                gone = self.store.delete(key)
                if gone is not None:
                    self._dispatch_delete(gone)
        for obj in fresh.values():
            old = self.store.upsert(obj)
            if old is None:
                self._dispatch_add(obj)
            elif old["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                self._dispatch_update(old, obj)

    async def _watch(self) -> None:
        timeout = int(self.watch_timeout * random.uniform(1.0, 2.0))
        params = {
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": timeout,
            **self._selectors(),
        }
        stream = self.kube.watch(self.res, self.namespace, params=params).__aiter__()
        try:
            while True:
                try:
                    # Not asyncio.wait_for: on Python 3.11 it returns the event instead of
                    # raising when a stop() lands in the same loop turn as the event, and the
                    # informer would watch on, unstoppable.
                    async with asyncio.timeout(self.silence_timeout):
                        event = await stream.__anext__()
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise WatchSilent() from None
                self.backoff.reset()
                self.last_error = None
                self._on_event(event)
        finally:
            with contextlib.suppress(Exception):
                await stream.aclose()  # type: ignore[attr-defined]

    def _on_event(self, event: JSON) -> None:
        kind, obj = event["type"], event["object"]
        rv = obj.get("metadata", {}).get("resourceVersion")
        if kind == "BOOKMARK":
            if rv:
                self.resource_version = str(rv)
            return
        if self.transform is not None:
            obj = self.transform(obj)
        if kind in ("ADDED", "MODIFIED"):
            old = self.store.upsert(obj)
            if old is None:
                self._dispatch_add(obj)
            else:
                self._dispatch_update(old, obj)
        elif kind == "DELETED":
            self.store.delete(key_of(obj))
            self._dispatch_delete(obj)
        if rv:
            self.resource_version = str(rv)

    # ------------------------------------------------------------ dispatch

    def _dispatch_add(self, obj: JSON) -> None:
        for h in self._handlers:
            if h.on_add:
                self._safely(h.on_add, obj)

    def _dispatch_update(self, old: JSON, new: JSON) -> None:
        for h in self._handlers:
            if h.on_update:
                self._safely(h.on_update, old, new)

    def _dispatch_delete(self, obj: JSON) -> None:
        for h in self._handlers:
            if h.on_delete:
                self._safely(h.on_delete, obj)

    def _safely(self, fn: Callable[..., None], *args: JSON) -> None:
        try:
            fn(*args)
        except Exception:
            log.exception("%s: event handler failed for %s", self, key_of(args[-1]))


class MultiInformer:
    """Informers of one resource in several namespaces, read as one cache.

    Used when a process watches a list of namespaces (`--namespace a --namespace b`): one
    list+watch per namespace, one view for the controllers.
    """

    def __init__(self, informers: list[Informer]) -> None:
        self.informers = informers
        self._by_ns = {i.namespace: i for i in informers}

    def add_handler(self, handler: Handler) -> None:
        for i in self.informers:
            i.add_handler(handler)

    def add_indexer(self, name: str, fn: IndexFunc) -> None:
        for i in self.informers:
            i.store.add_indexer(name, fn)

    @property
    def has_synced(self) -> bool:
        return all(i.has_synced for i in self.informers)

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.wait_synced() for i in self.informers))

    def get(self, key: str) -> JSON | None:
        ns, _, _ = key.partition("/")
        inf = self._by_ns.get(ns) or self._by_ns.get(None)
        return inf.store.get(key) if inf else None

    def by_index(self, index: str, value: str) -> list[JSON]:
        return [o for i in self.informers for o in i.store.by_index(index, value)]

    def objects(self) -> list[JSON]:
        return [o for i in self.informers for o in i.store.objects()]

    def __len__(self) -> int:
        return sum(len(i.store) for i in self.informers)


class NotSynced(Exception):
    """The object's informer has not listed it yet; `error` says why, if listing failed."""

    def __init__(self, key: str, error: str | None) -> None:
        super().__init__(f"{key}: {error or 'not listed yet'}")
        self.key = key
        self.error = error


class NamedInformers:
    """One single-object informer (`fieldSelector=metadata.name=<name>`) per `namespace/name`
    that some referrer names: started with the first reference, stopped with the last.

    The cache then holds exactly the referenced objects, and RBAC can grant them per namespace
    or per name: the apiserver authorizes a list or watch whose field selector fixes
    `metadata.name` as a request for that name, so a Role's `resourceNames` covers it.
    """

    def __init__(self, kube: rest.Kube, res: rest.Resource, **options: Any) -> None:
        self.kube = kube
        self.res = res
        self.options = options
        self._informers: dict[str, Informer] = {}
        self._referrers: dict[str, set[str]] = {}  # object key -> who references it
        self._held: dict[str, set[str]] = {}  # referrer -> object keys it references
        self._handlers: list[Handler] = []
        self._running = False
        self._stopping: set[asyncio.Task[None]] = set()

    def hold(self, referrer: str, keys: Iterable[str]) -> None:
        """`referrer` now references exactly `keys` (none: it let go of everything)."""
        new = set(keys)
        old = self._held.pop(referrer, set())
        if new:
            self._held[referrer] = new
        for key in new - old:
            self._referrers.setdefault(key, set()).add(referrer)
            if key not in self._informers:
                self._informers[key] = self._make(key)
        for key in old - new:
            referrers = self._referrers[key]
            referrers.discard(referrer)
            if not referrers:
                del self._referrers[key]
                self._drop(self._informers.pop(key))

    def _make(self, key: str) -> Informer:
        namespace, _, name = key.rpartition("/")
        inf = Informer(
            self.kube,
            self.res,
            namespace=namespace or None,
            field_selector=f"metadata.name={name}",
            **self.options,
        )
        for handler in self._handlers:
            inf.add_handler(handler)
        if self._running:
            inf.start()
        return inf

    def _drop(self, inf: Informer) -> None:
        if not inf.started:
            return
        # Called from event handlers, which must not block: the stop finishes on its own.
        task = asyncio.create_task(inf.stop(), name=f"stop {inf.task_name()}")
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    def get(self, key: str) -> JSON | None:
        """The object, or None if it does not exist; NotSynced while its informer has not
        listed it (or nothing references it)."""
        inf = self._informers.get(key)
        if inf is None or not inf.has_synced:
            raise NotSynced(key, inf.last_error if inf else None)
        return inf.store.get(key)

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)
        for inf in self._informers.values():
            inf.add_handler(handler)

    async def wait_synced(self) -> None:
        """Nothing to wait for: each object's informer syncs on its own, and `get` says
        whether it has. (One unreadable Secret must not hold up every other Cluster.)"""

    @property
    def informers(self) -> list[Informer]:
        return list(self._informers.values())

    def start(self) -> None:
        self._running = True
        for inf in self._informers.values():
            inf.start()

    async def stop(self) -> None:
        self._running = False
        await asyncio.gather(*self._stopping, *(i.stop() for i in self._informers.values()))


class InformerFactory:
    """One informer per (resource, namespace, selectors), shared by every controller of a
    process: a second controller asking for pods gets the same cache, not a second watch.
    `namespaces=None` watches all namespaces; otherwise one informer per listed namespace."""

    def __init__(
        self,
        kube: rest.Kube,
        *,
        namespace: str | None = None,
        namespaces: list[str] | None = None,
        **options: Any,
    ) -> None:
        self.kube = kube
        self.namespaces: list[str | None] = [None]
        if namespaces:
            self.namespaces = list(namespaces)
        elif namespace:
            self.namespaces = [namespace]
        self.namespace = self.namespaces[0]
        self.options = options
        self._informers: dict[tuple[str, str | None, str | None, str | None], Informer] = {}
        self._named: dict[str, NamedInformers] = {}

    def informer(
        self,
        res: rest.Resource,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        indexers: dict[str, IndexFunc] | None = None,
        namespace: str | None = None,
        transform: Transform | None = None,
    ) -> Informer:
        """The informer for `res` in `namespace` (default: the factory's first namespace).
        Every caller of the same informer must ask for the same `transform`."""
        ns = (namespace if namespace is not None else self.namespace) if res.namespaced else None
        key = (f"{res.api_version}/{res.plural}", ns, label_selector, field_selector)
        inf = self._informers.get(key)
        if inf is None:
            inf = Informer(
                self.kube,
                res,
                namespace=ns,
                label_selector=label_selector,
                field_selector=field_selector,
                transform=transform,
                **self.options,
            )
            self._informers[key] = inf
        elif inf.transform is not transform:
            raise ValueError(f"{inf}: already shared with another transform")
        for name, fn in (indexers or {}).items():
            inf.store.add_indexer(name, fn)
        return inf

    def shared(
        self,
        res: rest.Resource,
        *,
        label_selector: str | None = None,
        indexers: dict[str, IndexFunc] | None = None,
        transform: Transform | None = None,
    ) -> MultiInformer:
        """The informers for `res` across every namespace this factory watches."""
        namespaces = self.namespaces if res.namespaced else [None]
        return MultiInformer([
            self.informer(
                res,
                label_selector=label_selector,
                indexers=indexers,
                namespace=ns,
                transform=transform,
            )
            for ns in namespaces
        ])  # fmt: skip

    def named(self, res: rest.Resource) -> NamedInformers:
        """The by-name informers of `res`, whichever namespaces the factory watches: what is
        cached follows what the referrers name."""
        key = f"{res.api_version}/{res.plural}"
        named = self._named.get(key)
        if named is None:
            named = self._named[key] = NamedInformers(self.kube, res, **self.options)
        return named

    @property
    def informers(self) -> list[Informer]:
        """Every informer running now, by-name ones included."""
        named = [i for n in self._named.values() for i in n.informers]
        return [*self._informers.values(), *named]

    def start(self) -> None:
        for inf in self._informers.values():
            inf.start()
        for named in self._named.values():
            named.start()

    async def wait_synced(self) -> None:
        await asyncio.gather(*(i.wait_synced() for i in self._informers.values()))

    @property
    def has_synced(self) -> bool:
        """The shared caches synced. By-name informers do not count: one object the process
        may not read must not keep it unready."""
        return all(i.has_synced for i in self._informers.values())

    async def stop(self) -> None:
        await asyncio.gather(
            *(i.stop() for i in self._informers.values()),
            *(n.stop() for n in self._named.values()),
        )


class InformerObjects(Collector):
    """`slinky_informer_objects{resource, namespace}`: how many objects the caches hold (at
    scrape time), so what a process caches can be checked from outside."""

    def __init__(self, factory: InformerFactory) -> None:
        self.factory = factory

    def collect(self) -> Iterator[GaugeMetricFamily]:
        counts: dict[tuple[str, str], int] = {}
        for inf in self.factory.informers:
            labels = (inf.res.plural, inf.namespace or "")
            counts[labels] = counts.get(labels, 0) + len(inf.store)
        fam = GaugeMetricFamily(
            "slinky_informer_objects",
            "Objects held by the informer caches, by resource and namespace ('' for all)",
            labels=["resource", "namespace"],
        )
        for labels, n in sorted(counts.items()):
            fam.add_metric(list(labels), n)
        yield fam
