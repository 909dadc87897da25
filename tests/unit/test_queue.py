"""Work queue semantics (client-go's): dedup, no concurrent processing of a key, re-queue of
keys changed while processing, rate limiting, delayed adds, shutdown."""

from __future__ import annotations

import asyncio

from hypothesis import given, settings
from hypothesis import strategies as st

from slinky.kube.queue import BucketLimiter, ItemExponentialLimiter, RateLimiter, WorkQueue


async def test_key_is_queued_once_however_often_added() -> None:
    q = WorkQueue("t")
    for _ in range(5):
        q.add("a")
    q.add("b")
    assert len(q) == 2
    assert await q.get() == "a"
    assert await q.get() == "b"


async def test_key_added_while_processing_is_requeued_on_done() -> None:
    q = WorkQueue("t")
    q.add("a")
    key = await q.get()
    q.add("a")
    assert len(q) == 0, "must not be handed out while processing"
    q.done(key)  # type: ignore[arg-type]
    assert len(q) == 1
    assert await q.get() == "a"


async def test_add_after_keeps_earliest_time() -> None:
    q = WorkQueue("t")
    q.add_after("a", 10)
    q.add_after("a", 0.01)
    assert await asyncio.wait_for(q.get(), 2) == "a"


def test_item_backoff_doubles_from_5ms_to_1000s_and_forget_resets() -> None:
    lim = ItemExponentialLimiter()
    delays = [lim.when("k") for _ in range(20)]
    assert delays[:3] == [0.005, 0.01, 0.02]
    assert delays[-1] == 1000.0
    lim.forget("k")
    assert lim.when("k") == 0.005


def test_bucket_limits_overall_rate_after_burst() -> None:
    lim = BucketLimiter(rate=10, burst=5)
    delays = [lim.when("k") for _ in range(7)]
    assert delays[:5] == [0.0] * 5
    assert 0.05 < delays[5] <= 0.1 + 1e-3
    assert delays[6] > delays[5]


def test_rate_limiter_takes_the_larger_delay() -> None:
    lim = RateLimiter(bucket=BucketLimiter(rate=1, burst=1))
    assert lim.when("a") == 0.005
    assert lim.when("b") >= 0.9


async def test_shutdown_wakes_workers_and_drain_waits_for_in_flight() -> None:
    q = WorkQueue("t")
    waiter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.add("a")
    key = await waiter
    q.shutdown()
    assert await q.get() is None
    draining = asyncio.create_task(q.drain())
    await asyncio.sleep(0.01)
    assert not draining.done()
    q.done(key)  # type: ignore[arg-type]
    await asyncio.wait_for(draining, 1)


ops = st.lists(
    st.tuples(st.sampled_from(["add", "yield"]), st.sampled_from("abcd"), st.integers(0, 3)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, workers=st.integers(1, 4), work_yields=st.lists(st.integers(0, 3), min_size=1))
def test_property_never_concurrent_and_every_change_processed(
    ops: list[tuple[str, str, int]], workers: int, work_yields: list[int]
) -> None:
    async def scenario() -> None:
        q = WorkQueue("prop")
        clock = 0
        in_progress: set[str] = set()
        last_add: dict[str, int] = {}
        last_start: dict[str, int] = {}

        async def worker(i: int) -> None:
            nonlocal clock
            n = 0
            while True:
                key = await q.get()
                if key is None:
                    return
                assert key not in in_progress, f"{key} processed concurrently"
                in_progress.add(key)
                clock += 1
                last_start[key] = clock
                for _ in range(work_yields[(i + n) % len(work_yields)]):
                    await asyncio.sleep(0)
                n += 1
                in_progress.discard(key)
                q.done(key)

        tasks = [asyncio.create_task(worker(i)) for i in range(workers)]
        for op, key, k in ops:
            if op == "add":
                clock += 1
                last_add[key] = clock
                q.add(key)
            for _ in range(k):
                await asyncio.sleep(0)
        for _ in range(200):
            if len(q) == 0 and not in_progress:
                break
            await asyncio.sleep(0)
        for key, added in last_add.items():
            assert last_start.get(key, -1) > added, f"change to {key} never processed"
        q.shutdown()
        await asyncio.gather(*tasks)

    asyncio.run(scenario())
