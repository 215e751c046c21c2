"""The one backoff of the product's retry loops: full jitter under a doubling ceiling, Retry-After a floor."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from email.utils import format_datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawr1.core.backoff import Backoff, retry_after_s


def _top(base_s: float, max_s: float) -> Backoff:
    """Jitter pinned to the top of its range: each wait is its ceiling."""
    return Backoff(base_s, max_s, jitter=lambda: 1.0)


def test_the_ceiling_doubles_per_retry_and_is_capped() -> None:
    backoff = _top(0.5, 5.0)
    assert [backoff.ceiling(n) for n in (0, 1, 2, 3, 4, 5, 1000)] == [0.0, 0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert [backoff.delay(n) for n in (1, 2, 3, 6)] == [0.5, 1.0, 2.0, 5.0]
    assert list(itertools.islice(backoff.delays(), 5)) == [0.5, 1.0, 2.0, 4.0, 5.0]


def test_the_wait_is_drawn_under_the_ceiling() -> None:
    draws = iter([0.0, 0.25, 0.5])
    backoff = Backoff(1.0, 10.0, jitter=lambda: next(draws))
    assert [backoff.delay(3) for _ in range(3)] == [0.0, 1.0, 2.0]


def test_retry_after_is_a_floor_still_capped() -> None:
    backoff = _top(0.5, 5.0)
    assert backoff.delay(1, 3.0) == 3.0
    assert backoff.delay(1, 60.0) == 5.0
    assert backoff.delay(3, 1.0) == 2.0
    assert Backoff(0.5, 5.0, jitter=lambda: 0.0).delay(4, 1.5) == 1.5


@given(st.floats(0.0, 10.0), st.floats(0.0, 100.0), st.integers(1, 10_000), st.floats(0.0, 0.999),
       st.none() | st.floats(0.0, 1e6))
def test_every_wait_is_within_the_caller_bound(base_s: float, max_s: float, retry: int, draw: float,
                                                after: float | None) -> None:
    wait = Backoff(base_s, max_s, jitter=lambda: draw).delay(retry, after)
    assert 0.0 <= wait <= max_s
    assert wait <= min(max_s, base_s * 2.0 ** min(retry - 1, 64)) or after is not None
    if after is not None:
        assert wait >= min(after, max_s)


def test_the_default_jitter_spreads_the_waits() -> None:
    waits = [Backoff(1.0, 8.0).delay(4) for _ in range(200)]
    assert all(0.0 <= w < 8.0 for w in waits) and len(set(waits)) > 100


def test_negative_times_are_refused() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        Backoff(-1.0, 5.0)


@pytest.mark.parametrize(("header", "seconds"), [
    ("3", 3.0), (" 2.5 ", 2.5), ("0", 0.0), ("-4", 0.0), ("", None), ("  ", None), (None, None),
    ("soon", None), ("nan", None), ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),
])
def test_retry_after_reads_seconds_and_http_dates(header: str | None, seconds: float | None) -> None:
    assert retry_after_s(header) == seconds


def test_a_future_http_date_asks_for_the_time_until_then() -> None:
    now = datetime(2030, 1, 1, 12, 0, 0, tzinfo=UTC)
    header = format_datetime(datetime(2030, 1, 1, 12, 0, 30, tzinfo=UTC), usegmt=True)
    assert retry_after_s(header, now=now.timestamp) == 30.0
    assert retry_after_s("Tue, 01 Jan 2030 12:00:10 -0000", now=now.timestamp) == 10.0
