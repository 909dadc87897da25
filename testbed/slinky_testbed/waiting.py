"""Wait for a condition with a deadline, instead of sleeping and hoping."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold before the deadline; says what was awaited and last seen."""


async def wait_for(
    check: Callable[[], Awaitable[T] | T],
    *,
    timeout: float,
    what: str,
    interval: float = 0.1,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll `check` until it returns a truthy value, and return that value.

    Raises WaitTimeout naming `what` and the last value (or error) seen. Exceptions of the
    types in `ignore` count as "not yet".
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = check()
            if inspect.isawaitable(value):
                value = await value
            if value:
                return value
            last = value
        except ignore as e:
            last = e
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout}s waiting for {what}; last: {last!r}")
        await asyncio.sleep(interval)
