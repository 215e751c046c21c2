"""The one way a test waits for something another thread or process does: poll a condition, with a
deadline, and fail saying what did not happen. A test that proves something does NOT happen polls that it
stays so for a while (``holds_for``); one about what happens past a time limit outlasts it (``outlast``).
No bare sleep before an assert."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
Message = str | Callable[[], str]


def _deadline(timeout: float) -> float:
    return time.monotonic() + timeout


def _said(message: Message) -> str:
    return message() if callable(message) else message


def _timed_out(timeout: float, message: Message, last: object) -> AssertionError:
    return AssertionError(f"{_said(message) or 'condition not met'} within {timeout:g} s (last: {last!r})")


def _broken(message: Message, value: object) -> AssertionError:
    return AssertionError(f"{_said(message) or 'condition broken'} (got {value!r})")


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


def holds_for(check: Callable[[], T], seconds: float, *, interval: float = 0.05, message: Message = "") -> T:
    """``check()`` stays truthy for ``seconds``: how a test proves something does NOT happen (a write, a
    duplicate, a reply) in the time it would have taken. Fails at the first falsy value, saying ``message``;
    returns the last value."""
    deadline = _deadline(seconds)
    while True:
        if not (value := check()):
            raise _broken(message, value)
        if time.monotonic() > deadline:
            return value
        time.sleep(interval)


async def holds_for_async(check: Callable[[], T], seconds: float, *, interval: float = 0.01,
                          message: Message = "") -> T:
    """``holds_for`` for a coroutine: the event loop runs between the checks."""
    deadline = _deadline(seconds)
    while True:
        if not (value := check()):
            raise _broken(message, value)
        if time.monotonic() > deadline:
            return value
        await asyncio.sleep(interval)


def outlast(limit_s: float, *, since: float, margin: float = 0.1) -> None:
    """Let a time limit that started at ``since`` (``time.monotonic()``) run out, and ``margin`` more: the
    test is about what happens once it is over, so there is nothing to poll for. Sleeps only what is left."""
    time.sleep(max(0.0, since + limit_s + margin - time.monotonic()))
