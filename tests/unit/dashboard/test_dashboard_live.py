"""The live stream's fan-out: one computation a poll whatever the number of streams, the messages the
page reads, caps per key and in all, and no stream counted that is not open."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from clawr1.dashboard.live import KEEPALIVE, LiveBusy, LiveFeed, LiveLimits, sse
from clawr1.pool.store import PoolError
from tests.support.waiting import holds_for_async, wait_until_async


class Pool:
    """A pulse source: counts its computations and answers what it is told to."""

    def __init__(self) -> None:
        self.calls = 0
        self.answer: Any = {"steps": 1}

    def pulse(self) -> Any:
        self.calls += 1
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


async def take(stream: AsyncIterator[bytes], count: int) -> list[bytes]:
    return [await anext(stream) for _ in range(count)]


def test_one_computation_a_poll_for_every_stream() -> None:
    async def main() -> None:
        pool = Pool()
        feed = LiveFeed(pool.pulse, LiveLimits(per_key=100, max_streams=100), poll_s=0.05, keepalive_s=0.3)
        streams = [feed.subscribe(f"key-{i % 3}") for i in range(60)]
        firsts = await asyncio.gather(*(take(s, 1) for s in streams))
        assert all(first == [sse("pulse", {"steps": 1})] for first in firsts)
        await holds_for_async(lambda: pool.calls <= 12, 0.5,
                              message=lambda: f"{pool.calls} pulse computations for 60 streams in ~10 polls")
        pool.answer = {"steps": 2}
        changed = await asyncio.gather(*(take(s, 1) for s in streams))
        assert changed == [[sse("pulse", {"steps": 2})]] * 60
        for stream in streams:
            await stream.aclose()  # type: ignore[attr-defined]
        await wait_until_async(lambda: not feed.open_streams and feed._task is not None and feed._task.done(),
                               5, message="the feed stopping once its last stream closed")

    asyncio.run(main())


def test_problems_and_keep_alives_reach_every_stream() -> None:
    async def main() -> None:
        pool = Pool()
        pool.answer = PoolError("pool gone")
        feed = LiveFeed(pool.pulse, poll_s=10, keepalive_s=0.1)
        stream = feed.subscribe("k")
        assert await take(stream, 2) == [sse("problem", {"message": "the pool could not answer: pool gone"}),
                                         KEEPALIVE]
        await feed.close()

    asyncio.run(main())


def test_caps_per_key_and_in_all_and_no_leak() -> None:
    async def main() -> None:
        feed = LiveFeed(Pool().pulse, LiveLimits(per_key=2, max_streams=3), poll_s=0.05)
        a1, a2 = feed.subscribe("a"), feed.subscribe("a")
        with pytest.raises(LiveBusy, match="CLAWR1_DASHBOARD_LIVE_PER_KEY"):
            feed.subscribe("a")
        b1 = feed.subscribe("b")
        with pytest.raises(LiveBusy, match="CLAWR1_DASHBOARD_LIVE_STREAMS"):
            feed.subscribe("c")
        await a1.aclose()  # type: ignore[attr-defined]
        del a2  # a stream dropped before anything was read from it (its client left at once)
        assert feed.open_streams == 1
        feed.subscribe("a"), feed.subscribe("c")
        del b1
        await feed.close()

    asyncio.run(main())
