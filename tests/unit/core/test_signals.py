"""SIGINT/SIGTERM become a stop request: a threading.Event for blocking code, an asyncio.Event on a loop."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import pytest

from clawr1.core.signals import STOP_SIGNALS, stop_loop_on_signals, stop_on_signals


@pytest.fixture(autouse=True)
def restored_handlers() -> Iterator[None]:
    """The test process's own handlers come back after each test."""
    previous = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@pytest.mark.parametrize("sig", STOP_SIGNALS)
def test_a_stop_signal_sets_the_event(sig: signal.Signals) -> None:
    stop = stop_on_signals()
    assert not stop.is_set()
    os.kill(os.getpid(), sig)
    assert stop.wait(5)


def test_only_the_named_signals_are_taken() -> None:
    before = signal.getsignal(signal.SIGINT)
    stop = stop_on_signals([signal.SIGTERM])
    assert signal.getsignal(signal.SIGINT) is before
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.wait(5)


@pytest.mark.parametrize("sig", STOP_SIGNALS)
def test_a_stop_signal_sets_the_loop_event(sig: signal.Signals) -> None:
    async def main() -> None:
        stop = stop_loop_on_signals()
        assert not stop.is_set()
        os.kill(os.getpid(), sig)
        await asyncio.wait_for(stop.wait(), 5)

    asyncio.run(main())


def test_the_loop_variant_needs_a_running_loop() -> None:
    with pytest.raises(RuntimeError):
        stop_loop_on_signals()
