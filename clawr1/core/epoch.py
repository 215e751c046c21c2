"""The one rule for epoch times: what the pool's ``DateTime64(3)`` columns hold.

The sink dead-letters a record whose time breaks it (``sinks/rows.py``), so every way in refuses such a
time at admission with the same rule (``gateway/models.py``, the OTLP routes): never accepted, then lost.
"""

from __future__ import annotations

MAX_EPOCH_MS = 10_000_000_000_000  # year 2286, inside DateTime64(3)'s range


def is_epoch_ms(value: int) -> bool:
    """Whether ``value`` is an epoch time in milliseconds the pool can store."""
    return 0 <= value < MAX_EPOCH_MS
