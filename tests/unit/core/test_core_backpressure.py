"""Backpressure without Kafka: the lag as time from offsets, and the gate's hysteresis."""

from __future__ import annotations

import math

from clawr1.core.backpressure import LagClock, LagGate, Verdict, look_interval, pipeline_lag
from clawr1.core.offsets import Offsets

P = ("clawr1.raw.steps", 0)
Q = ("clawr1.raw.steps", 1)


def test_a_keeping_up_group_is_behind_by_its_drain_time() -> None:
    clock = LagClock(window_s=10)
    assert clock.observe(0, {P: Offsets(0, 100)}) is not None
    # 100 records/s committed, 200 waiting: two seconds to drain.
    assert clock.observe(1, {P: Offsets(100, 300)}) == 1.0  # never caught up since the first look, 1 s ago
    lags = [clock.observe(t, {P: Offsets(100 * t, 100 * t + 200)}) for t in range(2, 8)]
    assert lags[-1] == 2.0


def test_a_stopped_worker_is_as_far_behind_as_since_it_last_had_nothing_to_do() -> None:
    clock = LagClock(window_s=10)
    assert clock.observe(0, {P: Offsets(50, 50)}) == 0.0
    assert clock.observe(1, {P: Offsets(50, 60)}) == 1.0
    assert clock.observe(25, {P: Offsets(50, 900)}) == 25.0
    assert clock.observe(26, {P: Offsets(900, 900)}) == 0.0  # caught up


def test_a_burst_after_an_idle_spell_is_not_behind() -> None:
    clock = LagClock(window_s=10)
    for t in range(5):
        clock.observe(t, {P: Offsets(10, 10)})
    assert clock.observe(5, {P: Offsets(10, 5000)}) == 1.0  # rate 0 over the window, but idle a second ago


def test_the_rate_counts_every_partition_and_a_group_that_never_committed_is_unknown() -> None:
    clock = LagClock(window_s=10)
    assert clock.observe(0, {P: Offsets(0, 10, unset=True), Q: Offsets(0, 10, unset=True)}) is None
    clock.observe(1, {P: Offsets(0, 100), Q: Offsets(0, 100)})
    for t in range(2, 30):
        lag = clock.observe(t, {P: Offsets(50 * t, 50 * t + 500), Q: Offsets(50 * t, 50 * t + 500)})
    assert lag == 10.0  # 1,000 waiting at 100 records/s
    # Nothing committed for a whole window: the time since it was last caught up (never: its first look).
    assert clock.observe(40, {P: Offsets(1450, 1950), Q: Offsets(1450, 1950)}) == 39.0


def test_the_gate_closes_short_of_the_bound_and_opens_lower_still() -> None:
    """Part of the bound is left for what was accepted before the gate closed to drain; between the marks
    the answer holds, so it does not flap."""
    gate = LagGate(bound_s=20)  # closes above 8 s, opens at 4 s
    assert not gate.update(7.9).closed
    closed = gate.update(14.0)
    assert closed.closed and closed.retry_after_s == 10  # back to 4 s
    assert gate.update(6.0).closed  # between the marks: still closed
    assert gate.update(4.5).retry_after_s == 1
    assert not gate.update(4.0).closed
    assert not gate.update(8.0).closed  # open again until the closing mark
    nothing_moves = gate.update(math.inf)
    assert nothing_moves.closed and nothing_moves.retry_after_s == 20
    assert "with nothing moving" in nothing_moves.reason(20)
    assert not gate.update(None).closed  # unknown holds nothing back


def test_a_bound_of_zero_never_closes() -> None:
    assert not LagGate(bound_s=0).update(math.inf).closed


def test_a_trailing_commit_marker_is_not_behind() -> None:
    """A transactional producer (the worker) leaves one marker after its last records: an idle group sits
    one offset short of the end of each partition it read, and is caught up."""
    clock = LagClock(window_s=10)
    for t in range(30):
        assert clock.observe(t, {P: Offsets(41, 42), Q: Offsets(7, 8)}) == 0.0


def test_the_pipeline_is_as_far_behind_as_its_stages_together() -> None:
    assert pipeline_lag([2.0, None, 3.5]) == 5.5
    assert pipeline_lag([None, None]) is None


def test_a_caught_up_pipeline_is_looked_at_less_often_within_a_third_of_the_closing_lag() -> None:
    assert look_interval(Verdict(lag_s=0.0), 1.0, bound_s=30.0) == 4.0  # closes at 12 s
    assert look_interval(Verdict(lag_s=0.0), 1.0, bound_s=15.0) == 2.0  # closes at 6 s
    assert look_interval(Verdict(lag_s=0.0), 1.0, bound_s=1.0) == 1.0  # never less than the interval
    assert look_interval(Verdict(lag_s=0.5), 1.0, bound_s=30.0) == 1.0  # behind: every interval
    assert look_interval(Verdict(lag_s=math.inf), 1.0, bound_s=30.0) == 1.0
