"""Readiness markers: what /healthz reads about the processes of `clawr1 up` it does not own."""

from __future__ import annotations

from pathlib import Path

from clawr1 import readiness


def test_a_reported_problem_withdraws_readiness_until_the_part_is_ready_again(tmp_path: Path) -> None:
    readiness.mark_ready(tmp_path, "worker-1")
    assert readiness.is_ready(tmp_path, "worker-1") and readiness.problem(tmp_path, "worker-1") is None
    readiness.report_problem(tmp_path, "worker-1", "not a member of consumer group g for 31s")
    assert not readiness.is_ready(tmp_path, "worker-1")
    assert readiness.problem(tmp_path, "worker-1") == "not a member of consumer group g for 31s"
    readiness.mark_ready(tmp_path, "worker-1")  # its restarted process serves
    assert readiness.is_ready(tmp_path, "worker-1") and readiness.problem(tmp_path, "worker-1") is None


def test_clear_forgets_markers_and_problems(tmp_path: Path) -> None:
    readiness.mark_ready(tmp_path, "proxy")
    readiness.report_problem(tmp_path, "worker", "stuck")
    readiness.clear(tmp_path)
    assert not readiness.is_ready(tmp_path, "proxy") and readiness.problem(tmp_path, "worker") is None


def test_ready_for_is_the_age_of_a_live_processs_mark(tmp_path: Path) -> None:
    assert readiness.ready_for_s(tmp_path, "worker") is None
    readiness.mark_ready(tmp_path, "worker")
    age = readiness.ready_for_s(tmp_path, "worker")
    assert age is not None and 0 <= age < 5
    readiness.withdraw(tmp_path, "worker")
    assert readiness.ready_for_s(tmp_path, "worker") is None
