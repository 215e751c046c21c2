"""Log events waiting for their span, and spans waiting (briefly) for their log events.

An exporter sends a call's span to ``/v1/traces`` and, when content travels as log events, its
messages to ``/v1/logs``, in two requests with no order between them (the SDK's log processor flushes
every second, its span processor every five by default). Log events are kept here, per span, until
the span comes (``take``); a span whose content is incomplete waits up to the wait time for the rest
(``wait``), then lands with what there is. The store is in memory, bounded by age and count: one API
process joins what reaches it (see docs/otel.md for replicas and restarts).
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from clawr1.gateway.otlp.genai import SpanKey, SpanLogs


class ContentJoin:
    def __init__(self, ttl_s: float = 120.0, max_spans: int = 20_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_spans, self.clock = ttl_s, max_spans, clock
        self._logs: OrderedDict[SpanKey, tuple[float, SpanLogs]] = OrderedDict()
        self._changed = asyncio.Event()
        self.expired = 0
        """Spans whose log events were dropped unclaimed (too old, or over ``max_spans``)."""

    def offer(self, logs: dict[SpanKey, SpanLogs]) -> None:
        """Keep a request's log events (added to what the same spans already have) and wake waiters."""
        now = self.clock()
        for key, more in logs.items():
            _, seen = self._logs.pop(key, (now, SpanLogs()))
            self._logs[key] = (now, seen.plus(more))
        self._expire(now)
        self._changed.set()
        self._changed = asyncio.Event()

    def take(self, key: SpanKey) -> SpanLogs | None:
        entry = self._logs.pop(key, None)
        return None if entry is None else entry[1]

    def has_reply(self, key: SpanKey) -> bool:
        entry = self._logs.get(key)
        return entry is not None and entry[1].content().has_reply

    async def wait(self, keys: Iterable[SpanKey], timeout_s: float) -> None:
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
        return len(self._logs)

    def _expire(self, now: float) -> None:
        while self._logs:
            key, (at, _) = next(iter(self._logs.items()))
            if now - at <= self.ttl_s and len(self._logs) <= self.max_spans:
                return
            del self._logs[key]
            self.expired += 1
