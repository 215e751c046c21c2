"""X-Claw-* hints: parsed case-insensitively, malformed values refused with the header's name."""

from __future__ import annotations

import pytest

from clawr1.proxy.hints import HintError, Hints, hint_header_names, parse_hints


def test_all_hints_are_read() -> None:
    hints = parse_hints(
        [
            ("X-Claw-Trajectory-Id", "traj-1"),
            ("x-claw-prompt-group-id", "g"),
            ("X-CLAW-PROMPT-GROUP-SIZE", "8"),
            ("X-Claw-Policy-Version", "12"),
            ("X-Claw-Agent", "swe"),
            ("X-Claw-Terminal", "true"),
            ("Other", "x"),
        ]
    )
    assert hints == Hints("traj-1", "g", 8, 12, "swe", True)
    assert parse_hints([]) == Hints()


@pytest.mark.parametrize(
    ("header", "value", "reason"),
    [
        ("X-Claw-Prompt-Group-Size", "eight", "X-Claw-Prompt-Group-Size must be an integer"),
        ("X-Claw-Prompt-Group-Size", "0", "X-Claw-Prompt-Group-Size must be an integer >= 1"),
        ("X-Claw-Policy-Version", "-1", "X-Claw-Policy-Version must be an integer >= 0"),
        ("X-Claw-Terminal", "maybe", "X-Claw-Terminal must be true or false"),
        ("X-Claw-Trajectory-Id", "  ", "X-Claw-Trajectory-Id: an id has 1 to 256 characters"),
        ("X-Claw-Trajectory-Id", "t\x01x", "X-Claw-Trajectory-Id: an id holds no control character"),
        ("X-Claw-Agent", "a\x85b", "X-Claw-Agent: an id holds no control character"),
    ],
)
def test_malformed_hints_name_the_header(header: str, value: str, reason: str) -> None:
    with pytest.raises(HintError, match=reason):
        parse_hints([(header, value)])


def test_every_claw_header_is_found_for_stripping() -> None:
    assert hint_header_names(["X-Claw-Agent", "x-claw-future", "Authorization"]) == [
        "X-Claw-Agent",
        "x-claw-future",
    ]
