"""Healthy means progressing: the stall rule, without Kafka."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from confluent_kafka import OFFSET_END, KafkaError, KafkaException, TopicPartition

from clawr1.core.offsets import Offsets, group_offsets
from clawr1.core.progress import ProbeInconclusive, ProgressTracker, caught_up, look_interval

P = ("clawr1.raw.steps", 0)


def _always(_partition: tuple[str, int], offset: int) -> int | None:
    """A committed record waits at the committed offset."""
    return offset


def test_a_partition_with_records_waiting_and_no_progress_stalls_after_the_window() -> None:
    tracker = ProgressTracker(stall_s=30)
    assert tracker.observe("g", 0, {P: Offsets(100, 150)}, _always) is None
    assert tracker.observe("g", 29, {P: Offsets(100, 160)}, _always) is None
    stall = tracker.observe("g", 31, {P: Offsets(100, 170)}, _always)
    assert stall is not None and stall.lag == 70 and stall.seconds == 31
    assert stall.describe() == ("consumer group g: 70 records waiting, no progress for 31s "
                                "(clawr1.raw.steps[0])")


def test_progress_or_an_empty_lag_resets_the_clock_and_only_progress_ends_a_stall() -> None:
    tracker = ProgressTracker(stall_s=10)
    tracker.observe("g", 0, {P: Offsets(5, 9)}, _always)
    assert tracker.observe("g", 20, {P: Offsets(5, 9)}, _always) is not None
    assert tracker.observe("g", 25, {P: Offsets(5, 9)}, _always) is not None  # still stuck: not healthy again
    assert tracker.observe("g", 26, {P: Offsets(6, 9)}, _always) is None  # it moved
    assert tracker.observe("g", 40, {P: Offsets(9, 9)}, _always) is None  # nothing waits


def test_only_markers_or_aborted_records_waiting_is_caught_up() -> None:
    """A transaction's commit marker takes an offset: the probe finds no record, so no stall."""
    tracker = ProgressTracker(stall_s=10)
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
    tracker = ProgressTracker(stall_s=10)
    tracker.observe("g", 0, {P: Offsets(41, 42)}, _always)  # the marker at 41
    assert tracker.observe("g", 9, {P: Offsets(41, 42)}, _always) is None

    def arrived(_partition: tuple[str, int], _offset: int) -> int | None:
        return 42  # a record written after the look at 42: past the end seen when the clock started

    assert tracker.observe("g", 11, {P: Offsets(41, 42)}, arrived) is None
    assert tracker.observe("g", 13, {P: Offsets(41, 43)}, arrived) is None
    stall = tracker.observe("g", 22, {P: Offsets(41, 43)}, arrived)  # it waited from 11 on, below 43
    assert stall is not None and stall.seconds == 11


def test_groups_and_partitions_are_judged_apart() -> None:
    tracker = ProgressTracker(stall_s=10)
    q = ("clawr1.internal.work", 3)
    tracker.observe("g", 0, {P: Offsets(0, 5), q: Offsets(0, 0)}, _always)
    tracker.observe("h", 0, {P: Offsets(0, 5)}, _always)
    stall = tracker.observe("g", 11, {P: Offsets(0, 5), q: Offsets(0, 1)}, _always)
    assert stall is not None and stall.partitions == ("clawr1.raw.steps[0]",)
    assert tracker.observe("h", 11, {P: Offsets(5, 5)}, _always) is None


def test_a_failed_look_pauses_the_clocks_until_kafka_answers_again() -> None:
    """Kafka did not answer for a while (the broker was down): the group is not blamed for that time."""
    tracker = ProgressTracker(stall_s=10)
    tracker.observe("g", 0, {P: Offsets(3, 9)}, _always)
    assert tracker.observe("g", 6, {P: Offsets(3, 9)}, _always) is None
    tracker.unseen("g")  # looks failed from here to 30
    assert tracker.observe("g", 30, {P: Offsets(3, 9)}, _always) is None  # 6 s seen, 24 s blind
    assert tracker.observe("g", 33, {P: Offsets(3, 9)}, _always) is None  # 9 s seen
    stall = tracker.observe("g", 35, {P: Offsets(3, 9)}, _always)
    assert stall is not None and stall.seconds == 11


def test_slow_looks_that_answer_still_add_up_to_a_stall() -> None:
    """A watch whose every look took long (a describe timing out beside it, a slow broker) used to start
    its clocks again at each look and never judged: only a failed look pauses them now."""
    tracker = ProgressTracker(stall_s=30)
    for now in (0, 12, 24):  # 12 s apart: more than the watch's 6 s between looks
        assert tracker.observe("g", now, {P: Offsets(3, 9)}, _always) is None
    stall = tracker.observe("g", 36, {P: Offsets(3, 9)}, _always)
    assert stall is not None and stall.seconds == 36


def test_a_probe_that_cannot_tell_leaves_the_clock_running() -> None:
    """No answer from the probe is not "caught up": the next look probes again and may find the record."""
    tracker = ProgressTracker(stall_s=10)
    answers: list[int | None] = []

    def flaky(_partition: tuple[str, int], offset: int) -> int | None:
        answers.append(offset)
        if len(answers) < 3:
            raise ProbeInconclusive("no answer in 3s")
        return offset

    tracker.observe("g", 0, {P: Offsets(3, 9)}, flaky)
    assert tracker.observe("g", 11, {P: Offsets(3, 9)}, flaky) is None
    assert tracker.observe("g", 13, {P: Offsets(3, 9)}, flaky) is None
    stall = tracker.observe("g", 15, {P: Offsets(3, 9)}, flaky)
    assert stall is not None and stall.seconds == 15 and len(answers) == 3


def test_a_look_that_misses_a_partition_judges_the_others() -> None:
    """A partition between leaders is left out of a look; the others still stall, and its own clock
    keeps what it had."""
    tracker = ProgressTracker(stall_s=10)
    q = ("clawr1.raw.steps", 1)
    tracker.observe("g", 0, {P: Offsets(0, 5), q: Offsets(0, 5)}, _always)
    stall = tracker.observe("g", 11, {P: Offsets(0, 5)}, _always)
    assert stall is not None and stall.partitions == ("clawr1.raw.steps[0]",)
    stall = tracker.observe("g", 12, {P: Offsets(0, 5), q: Offsets(0, 5)}, _always)
    assert stall is not None and stall.partitions == ("clawr1.raw.steps[0]", "clawr1.raw.steps[1]")


def test_a_member_that_commits_on_any_of_its_partitions_is_busy_not_stalled() -> None:
    """Overload is not a stall: a worker that left one partition waiting while it committed another
    within the window is excused; once it commits nothing at all for the window, that partition stalls."""
    tracker = ProgressTracker(stall_s=10)
    q = ("clawr1.raw.steps", 1)
    owners = {P: "w1", q: "w1"}
    tracker.observe("g", 0, {P: Offsets(0, 50), q: Offsets(0, 50)}, _always, owners)
    for now, moved in ((5, 10), (12, 20), (18, 30)):  # q moves, P waits
        assert tracker.observe("g", now, {P: Offsets(0, 50), q: Offsets(moved, 50)}, _always, owners) is None
    stall = tracker.observe("g", 28, {P: Offsets(0, 50), q: Offsets(30, 50)}, _always, owners)
    assert stall is not None and stall.partitions == ("clawr1.raw.steps[0]", "clawr1.raw.steps[1]")


def test_another_members_progress_excuses_nobody_else() -> None:
    tracker = ProgressTracker(stall_s=10)
    q = ("clawr1.raw.steps", 1)
    owners = {P: "w1", q: "w2"}
    tracker.observe("g", 0, {P: Offsets(0, 50), q: Offsets(0, 50)}, _always, owners)
    stall = tracker.observe("g", 12, {P: Offsets(0, 50), q: Offsets(20, 50)}, _always, owners)
    assert stall is not None and stall.partitions == ("clawr1.raw.steps[0]",)
    # Without owners known, each partition is judged alone.
    alone = ProgressTracker(stall_s=10)
    alone.observe("g", 0, {P: Offsets(0, 50), q: Offsets(0, 50)}, _always)
    assert alone.observe("g", 12, {P: Offsets(0, 50), q: Offsets(20, 50)}, _always) is not None


def test_a_partition_that_changed_hands_gives_its_new_owner_a_window_of_its_own() -> None:
    """A partition taken over from a frozen member (rebalance, then the state rebuilt from its changelog)
    is not blamed on its new owner for the time it waited under the old one; the new owner still
    stalls once it sits on it for a whole window itself."""
    tracker = ProgressTracker(stall_s=10)
    tracker.observe("g", 0, {P: Offsets(0, 50)}, _always, {P: "w1"})
    assert tracker.observe("g", 9, {P: Offsets(0, 50)}, _always, {P: "w1"}) is None
    assert tracker.observe("g", 12, {P: Offsets(0, 50)}, _always, {P: "w2"}) is None  # w1 would be stuck
    assert tracker.observe("g", 21, {P: Offsets(0, 50)}, _always, {P: "w2"}) is None
    stall = tracker.observe("g", 22, {P: Offsets(0, 50)}, _always, {P: "w2"})
    assert stall is not None and stall.seconds == 10
    # A look that names no owner (the group not described) is no change of hands.
    assert tracker.observe("g", 23, {P: Offsets(0, 50)}, _always) is not None
    assert tracker.observe("g", 24, {P: Offsets(0, 50)}, _always, {P: "w2"}) is not None


def test_a_group_is_caught_up_with_at_most_a_trailing_marker_waiting_and_its_members_unchanged() -> None:
    q = ("clawr1.raw.steps", 1)
    members = {"w-0": {P}, "w-1": {q}}
    assert caught_up({P: Offsets(7, 7), q: Offsets(3, 4)}, members, dict(members))
    assert not caught_up({P: Offsets(7, 9), q: Offsets(3, 4)}, members, members)  # records wait
    assert not caught_up({P: Offsets(7, 7)}, members, None)  # no description before to compare with
    assert not caught_up({P: Offsets(7, 7)}, None, members)  # not described this time
    assert not caught_up({P: Offsets(7, 7)}, {"w-0": {P, q}}, members)  # a member left
    assert not caught_up({P: Offsets(7, 7)}, {"w-0": {q}, "w-1": {P}}, members)  # reassigned


def test_a_caught_up_watch_looks_less_often_within_a_fifth_of_the_stall_window() -> None:
    assert look_interval(True, 2.0, stall_s=30.0) == 6.0
    assert look_interval(True, 2.0, stall_s=300.0) == 6.0  # at most 6 s
    assert look_interval(True, 2.0, stall_s=10.0) == 2.0  # never less than the interval
    assert look_interval(False, 2.0, stall_s=30.0) == 2.0  # anything waiting: every interval


class _Reader:
    """A consumer's offset calls over fixed logs, counting the requests a look makes."""

    def __init__(self, committed: dict[tuple[str, int], int], logs: dict[tuple[str, int], tuple[int, int]],
                 leaderless: frozenset[tuple[str, int]] = frozenset()) -> None:
        self.committed_at, self.logs, self.leaderless = committed, logs, leaderless
        self.requests: list[str] = []

    def list_topics(self, timeout: float) -> SimpleNamespace:
        self.requests.append("metadata")
        topics: dict[str, SimpleNamespace] = {}
        for topic, partition in self.logs:
            topics.setdefault(topic, SimpleNamespace(error=None, partitions={})).partitions[partition] = None
        return SimpleNamespace(topics=topics)

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        self.requests.append("committed")
        return [TopicPartition(tp.topic, tp.partition, self.committed_at.get((tp.topic, tp.partition), -1001))
                for tp in partitions]

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float) -> list[SimpleNamespace]:
        self.requests.append("list_offsets")
        out = []
        for tp in partitions:
            at = (tp.topic, tp.partition)
            error = KafkaError(KafkaError.LEADER_NOT_AVAILABLE) if at in self.leaderless else None
            offset = -1 if error else self.logs[at][tp.offset == OFFSET_END]
            out.append(SimpleNamespace(topic=tp.topic, partition=tp.partition, offset=offset, error=error))
        return out

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float, cached: bool) -> tuple[int, int]:
        """The one-partition query a look falls back to when the batched one answered for none."""
        self.requests.append("watermarks")
        if (tp.topic, tp.partition) in self.leaderless:
            raise KafkaException(KafkaError(KafkaError.LEADER_NOT_AVAILABLE))
        return self.logs[(tp.topic, tp.partition)]


def test_a_look_asks_once_per_kind_however_many_partitions() -> None:
    """Committed offsets, log ends, and log starts only where the group never committed; a partition whose
    leader is away is left out; a topic not there is no partition."""
    logs = {("a", p): (10 * p, 100 + p) for p in range(8)} | {("b", 0): (0, 5), ("other", 0): (0, 9)}
    reader = _Reader({("a", p): 50 for p in range(1, 8)}, logs, leaderless=frozenset({("a", 7)}))
    offsets = group_offsets(reader, ["a", "b", "gone"])  # type: ignore[arg-type]
    assert reader.requests == ["metadata", "committed", "list_offsets", "list_offsets"]
    assert offsets[("a", 0)] == Offsets(0, 100, unset=True)
    assert offsets[("a", 3)] == Offsets(50, 103)
    assert offsets[("b", 0)] == Offsets(0, 5, unset=True)
    assert set(offsets) == {("a", p) for p in range(7)} | {("b", 0)}


def test_a_look_kafka_answered_for_no_partition_raises() -> None:
    reader = _Reader({}, {("a", 0): (0, 3)}, leaderless=frozenset({("a", 0)}))
    with pytest.raises(KafkaException):
        group_offsets(reader, ["a"])  # type: ignore[arg-type]
    assert group_offsets(reader, ["gone"]) == {}  # type: ignore[arg-type]
