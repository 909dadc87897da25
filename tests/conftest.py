"""Test order: the longest tests go first. pytest-xdist (`make test` runs three workers) hands
each worker a run of tests in collection order and lets an idle worker take the other's
rest; a long test collected last ran alone at the end while the other workers had nothing
left to do."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: item.get_closest_marker("longest") is None)
