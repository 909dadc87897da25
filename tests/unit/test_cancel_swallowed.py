"""A loop stops when asked even if a library it awaits turns the cancellation into an error
of its own (an HTTP read error, say) that the loop would otherwise retry for ever."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2

from slinky.background import BackgroundLoop
from slinky.kube import rest
from slinky.kube.informer import Informer


class SwallowingLoop(BackgroundLoop):
    def __init__(self) -> None:
        self.running = asyncio.Event()

    async def run(self) -> None:
        self.running.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            raise OSError("read error") from None


async def test_a_supervised_loop_whose_cancellation_became_an_error_stops() -> None:
    loop = SwallowingLoop()
    loop.start()
    await loop.running.wait()
    await asyncio.wait_for(loop.stop(), 5)
    assert loop.restarts == 0


class WatchKube:
    """An apiserver whose watch stream turns cancellation into an HTTP read error."""

    def __init__(self) -> None:
        self.watching = asyncio.Event()

    async def list(self, *_a: Any, **_k: Any) -> dict[str, Any]:
        return {"items": [], "metadata": {"resourceVersion": "1"}}

    def watch(self, *_a: Any, **_k: Any) -> AsyncIterator[dict[str, Any]]:
        async def events() -> AsyncIterator[dict[str, Any]]:
            self.watching.set()
            try:
                await asyncio.sleep(60)
            except asyncio.CancelledError:
                raise httpx2.ReadError("stream closed") from None
            yield {}

        return events()


async def test_an_informer_whose_watch_turns_cancellation_into_a_read_error_stops() -> None:
    kube = WatchKube()
    informer = Informer(kube, rest.PODS, namespace="ns")  # type: ignore[arg-type]
    informer.start()
    await kube.watching.wait()
    await asyncio.wait_for(informer.stop(), 5)


class DeafLoop(BackgroundLoop):
    """A loop stuck in a call that ignores cancellation altogether."""

    stop_timeout = 0.5

    def __init__(self) -> None:
        self.running = asyncio.Event()
        self.release = asyncio.Event()

    async def run(self) -> None:
        self.running.set()
        while not self.release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await self.release.wait()


async def test_stop_gives_up_on_a_loop_that_ignores_cancellation() -> None:
    loop = DeafLoop()
    loop.start()
    await loop.running.wait()
    await asyncio.wait_for(loop.stop(), 5)  # returns: whatever runs after it can stop too
    loop.release.set()
