"""One id rule for every way in: 1 to 256 characters, no control character or line separator."""

from __future__ import annotations

import pytest

from clawr1.core.ids import ID_MAX, id_problem


@pytest.mark.parametrize("value", ["t-1", "é/ü 空 trajectory", "a" * ID_MAX, "svc/turn-0", "x y\u00a0z"])
def test_ordinary_ids_pass(value: str) -> None:
    assert id_problem(value) is None


@pytest.mark.parametrize(("value", "reason"), [
    ("traj\r\nX-Injected: 1", "'\\r' at position 4"),  # stored, then 404 in the dashboard
    ("a\nb", "'\\n' at position 1"), ("\x00", "'\\x00' at position 0"), ("a\x7f", "'\\x7f'"),
    ("a\x85", "'\\x85'"), ("a\u2028b", "'\\u2028'"), ("a\tb", "'\\t'"),
    ("", "1 to 256 characters, this one 0"), ("a" * (ID_MAX + 1), "this one 257"),
])
def test_control_characters_and_lengths_are_refused_with_the_reason(value: str, reason: str) -> None:
    problem = id_problem(value)
    assert problem is not None and reason in problem, problem
