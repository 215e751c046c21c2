"""The one way a test waits for something another thread or process does: poll a condition, with a
deadline, and fail saying what did not happen."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
Message = str | Callable[[], str]


def _deadline(timeout: float) -> float:
    return time.monotonic() + timeout


def _timed_out(timeout: float, message: Message, last: object) -> AssertionError:
    said = message() if callable(message) else message
    return AssertionError(f"{said or 'condition not met'} within {timeout:g} s (last: {last!r})")


def wait_until(check: Callable[[], T], timeout: float, *, interval: float = 0.05, message: Message = "") -> T:
    """``check()`` every ``interval`` seconds until it returns something truthy, which is returned. Past
    ``timeout`` an AssertionError says what did not happen: ``message`` (called then, when a function) and
    the last value ``check`` returned. An exception ``check`` raises is the caller's to catch."""
    deadline = _deadline(timeout)
    while not (value := check()):
        if time.monotonic() > deadline:
            raise _timed_out(timeout, message, value)
        time.sleep(interval)
    return value


async def wait_until_async(check: Callable[[], T], timeout: float, *, interval: float = 0.01,
                           message: Message = "") -> T:
    """``wait_until`` for a coroutine: the event loop runs between the checks."""
    deadline = _deadline(timeout)
    while not (value := check()):
        if time.monotonic() > deadline:
            raise _timed_out(timeout, message, value)
        await asyncio.sleep(interval)
    return value
