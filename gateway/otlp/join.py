"""Log events waiting for their span, and spans waiting (briefly) for their log events.

An exporter sends a call's span to ``/v1/traces`` and, when content travels as log events, its
messages to ``/v1/logs``, in two requests with no order between them (the SDK's log processor flushes
every second, its span processor every five by default). Log events are kept here, per span, until
the span comes (``take``); a span whose content is incomplete waits up to the wait time for the rest
(``wait``), then lands with what there is. The store is in memory: one API process joins what reaches it
(see docs/otel.md for replicas and restarts).

Held per API key: a span's log events join only that key's span (trace and span ids are no secret: any
``traceparent`` header shows them), and each key's events are bounded in bytes on their own, so no key
can push out another's. Events older than the time to live are dropped by a timer, whether or not more
requests come.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from clawr1.gateway.otlp.genai import SpanKey, SpanLogs

JoinKey = tuple[str, str, str]
"""(the API key's name, trace id, span id)."""


@dataclass
class _Held:
    at: float
    logs: SpanLogs


class ContentJoin:
    def __init__(self, ttl_s: float = 120.0, max_bytes: int = 32 * 1024 * 1024,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_bytes, self.clock = ttl_s, max_bytes, clock
        self._by_source: dict[str, OrderedDict[SpanKey, _Held]] = {}
        self._bytes: dict[str, int] = {}
        self._changed = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self.expired = 0
        """Spans whose log events were dropped unclaimed (too old, or over their key's bytes)."""

    def offer(self, source: str, logs: dict[SpanKey, SpanLogs]) -> None:
        """Keep a request's log events (added to what the same spans already have) and wake waiters."""
        now = self.clock()
        if logs:
            held = self._by_source.setdefault(source, OrderedDict())
            for key, more in logs.items():
                seen = held.pop(key, None)
                held[key] = _Held(now, more if seen is None else seen.logs.plus(more))
            self._bytes[source] = self._bytes.get(source, 0) + sum(more.size for more in logs.values())
        self._expire(now)
        self._changed.set()
        self._changed = asyncio.Event()
        self._schedule()

    def take(self, key: JoinKey) -> SpanLogs | None:
        source, *span = key
        held = self._by_source.get(source)
        entry = None if held is None else held.pop((span[0], span[1]), None)
        if entry is None:
            return None
        self._forget(source, entry.logs.size)
        return entry.logs

    def has_reply(self, key: JoinKey) -> bool:
        held = self._by_source.get(key[0])
        entry = None if held is None else held.get((key[1], key[2]))
        return entry is not None and entry.logs.content().has_reply

    async def wait(self, keys: Iterable[JoinKey], timeout_s: float) -> None:
        """Until every span of ``keys`` has its reply among the log events, or ``timeout_s`` passed."""
        pending = set(keys)
        deadline = self.clock() + timeout_s
        while pending:
            pending = {key for key in pending if not self.has_reply(key)}
            left = deadline - self.clock()
            if not pending or left <= 0:
                return
            try:
                await asyncio.wait_for(self._changed.wait(), left)
            except TimeoutError:
                return

    def __len__(self) -> int:
        return sum(map(len, self._by_source.values()))

    def held_bytes(self, source: str) -> int:
        return self._bytes.get(source, 0)

    def _forget(self, source: str, size: int) -> None:
        self._bytes[source] -= size
        if not self._by_source[source]:
            del self._by_source[source], self._bytes[source]

    def _expire(self, now: float) -> None:
        for source, held in list(self._by_source.items()):
            while held:
                key, entry = next(iter(held.items()))
                if now - entry.at <= self.ttl_s and self._bytes[source] <= self.max_bytes:
                    break
                del held[key]
                self._bytes[source] -= entry.logs.size
                self.expired += 1
            if not held:
                del self._by_source[source], self._bytes[source]

    def _schedule(self) -> None:
        """A timer at the oldest entry's end of life, so what nobody claims goes without another request."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # offered outside the API's loop (a unit test's own clock): no timer
            return
        if self._timer is not None or not self._by_source:
            return
        oldest = min(next(iter(held.values())).at for held in self._by_source.values())
        self._timer = loop.call_later(max(0.0, oldest + self.ttl_s - self.clock()) + 0.01, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._expire(self.clock())
        self._schedule()
