"""When the scheduler asks Slurm to allocate a placeholder job inside the request."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from slinky.bridge.scheduler.immediate import Claims, looks_free, worth_allocating
from slinky.slurm.models import Node

JSON = dict[str, Any]


def node(
    name: str,
    state: list[str],
    *,
    cpus: int = 8,
    alloc: int = 0,
    mem: int = 4096,
    alloc_mem: int = 0,
) -> Node:
    return Node.parse(
        {
            "name": name,
            "state": state,
            "cpus": cpus,
            "alloc_cpus": alloc,
            "real_memory": mem,
            "alloc_memory": alloc_mem,
        }
    )


def desc(*, cpus: int = 1, mem: int = 100, exclusive: bool = True, nodes: int = 1) -> JSON:
    d: JSON = {
        "cpus_per_task": cpus,
        "tasks_per_node": 1,
        "memory_per_node": {"set": True, "number": mem},
        "minimum_nodes": nodes,
    }
    if exclusive:
        d["shared"] = ["none"]
    return d


@pytest.mark.parametrize(
    "state",
    [
        ["IDLE", "DRAIN"],
        ["IDLE", "RESERVED"],
        ["IDLE", "NOT_RESPONDING"],
        ["IDLE", "POWERED_DOWN"],
        ["IDLE", "COMPLETING"],
        ["IDLE", "MAINTENANCE"],
        ["DOWN"],
        ["ALLOCATED"],
        ["UNKNOWN"],
    ],
)
def test_a_node_slurm_would_not_start_a_job_on_never_looks_free(state: list[str]) -> None:
    assert not looks_free(node("a", state), cpus=1, memory=1, exclusive=False)


def test_an_idle_external_node_looks_free() -> None:
    n = node("a", ["IDLE", "EXTERNAL", "DYNAMIC_NORM"])
    assert looks_free(n, cpus=8, memory=4096, exclusive=True)


def test_an_exclusive_job_needs_a_node_with_nothing_allocated_and_enough_of_it() -> None:
    assert not looks_free(node("a", ["MIXED"], alloc=1), cpus=1, memory=1, exclusive=True)
    assert not looks_free(node("a", ["IDLE"], cpus=4), cpus=64, memory=1, exclusive=True)
    assert not looks_free(node("a", ["IDLE"], mem=100), cpus=1, memory=101, exclusive=True)


def test_a_shared_job_needs_the_cpus_and_memory_it_asks_for_unallocated() -> None:
    n = node("a", ["MIXED"], cpus=8, alloc=6, mem=4096, alloc_mem=4000)
    assert looks_free(n, cpus=2, memory=96, exclusive=False)
    assert not looks_free(n, cpus=3, memory=96, exclusive=False)
    assert not looks_free(n, cpus=2, memory=97, exclusive=False)


def test_only_allowed_nodes_count_and_a_group_needs_one_free_node_per_pod() -> None:
    nodes = {
        "a": node("a", ["IDLE"]),
        "b": node("b", ["IDLE"]),
        "c": node("c", ["ALLOCATED"], alloc=8),
    }
    assert worth_allocating(desc(), ["a"], nodes)
    assert not worth_allocating(desc(), ["c"], nodes)
    assert not worth_allocating(desc(), ["missing"], nodes)
    assert worth_allocating(desc(nodes=2), ["a", "b", "c"], nodes)
    assert not worth_allocating(desc(nodes=3), ["a", "b", "c"], nodes)
    assert not worth_allocating(desc(), [], nodes)


def test_claims_take_what_our_allocations_took_until_a_later_poll_shows_it() -> None:
    nodes = {"a": node("a", ["IDLE"], cpus=8, mem=4096), "b": node("b", ["IDLE"])}
    claims = Claims(min_age=0)
    claims.add(desc(cpus=2, mem=1000, exclusive=False), ["a"], mark=5)
    claims.add(desc(cpus=2, mem=1000, exclusive=False), ["a"], mark=5)
    taken = claims.overlay(nodes, lambda mark: False)
    assert set(taken) == {"a"}
    assert (taken["a"].state.base, taken["a"].alloc_cpus, taken["a"].alloc_memory) == (
        "MIXED",
        4,
        2000,
    )
    assert worth_allocating(desc(cpus=4, exclusive=False), ["a"], nodes, taken)
    assert not worth_allocating(desc(cpus=5, exclusive=False), ["a"], nodes, taken)
    assert not worth_allocating(desc(), ["a"], nodes, taken)  # exclusive: a is in use
    claims.add(desc(), ["b"], mark=6)
    taken = claims.overlay(nodes, lambda mark: mark <= 5)  # a poll after mark 5 came
    assert set(taken) == {"b"}
    assert taken["b"].state.base == "ALLOCATED"
    assert claims.overlay(nodes, lambda mark: True) == {}
    assert claims.claims == []


def test_allocations_answered_but_not_read_back_take_their_share_of_the_free_nodes() -> None:
    nodes = {"a": node("a", ["IDLE"], cpus=8), "b": node("b", ["IDLE"], cpus=8)}
    claims = Claims()
    first = claims.start(desc())  # exclusive, its node unknown yet
    flying = list(claims.in_flight.values())
    assert worth_allocating(desc(), ["a", "b"], nodes, {}, flying)  # one node left
    claims.start(desc())
    flying = list(claims.in_flight.values())
    assert not worth_allocating(desc(), ["a", "b"], nodes, {}, flying)  # both taken
    assert not worth_allocating(desc(exclusive=False), ["a", "b"], nodes, {}, flying)
    claims.finish(first, desc(), ["a"], mark=1)
    assert len(claims.in_flight) == 1 and claims.claims[0].node == "a"
    # Shared jobs in flight take CPUs, not whole nodes.
    shared = Claims()
    for _ in range(3):
        shared.start(desc(cpus=5, exclusive=False))
    flying = list(shared.in_flight.values())
    assert worth_allocating(desc(cpus=1, exclusive=False), ["a", "b"], nodes, {}, flying)
    assert not worth_allocating(desc(cpus=2, exclusive=False), ["a", "b"], nodes, {}, flying)


def test_a_claim_outlives_a_later_poll_for_a_second_and_more() -> None:
    """A poll in the same second as the allocation can answer "no change" (update_time is
    in whole seconds): the claim stays for CLAIM_MIN_S whatever the polls say."""
    nodes = {"a": node("a", ["IDLE"])}
    claims = Claims()
    claims.add(desc(), ["a"], mark=1)
    assert set(claims.overlay(nodes, lambda mark: True)) == {"a"}
    claims.claims[0] = dataclasses.replace(claims.claims[0], at=-1e9)  # long ago
    assert claims.overlay(nodes, lambda mark: True) == {}


def test_a_burst_of_claims_on_one_node_sums_to_what_they_took_capped_at_the_node() -> None:
    nodes = {
        "a": node("a", ["MIXED"], cpus=32, alloc=4, mem=65536, alloc_mem=1000),
        "b": node("b", ["IDLE"], cpus=8),
    }
    claims = Claims(min_age=0)
    for _ in range(20):
        claims.add(desc(cpus=1, mem=64, exclusive=False), ["a"], mark=1)
    taken = claims.overlay(nodes, lambda mark: False)
    assert (taken["a"].state.base, taken["a"].alloc_cpus, taken["a"].alloc_memory) == (
        "MIXED",
        24,
        1000 + 20 * 64,
    )
    for _ in range(20):  # 44 CPUs asked on a node of 32: full, never more
        claims.add(desc(cpus=1, mem=64, exclusive=False), ["a"], mark=1)
    claims.add(desc(cpus=1, exclusive=False), ["b"], mark=1)
    claims.add(desc(cpus=1), ["b"], mark=1)  # an exclusive one takes the whole node
    taken = claims.overlay(nodes, lambda mark: False)
    assert (taken["a"].state.base, taken["a"].alloc_cpus) == ("ALLOCATED", 32)
    assert (taken["b"].state.base, taken["b"].alloc_cpus) == ("ALLOCATED", 8)
