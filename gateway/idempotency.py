"""Idempotency-Key replay: a retried request gets the first answer back and produces nothing again.

Scope: one gateway process, keyed by (source name, route, key), for ``ttl_s`` after the first
answer, within ``max_keys`` / ``max_bytes`` (least recently used forgotten first). Beyond that scope (another
replica, a restart, an expired key) a retry is produced again, and the deterministic item ids let
the streams and the pool drop the duplicate. Only accepted (202) answers are remembered: a request
that failed produced nothing the client was told about, so its retry must run again.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from cachetools import TTLCache

ScopeKey = tuple[str, str, str]


class IdempotencyConflict(Exception):
    """``in_flight``: the first request with this key is still running; ``mismatch``: the key was
    used with a different body."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class _Answer:
    fingerprint: str
    body: bytes


def _size(answer: _Answer) -> int:
    return len(answer.body)


class IdempotencyStore:
    """Not thread-safe: used from the event loop only."""

    def __init__(self, ttl_s: float, max_keys: int, max_bytes: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.max_keys = max_keys
        self.max_bytes = max_bytes
        # Bounded by bytes here; by count in ``finish``.
        self._answers: TTLCache[ScopeKey, _Answer] = TTLCache(max_bytes, ttl_s, clock, _size)
        self._in_flight: dict[ScopeKey, str] = {}

    def __len__(self) -> int:
        return len(self._answers)

    @property
    def stored_bytes(self) -> int:
        return int(self._answers.currsize)

    def claim(self, key: ScopeKey, fingerprint: str) -> bytes | None:
        """The remembered answer for a replay, or None when the caller now owns the key and must
        call ``finish`` or ``abandon``."""
        running = self._in_flight.get(key)
        if running is not None:
            raise IdempotencyConflict("in_flight" if running == fingerprint else "mismatch")
        answer = self._answers.get(key)
        if answer is not None:
            if answer.fingerprint != fingerprint:
                raise IdempotencyConflict("mismatch")
            return answer.body
        self._in_flight[key] = fingerprint
        return None

    def finish(self, key: ScopeKey, body: bytes) -> None:
        fingerprint = self._in_flight.pop(key)
        if len(body) > self.max_bytes:
            return
        self._answers[key] = _Answer(fingerprint, body)
        while len(self._answers) > self.max_keys:
            self._answers.popitem()

    def abandon(self, key: ScopeKey) -> None:
        self._in_flight.pop(key, None)
