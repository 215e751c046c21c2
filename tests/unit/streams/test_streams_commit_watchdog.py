"""A checkpoint commit that never returns ends the worker (its restart fences the transaction); commits
that return, however many, never do."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from types import SimpleNamespace

import pytest

from clawr1.streams import commit_watchdog
from clawr1.streams.commit_watchdog import EXIT_CODE, CommitWatchdog
from tests.support.waiting import holds_for, wait_until


def _block_until_reported(watchdog: CommitWatchdog, commit: Callable[[threading.Event], object],
                          reported: Callable[[], object]) -> None:
    """Run ``commit(release)`` in a thread under ``watchdog`` until ``reported()``, then let it return."""
    release = threading.Event()
    blocked = threading.Thread(target=watchdog.watch(lambda: commit(release)))
    watchdog.start()
    try:
        blocked.start()
        wait_until(reported, 5, message="the watchdog naming the blocked commit")
        release.set()
        blocked.join(5)
    finally:
        watchdog.stop()


def test_a_commit_running_past_the_limit_is_reported_once_from_the_watchdog() -> None:
    overruns: list[tuple[float, str]] = []
    watchdog = CommitWatchdog(0.3, on_overrun=lambda s: overruns.append((s, threading.current_thread().name)))
    _block_until_reported(watchdog, lambda release: release.wait(10), lambda: overruns)
    [(seconds, thread)] = overruns
    assert seconds > 0.3 and thread == "clawr1-commit-watchdog"


def test_commits_that_return_are_left_alone_and_pass_their_result_through() -> None:
    overruns: list[float] = []
    # The limit is well above a busy machine's scheduling stalls: a commit stalled inside its call past
    # the limit is, for the watchdog, a commit that ran that long.
    watchdog = CommitWatchdog(1.5, on_overrun=overruns.append).start()
    try:
        commit = watchdog.watch(lambda force=False: ("committed", force))
        results = [commit(force=n % 2 == 0) for n in range(2000)]
        holds_for(lambda: not overruns, 1.6, message="an overrun reported")  # no commit running past 1.5 s
    finally:
        watchdog.stop()
    assert results[:2] == [("committed", True), ("committed", False)] and not overruns


def test_a_commit_that_returned_while_the_watchdog_was_descheduled_is_not_blamed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The watchdog reads the running commit's start, then the clock: when it was descheduled between the
    two (a loaded machine), the commit it read may have returned long before the clock says."""
    watchdog = CommitWatchdog(0.2, on_overrun=lambda _: None)
    watchdog._started = 100.0  # a commit running since t=100, as the watchdog reads it

    def clock_after_a_stall() -> float:  # the watchdog runs again at t=101; the commit returned at 100.01
        watchdog._started = None
        return 101.0

    monkeypatch.setattr(commit_watchdog, "time", SimpleNamespace(monotonic=clock_after_a_stall))
    assert watchdog._overrun() is None
    watchdog._started = 100.0  # still running at t=101: that one is an overrun
    monkeypatch.setattr(commit_watchdog, "time", SimpleNamespace(monotonic=lambda: 101.0))
    assert watchdog._overrun() == 1.0


def test_by_default_the_process_leaves_with_where_its_threads_were() -> None:
    code = textwrap.dedent("""
        import time
        from clawr1.streams.commit_watchdog import CommitWatchdog

        def send_offsets_to_transaction():
            time.sleep(60)

        watchdog = CommitWatchdog(0.5).start()
        watchdog.watch(send_offsets_to_transaction)()
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30)
    assert run.returncode == EXIT_CODE, run.stderr
    assert "a checkpoint commit has not returned for" in run.stderr
    assert "in send_offsets_to_transaction" in run.stderr, run.stderr


def test_a_commit_nested_in_another_leaves_the_outer_one_timed() -> None:
    """A revoke's commit can run inside another call: when it returns, the outer one is still watched."""
    overruns: list[float] = []
    watchdog = CommitWatchdog(0.3, on_overrun=overruns.append)
    inner = watchdog.watch(lambda: None)

    def outer(release: threading.Event) -> None:
        inner()
        release.wait(10)

    _block_until_reported(watchdog, outer, lambda: overruns)
    assert overruns[0] > 0.3
