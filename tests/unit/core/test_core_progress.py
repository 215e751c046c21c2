"""Healthy means progressing: the stall rule, without Kafka."""

from __future__ import annotations

from clawr1.core.progress import Offsets, ProgressTracker

P = ("clawr1.raw.steps", 0)


def _always(_partition: tuple[str, int], offset: int) -> int | None:
    """A committed record waits at the committed offset."""
    return offset


def test_a_partition_with_records_waiting_and_no_progress_stalls_after_the_window() -> None:
    tracker = ProgressTracker(stall_s=30, max_gap_s=100)
    assert tracker.observe("g", 0, {P: Offsets(100, 150)}, _always) is None
    assert tracker.observe("g", 29, {P: Offsets(100, 160)}, _always) is None
    stall = tracker.observe("g", 31, {P: Offsets(100, 170)}, _always)
    assert stall is not None and stall.lag == 70 and stall.seconds == 31
    assert stall.describe() == ("consumer group g: 70 records waiting, no progress for 31s "
                                "(clawr1.raw.steps[0])")


def test_progress_or_an_empty_lag_resets_the_clock_and_only_progress_ends_a_stall() -> None:
    tracker = ProgressTracker(stall_s=10, max_gap_s=100)
    tracker.observe("g", 0, {P: Offsets(5, 9)}, _always)
    assert tracker.observe("g", 20, {P: Offsets(5, 9)}, _always) is not None
    assert tracker.observe("g", 25, {P: Offsets(5, 9)}, _always) is not None  # still stuck: not healthy again
    assert tracker.observe("g", 26, {P: Offsets(6, 9)}, _always) is None  # it moved
    assert tracker.observe("g", 40, {P: Offsets(9, 9)}, _always) is None  # nothing waits


def test_only_markers_or_aborted_records_waiting_is_caught_up() -> None:
    """A transaction's commit marker takes an offset: the probe finds no record, so no stall."""
    tracker = ProgressTracker(stall_s=10, max_gap_s=100)
    probed: list[tuple[tuple[str, int], int]] = []

    def nothing(partition: tuple[str, int], offset: int) -> int | None:
        probed.append((partition, offset))
        return None

    tracker.observe("g", 0, {P: Offsets(41, 42)}, nothing)
    assert tracker.observe("g", 15, {P: Offsets(41, 42)}, nothing) is None
    assert probed == [(P, 41)]
    assert tracker.observe("g", 20, {P: Offsets(41, 42)}, nothing) is None and len(probed) == 1  # clock reset


def test_work_that_arrives_after_an_idle_trailing_marker_is_not_a_stall() -> None:
    """A partition idle behind its last commit marker (lag 1, no progress: nothing to do) gets new work
    just before the probe looks: that record has not waited, so the clock starts again; if it still waits
    a whole window later, the partition stalls."""
    tracker = ProgressTracker(stall_s=10, max_gap_s=100)
    tracker.observe("g", 0, {P: Offsets(41, 42)}, _always)  # the marker at 41
    assert tracker.observe("g", 9, {P: Offsets(41, 42)}, _always) is None

    def arrived(_partition: tuple[str, int], _offset: int) -> int | None:
        return 42  # a record written after the look at 42: past the end seen when the clock started

    assert tracker.observe("g", 11, {P: Offsets(41, 42)}, arrived) is None
    assert tracker.observe("g", 13, {P: Offsets(41, 43)}, arrived) is None
    stall = tracker.observe("g", 22, {P: Offsets(41, 43)}, arrived)  # it waited from 11 on, below 43
    assert stall is not None and stall.seconds == 11


def test_groups_and_partitions_are_judged_apart() -> None:
    tracker = ProgressTracker(stall_s=10, max_gap_s=100)
    q = ("clawr1.internal.work", 3)
    tracker.observe("g", 0, {P: Offsets(0, 5), q: Offsets(0, 0)}, _always)
    tracker.observe("h", 0, {P: Offsets(0, 5)}, _always)
    stall = tracker.observe("g", 11, {P: Offsets(0, 5), q: Offsets(0, 1)}, _always)
    assert stall is not None and stall.partitions == ("clawr1.raw.steps[0]",)
    assert tracker.observe("h", 11, {P: Offsets(5, 5)}, _always) is None


def test_a_gap_in_the_looks_starts_the_clocks_again() -> None:
    """Kafka did not answer for a while (the broker was down): the group is not blamed for it."""
    tracker = ProgressTracker(stall_s=10, max_gap_s=5)
    tracker.observe("g", 0, {P: Offsets(3, 9)}, _always)
    assert tracker.observe("g", 30, {P: Offsets(3, 9)}, _always) is None  # 30 s without a look
    for now in (34, 38):
        assert tracker.observe("g", now, {P: Offsets(3, 9)}, _always) is None
    assert tracker.observe("g", 41, {P: Offsets(3, 9)}, _always) is not None  # 11 s since the gap
