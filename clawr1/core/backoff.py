"""How long a retry loop waits: exponential backoff with full jitter, a server's Retry-After as a floor.

The n-th retry waits a time drawn uniformly from ``[0, min(max_s, base_s * 2**(n-1))]``: clients that
failed together (a broker, a gateway or a pool restarting under all of them) spread their retries over
the window instead of coming back in step, and the expected wait is half the plain exponential one.
When the server said how long to stay away (``Retry-After``), the wait is at least that, still capped
by ``max_s``: each caller keeps its own bound on a wait.

Standard library only: the gateway's client, meant to be vendored, depends on it.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC
from email.utils import parsedate_to_datetime

# 2**64 times any base is past every cap; a higher exponent would overflow the float.
_MAX_EXPONENT = 64


@dataclass(frozen=True)
class Backoff:
    """``jitter`` draws from [0, 1); tests pin it to make the waits exact."""

    base_s: float
    max_s: float
    jitter: Callable[[], float] = field(default=random.random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.base_s < 0 or self.max_s < 0:
            raise ValueError(f"backoff times must be >= 0, got base {self.base_s}, max {self.max_s}")

    def ceiling(self, retry: int) -> float:
        """The longest wait before retry ``retry`` (1: the first): ``base_s`` doubled, capped at ``max_s``."""
        if retry < 1:
            return 0.0
        return min(self.max_s, self.base_s * 2.0 ** min(retry - 1, _MAX_EXPONENT))

    def delay(self, retry: int, retry_after_s: float | None = None) -> float:
        """The wait before retry ``retry``: drawn under its ceiling, at least ``retry_after_s`` (never
        over ``max_s``)."""
        drawn = self.jitter() * self.ceiling(retry)
        if retry_after_s is None:
            return drawn
        return min(self.max_s, max(drawn, retry_after_s))

    def delays(self) -> Iterator[float]:
        """The waits before retries 1, 2, 3, ... of one operation."""
        return (self.delay(retry) for retry in itertools.count(1))


def retry_after_s(header: str | None, now: Callable[[], float] = time.time) -> float | None:
    """The seconds a ``Retry-After`` header asks for (delta-seconds or an HTTP-date, RFC 9110 10.2.3);
    None when there is none or it cannot be read. A date in the past asks for 0."""
    if not header or not header.strip():
        return None
    value = header.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:  # HTTP-dates are GMT; one without a zone ("-0000") is read as such
            when = when.replace(tzinfo=UTC)
        seconds = when.timestamp() - now()
    if seconds != seconds:  # NaN
        return None
    return max(0.0, seconds)
