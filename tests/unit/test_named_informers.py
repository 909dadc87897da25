"""By-name informers: a Secret is cached from the first Cluster that names it to the last, and
only by name (the apiserver is never asked for all Secrets)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

import pytest

from slinky.kube import rest
from slinky.kube.informer import Handler, Informer, InformerFactory, NamedInformers, NotSynced
from slinky.operator.cluster.controller import secrets_of_cluster, secrets_to_cache
from slinky_testbed.waiting import wait_for

JSON = dict[str, Any]


class FakeKube:
    """Answers a by-name list from `objects` and keeps every watch open and silent."""

    def __init__(self, *objects: JSON) -> None:
        self.objects = {f"{o['metadata']['namespace']}/{o['metadata']['name']}": o for o in objects}
        self.lists: list[tuple[str | None, str | None]] = []
        self.watching: set[str] = set()
        self.forbidden: set[str] = set()
        self.bookmark = asyncio.Event()  # set: every open watch sends one bookmark

    async def list(self, res: rest.Resource, namespace: str | None, *, params: JSON) -> JSON:
        selector = params.get("fieldSelector")
        self.lists.append((namespace, selector))
        name = str(selector).removeprefix("metadata.name=")
        key = f"{namespace}/{name}"
        if key in self.forbidden:
            raise rest.ApiError(403, "Forbidden", f'secrets "{name}" is forbidden')
        items = [self.objects[key]] if key in self.objects else []
        return {"items": items, "metadata": {"resourceVersion": "1"}}

    async def watch(
        self, res: rest.Resource, namespace: str | None, *, params: JSON
    ) -> AsyncIterator[JSON]:
        key = f"{namespace}/{str(params['fieldSelector']).removeprefix('metadata.name=')}"
        self.watching.add(key)
        try:
            while True:
                await self.bookmark.wait()
                self.bookmark.clear()
                yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "2"}}}
        finally:
            self.watching.discard(key)


def secret(ns: str, name: str) -> JSON:
    return {"metadata": {"namespace": ns, "name": name, "resourceVersion": "1"}, "data": {}}


def scopes(named: NamedInformers) -> set[tuple[str | None, str | None]]:
    return {(i.namespace, i.field_selector) for i in named.informers}


def test_a_secret_is_cached_from_the_first_reference_to_the_last() -> None:
    named = NamedInformers(cast(rest.Kube, FakeKube()), rest.SECRETS)
    named.hold("a/c1", ["a/tok"])
    named.hold("a/c2", ["a/tok", "a/jwt"])
    assert scopes(named) == {("a", "metadata.name=tok"), ("a", "metadata.name=jwt")}
    named.hold("a/c1", [])
    assert len(named.informers) == 2, "c2 still names both"
    named.hold("a/c2", ["a/jwt"])  # c2 moved off tok: nobody names it now
    assert scopes(named) == {("a", "metadata.name=jwt")}
    named.hold("a/c2", ())
    assert named.informers == []


def test_holding_the_same_references_again_keeps_the_same_informer() -> None:
    named = NamedInformers(cast(rest.Kube, FakeKube()), rest.SECRETS)
    named.hold("a/c", ["a/tok"])
    first = named.informers[0]
    named.hold("a/c", ["a/tok"])
    assert named.informers == [first]


def test_same_name_in_two_namespaces_is_two_objects() -> None:
    named = NamedInformers(cast(rest.Kube, FakeKube()), rest.SECRETS)
    named.hold("a/c", ["a/tok"])
    named.hold("b/c", ["b/tok"])
    assert scopes(named) == {("a", "metadata.name=tok"), ("b", "metadata.name=tok")}
    named.hold("a/c", ())
    assert scopes(named) == {("b", "metadata.name=tok")}


def test_a_secret_not_listed_yet_is_not_reported_missing() -> None:
    named = NamedInformers(cast(rest.Kube, FakeKube()), rest.SECRETS)
    with pytest.raises(NotSynced) as e:
        named.get("a/tok")
    assert e.value.error is None
    named.hold("a/c", ["a/tok"])
    with pytest.raises(NotSynced):
        named.get("a/tok")


def test_a_cluster_names_its_token_and_its_jwt_key_secret() -> None:
    obj = {
        "metadata": {"namespace": "a", "name": "c"},
        "spec": {"token": {"secretRef": "tok"}, "jwtKeyRef": {"name": "jwt"}},
    }
    assert secrets_of_cluster(obj) == ["a/tok", "a/jwt"]
    assert secrets_to_cache(obj) == ["a/tok", "a/jwt"]
    assert secrets_of_cluster({"metadata": {"namespace": "a", "name": "c"}, "spec": {}}) == []


def test_a_cluster_being_deleted_keeps_no_secret_cached() -> None:
    obj = {
        "metadata": {"namespace": "a", "name": "c", "deletionTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"token": {"secretRef": "tok"}},
    }
    assert secrets_to_cache(obj) == [], "its finalizer needs no credentials"


async def test_running_informers_list_and_watch_by_name_and_stop_with_the_last_reference() -> None:
    kube = FakeKube(secret("a", "tok"), secret("a", "other"))
    factory = InformerFactory(cast(rest.Kube, kube))
    named = factory.named(rest.SECRETS)
    seen: list[str] = []
    named.add_handler(Handler(on_add=lambda o: seen.append(o["metadata"]["name"])))
    named.hold("a/c", ["a/tok", "a/absent"])
    factory.start()

    async def synced() -> bool:
        return all(i.has_synced for i in named.informers) and len(kube.watching) == 2

    await wait_for(synced, timeout=5, interval=0.01, what="both listed and watched")
    assert (named.get("a/tok") or {})["metadata"]["name"] == "tok"
    assert named.get("a/absent") is None, "listed and absent: a definite answer"
    assert seen == ["tok"]
    assert sorted(kube.lists) == [("a", "metadata.name=absent"), ("a", "metadata.name=tok")]
    assert factory.has_synced, "by-name informers do not hold up readiness"

    named.hold("a/c", ["a/absent"])

    async def tok_watch_closed() -> bool:
        return kube.watching == {"a/absent"}

    await wait_for(tok_watch_closed, timeout=5, interval=0.01, what="tok's watch closed")
    with pytest.raises(NotSynced):
        named.get("a/tok")
    await factory.stop()
    assert kube.watching == set()


async def test_a_forbidden_secret_says_why_and_keeps_retrying() -> None:
    kube = FakeKube(secret("a", "tok"))
    kube.forbidden.add("a/tok")
    named = NamedInformers(cast(rest.Kube, kube), rest.SECRETS)
    named.hold("a/c", ["a/tok"])
    named.start()

    def error() -> str | None:
        try:
            named.get("a/tok")
        except NotSynced as e:
            return e.error
        return None

    async def forbidden() -> bool:
        return "403" in (error() or "")

    await wait_for(forbidden, timeout=5, interval=0.01, what="the 403 reported")
    kube.forbidden.clear()  # the admin grants it

    async def readable() -> bool:
        try:
            return named.get("a/tok") is not None
        except NotSynced:
            return False

    await wait_for(readable, timeout=10, interval=0.02, what="read once granted")
    await named.stop()


async def test_an_informer_stopped_just_as_an_event_arrives_stops() -> None:
    # When the Secret and its last Cluster go together (a namespace deleted), the watch event
    # and the stop land in the same loop turn; the stop must not be swallowed.
    kube = FakeKube(secret("a", "tok"))
    inf = Informer(
        cast(rest.Kube, kube), rest.SECRETS, namespace="a", field_selector="metadata.name=tok"
    )
    inf.start()

    async def watching() -> bool:
        return kube.watching == {"a/tok"}

    await wait_for(watching, timeout=5, interval=0.01, what="watching")
    kube.bookmark.set()
    stopping = asyncio.create_task(inf.stop())
    done, _ = await asyncio.wait([stopping], timeout=5)  # never cancels what it waits for
    assert done, "the informer kept watching after it was stopped"
    assert kube.watching == set()
