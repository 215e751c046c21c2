"""The live stream's server side: one pulse computation fanned out to every open stream, and caps.

One task computes the pulse once per ``poll_s`` while any stream is open and hands it to each stream's
queue, so open streams cost the pool one query a second however many there are (a query per stream, 150
streams of one key took trainer SQL from 15 ms to 13-14 s). A stream gets the latest pulse at once, then
each change, a ``problem`` event when the pool cannot answer, and a keep-alive comment after ``keepalive_s``
of quiet (the messages the page reads, unchanged). A key opens at most ``per_key`` streams and all keys
``max_streams``; beyond, ``LiveBusy``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from fastapi.concurrency import run_in_threadpool

from clawr1.core.registry import DASHBOARD_LIVE_PER_KEY, DASHBOARD_LIVE_STREAMS
from clawr1.core.settings import Settings, config_from, setting_field
from clawr1.pool.store import PoolError

POLL_S = 1.0
KEEPALIVE_S = 15.0
KEEPALIVE = b": keep-alive\n\n"
# Only the newest pulse matters: a stream that reads slowly skips the ones it missed.
_QUEUED = 4


def sse(event: str, data: Any) -> bytes:
    """One Server-Sent Event."""
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class LiveBusy(RuntimeError):
    """Too many live streams (HTTP 429); the message says which cap."""


@dataclass(frozen=True)
class LiveLimits:
    per_key: int = setting_field(DASHBOARD_LIVE_PER_KEY)
    max_streams: int = setting_field(DASHBOARD_LIVE_STREAMS)

    @classmethod
    def from_settings(cls, settings: Settings) -> LiveLimits:
        return config_from(cls, settings)


class LiveFeed:
    """``compute`` (a blocking pool read) run by one task while streams are open, its answers fanned out."""

    def __init__(self, compute: Callable[[], Any], limits: LiveLimits = LiveLimits(), poll_s: float = POLL_S,
                 keepalive_s: float = KEEPALIVE_S) -> None:
        self._compute = compute
        self.limits = limits
        self._poll_s = poll_s
        self._keepalive_s = keepalive_s
        self._queues: dict[int, asyncio.Queue[bytes]] = {}
        self._keys: Counter[str] = Counter()
        self._latest: bytes | None = None
        self._task: asyncio.Task[None] | None = None
        self.computations = 0

    def subscribe(self, key: str) -> AsyncIterator[bytes]:
        """A new stream for ``key``'s caller, counted from now; ``LiveBusy`` past a cap."""
        if self._keys[key] >= self.limits.per_key:
            raise LiveBusy(f"the key {key!r} has {self._keys[key]} live streams open, its cap "
                           f"(CLAWR1_DASHBOARD_LIVE_PER_KEY); close one first")
        if len(self._queues) >= self.limits.max_streams:
            raise LiveBusy(f"{len(self._queues)} live streams are open, the cap "
                           "(CLAWR1_DASHBOARD_LIVE_STREAMS); retry later")
        stream = _Stream(self, key, self._keepalive_s)
        self._queues[id(stream)] = stream.queue
        self._keys[key] += 1
        if self._latest is not None:
            stream.queue.put_nowait(self._latest)
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="dashboard-live")
        return stream

    def _leave(self, stream: _Stream) -> None:
        del self._queues[id(stream)]
        self._keys[stream.key] -= 1
        if not self._keys[stream.key]:
            del self._keys[stream.key]

    async def _run(self) -> None:
        """Compute and fan out while any stream is open; a pulse goes out only when it changed."""
        last: Any = None
        while self._queues:
            self.computations += 1
            try:
                pulse = await run_in_threadpool(self._compute)
            except PoolError as exc:
                self._send(sse("problem", {"message": f"the pool could not answer: {exc}"}))
            else:
                if pulse != last:
                    last = pulse
                    self._latest = sse("pulse", pulse)
                    self._send(self._latest)
            await asyncio.sleep(self._poll_s)
        self._latest = None  # nobody was watching: the next stream starts from a fresh computation

    def _send(self, message: bytes) -> None:
        for queue in list(self._queues.values()):
            if queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()
            queue.put_nowait(message)

    @property
    def open_streams(self) -> int:
        return len(self._queues)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


class _Stream:
    """One open stream: its queue's messages, or a keep-alive after a quiet while. It leaves the feed when
    it ends, fails, is cancelled (the client left) or is dropped unread (a client gone before its first
    byte), so no stream is ever counted that is not open."""

    def __init__(self, feed: LiveFeed, key: str, keepalive_s: float) -> None:
        self.key = key
        self.queue: asyncio.Queue[bytes] = asyncio.Queue(_QUEUED)
        self._feed: LiveFeed | None = feed
        self._keepalive_s = keepalive_s

    def __aiter__(self) -> _Stream:
        return self

    async def __anext__(self) -> bytes:
        if self._feed is None:
            raise StopAsyncIteration
        try:
            return await asyncio.wait_for(self.queue.get(), self._keepalive_s)
        except TimeoutError:
            return KEEPALIVE
        except BaseException:
            self.leave()
            raise

    async def aclose(self) -> None:
        self.leave()

    def leave(self) -> None:
        if self._feed is not None:
            feed, self._feed = self._feed, None
            feed._leave(self)

    def __del__(self) -> None:
        self.leave()
