from __future__ import annotations

import pytest

from slinky_testbed.waiting import WaitTimeout, wait_for


async def test_wait_for_returns_first_truthy_value() -> None:
    calls = iter([0, None, "ok"])
    assert await wait_for(lambda: next(calls), timeout=5, interval=0, what="x") == "ok"


async def test_wait_for_times_out_naming_what_and_last_value() -> None:
    with pytest.raises(WaitTimeout, match="the thing; last: 0"):
        await wait_for(lambda: 0, timeout=0.05, interval=0.01, what="the thing")
