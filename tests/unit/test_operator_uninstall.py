"""The operator's uninstall hook waits for Clusters and NodeSets being deleted (the operator
takes its finalizer off them) and names those left in place."""

from __future__ import annotations

from typing import Any

import pytest

from slinky.operator import uninstall
from slinky.operator.resources import CLUSTERS, FINALIZER, NODESETS

JSON = dict[str, Any]


def obj(name: str, *, deleting: bool = False, ours: bool = True) -> JSON:
    meta: JSON = {"name": name, "namespace": "ns", "finalizers": [FINALIZER] if ours else []}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-26T00:00:00Z"
    return {"metadata": meta}


class FakeKube:
    """Lists what `states` holds, one state per poll (the last one repeats)."""

    def __init__(self, states: list[dict[str, list[JSON]]]) -> None:
        self.states = states
        self.polls = 0

    async def list(self, res: Any, *_a: Any, **_k: Any) -> JSON:
        state = self.states[min(self.polls // 3, len(self.states) - 1)]
        self.polls += 1
        return {"items": state.get(res.plural, [])}


async def test_waits_for_those_being_deleted_and_names_those_left(
    capsys: pytest.CaptureFixture[str],
) -> None:
    kube = FakeKube(
        [
            {NODESETS.plural: [obj("a", deleting=True)], CLUSTERS.plural: [obj("c")]},
            {NODESETS.plural: [], CLUSTERS.plural: [obj("c"), obj("x", ours=False)]},
        ]
    )
    assert await uninstall.run(kube, timeout=60, interval=0) == 0  # type: ignore[arg-type]
    out = capsys.readouterr().out
    assert "waiting for the operator to finish: NodeSet ns/a" in out
    assert "left in place with the operator's finalizer" in out and "Cluster ns/c" in out
    assert "ns/x" not in out


async def test_gives_up_at_the_timeout_saying_what_still_drains(
    capsys: pytest.CaptureFixture[str],
) -> None:
    kube = FakeKube([{NODESETS.plural: [obj("a", deleting=True)]}])
    ticks = iter(range(0, 1000, 10))
    code = await uninstall.run(
        kube,  # type: ignore[arg-type]
        timeout=25,
        interval=0,
        clock=lambda: next(ticks),
    )
    assert code == 1
    assert "still being deleted after 25s" in capsys.readouterr().out


async def test_an_object_in_a_namespace_being_deleted_is_waited_for(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The namespace was deleted just before the uninstall; the namespace controller has not
    deleted the NodeSet yet when the hook looks: it is waited for all the same."""
    ending = {"metadata": {"name": "ns", "deletionTimestamp": "2026-11-26T00:00:00Z"}}
    kube = FakeKube(
        [
            {"namespaces": [ending], NODESETS.plural: [obj("a")]},
            {"namespaces": [], NODESETS.plural: []},
        ]
    )
    assert await uninstall.run(kube, timeout=60, interval=0) == 0  # type: ignore[arg-type]
    assert "waiting for the operator to finish: NodeSet ns/a" in capsys.readouterr().out
