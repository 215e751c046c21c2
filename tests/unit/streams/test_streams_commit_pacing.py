"""Commit pacing: a due checkpoint waits while every poll brings input, up to the busy interval or
``commit_every`` messages; a poll that brings nothing, a forced commit and a revoke commit at once."""

from __future__ import annotations

from typing import Any

from clawr1.streams.commit_pacing import CommitPacing


class Loop:
    """Quix's run loop as the pacing sees it: polls that bring ``n`` messages, then a commit call."""

    def __init__(self, busy_s: float = 0.25, commit_every: int = 100) -> None:
        self.now = 0.0
        self.pacing = CommitPacing(busy_s, commit_every, clock=lambda: self.now)
        self.checkpoint = object()
        self.commits: list[dict[str, Any]] = []
        self.commit = self.pacing.wrap(lambda: self.checkpoint)(self._commit)

    def _commit(self, force: bool = False, revoking: bool = False) -> None:
        self.commits.append({"at": self.now, "force": force, "revoking": revoking})
        self.checkpoint = object()  # committed: Quix opens a new one

    def poll(self, messages: int, seconds: float = 0.05) -> None:
        self.now += seconds
        for _ in range(messages):
            self.pacing.fed()
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
