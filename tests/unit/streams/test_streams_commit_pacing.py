"""Commit pacing: a due checkpoint waits while every poll brings input, up to the busy interval or
``commit_every`` records; a poll that brings nothing, a forced commit and a revoke commit at once; a thin
checkpoint (a trickle) waits until the thin interval has passed since the previous commit."""

from __future__ import annotations

from typing import Any

import pytest

from clawr1.core.thin_batch import NEVER, ThinWait
from clawr1.streams.commit_pacing import CommitPacing


class Loop:
    """Quix's run loop as the pacing sees it: polls that bring ``n`` messages, then a commit call."""

    def __init__(self, busy_s: float = 0.25, commit_every: int = 100, thin: ThinWait = NEVER) -> None:
        self.now = 0.0
        self.pacing = CommitPacing(busy_s, commit_every, thin, usual_s=0.1, clock=lambda: self.now)
        self.checkpoint = object()
        self.commits: list[dict[str, Any]] = []
        self.commit = self.pacing.wrap(lambda: self.checkpoint)(self._commit)

    def _commit(self, force: bool = False, revoking: bool = False) -> None:
        self.commits.append({"at": self.now, "force": force, "revoking": revoking})
        self.checkpoint = object()  # committed: Quix opens a new one

    def poll(self, messages: int, seconds: float = 0.05, records: int = 1) -> None:
        self.now += seconds
        for _ in range(messages):
            self.pacing.fed(records)
        self.commit()


def test_a_checkpoint_stays_open_while_polls_bring_input_up_to_the_busy_interval() -> None:
    loop = Loop(busy_s=0.25)
    for _ in range(5):  # 0.05 .. 0.25 s: input every poll
        loop.poll(1)
    assert loop.commits == []
    loop.poll(1)  # 0.25 s open, counted from the first commit call that saw it (0.05 s)
    assert [c["at"] for c in loop.commits] == [loop.now]


def test_a_poll_that_brings_nothing_commits_at_once() -> None:
    loop = Loop(busy_s=10.0)
    loop.poll(3)
    loop.poll(2)
    assert loop.commits == []
    loop.poll(0)
    assert [c["at"] for c in loop.commits] == [loop.now]


def test_commit_every_is_never_held_back() -> None:
    loop = Loop(busy_s=10.0, commit_every=5)
    loop.poll(3)
    assert loop.commits == []
    loop.poll(2)  # five messages in the open checkpoint
    assert len(loop.commits) == 1
    loop.poll(1)  # a new checkpoint counts from zero
    assert len(loop.commits) == 1


def test_forced_and_revoking_commits_pass_through() -> None:
    loop = Loop(busy_s=10.0)
    loop.poll(1)
    loop.pacing.fed()
    loop.commit(force=True)
    loop.pacing.fed()
    loop.commit(revoking=True)
    assert [(c["force"], c["revoking"]) for c in loop.commits] == [(True, False), (False, True)]


def test_a_thin_checkpoint_commits_no_sooner_than_the_thin_interval_after_the_previous_commit() -> None:
    loop = Loop(busy_s=0.25, thin=ThinWait(0.52, fill=10))
    loop.poll(1)  # opened at 0.05 s
    loop.poll(0, seconds=0.1)  # 0.15 s: the first record after a pause commits on the usual interval
    assert len(loop.commits) == 1
    while len(loop.commits) == 1 and loop.now < 2.0:  # a trickle: a record a poll, from 0.25 s
        loop.poll(1, seconds=0.1)
    assert loop.commits[1]["at"] == pytest.approx(0.85)  # the first poll 0.52 s after the commit was seen


def test_a_filled_checkpoint_commits_on_the_usual_interval() -> None:
    loop = Loop(busy_s=0.25, thin=ThinWait(5.0, fill=10))
    loop.poll(1)
    loop.poll(0, seconds=0.1)
    assert len(loop.commits) == 1
    loop.poll(1, records=10)  # an envelope of ten records: worth its transaction
    loop.poll(0, seconds=0.11)  # the checkpoint's usual interval has passed
    assert len(loop.commits) == 2
