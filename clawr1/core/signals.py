"""SIGINT/SIGTERM as a stop request: every long-running command stops its work cleanly on either
(brokers flush their logs, consumers commit, servers drain) instead of dying mid-write."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import Iterable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stop_on_signals(signals: Iterable[signal.Signals] = STOP_SIGNALS) -> threading.Event:
    """An event set by any of ``signals``, for blocking code that polls it. Call it from the main
    thread (Python runs signal handlers there); it replaces the signals' previous handlers."""
    stop = threading.Event()
    for sig in signals:
        signal.signal(sig, lambda _signum, _frame: stop.set())
    return stop


def stop_loop_on_signals(signals: Iterable[signal.Signals] = STOP_SIGNALS) -> asyncio.Event:
    """An asyncio event set by any of ``signals`` on the running loop (call it from a coroutine);
    the loop removes the handlers when it closes."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    return stop
