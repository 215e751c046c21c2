"""Thin batches: one of fewer than ``fill`` records goes no sooner than ``wait_s`` after the previous
batch; a filled one, or the first after a longer pause, goes on its usual timer."""

from __future__ import annotations

from clawr1.core.thin_batch import NEVER, ThinWait


def test_a_thin_batch_waits_until_the_wait_has_passed_since_the_previous_one() -> None:
    assert ThinWait(1.0, fill=8).due_at(usual=10.25, previous=10.0, count=3) == 11.0


def test_a_filled_batch_goes_on_its_usual_timer() -> None:
    assert ThinWait(1.0, fill=8).due_at(usual=10.25, previous=10.0, count=8) == 10.25


def test_the_first_batch_after_a_longer_pause_is_not_held() -> None:
    assert ThinWait(1.0, fill=8).due_at(usual=30.25, previous=10.0, count=1) == 30.25
    assert ThinWait(1.0, fill=8).due_at(usual=1.0, previous=-float("inf"), count=1) == 1.0


def test_never_keeps_the_usual_timer() -> None:
    assert NEVER.due_at(usual=10.25, previous=10.2, count=1) == 10.25
