"""The dashboard's pure shaping: bucket widths, zero-filled timelines, histograms, JSON-safe values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clawr1.dashboard.panels import (
    BUCKET_WIDTHS_MS,
    MAX_BUCKETS,
    bucket_width_ms,
    channel_totals,
    consumer_group,
    engine_rows,
    fill_timeline,
    histogram_edges,
    json_safe,
    parse_json_text,
    prefix_overall,
    provenance_mix,
    reward_histogram,
    timeline_window,
)
from clawr1.proxy.engine_files import EngineFiles, snapshot


@pytest.mark.parametrize(
    ("span_ms", "width"),
    [
        (0, 1_000),
        (59_000, 1_000),
        (60_000, 5_000),
        (295_000, 5_000),
        (300_000, 10_000),
        (3_540_000, 60_000),
        (3_600_000, 300_000),
        (86_400_000, 3_600_000),
    ],
)
def test_bucket_width_is_the_smallest_round_width_fitting_the_span(span_ms: int, width: int) -> None:
    assert bucket_width_ms(span_ms) == width


def test_a_span_too_long_for_any_width_gets_the_widest() -> None:
    assert bucket_width_ms(10**13) == BUCKET_WIDTHS_MS[-1]


@given(first=st.integers(0, 2 * 10**12), span=st.integers(0, 10**11))
def test_the_window_ends_with_the_newest_step_and_holds_at_most_max_buckets(first: int, span: int) -> None:
    last = first + span
    width, since, count = timeline_window(first, last)
    assert 1 <= count <= MAX_BUCKETS
    assert since % width == 0
    assert since <= last < since + count * width
    if count < MAX_BUCKETS:  # the whole span fits: the first step is in the first bucket
        assert since <= first < since + width


def test_fill_timeline_zero_fills_and_sums_sources_into_their_kind() -> None:
    rows = [
        {
            "bucket_start_ms": 1000,
            "source_kind": "whitebox_agent",
            "source_name": "a",
            "steps": 2,
            "failed": 0,
        },
        {
            "bucket_start_ms": 1000,
            "source_kind": "whitebox_agent",
            "source_name": "b",
            "steps": 1,
            "failed": 1,
        },
        {
            "bucket_start_ms": 3000,
            "source_kind": "blackbox_agent",
            "source_name": "p",
            "steps": 4,
            "failed": 2,
        },
        {
            "bucket_start_ms": 9000,
            "source_kind": "blackbox_agent",
            "source_name": "p",
            "steps": 7,
            "failed": 0,
        },
    ]
    timeline = fill_timeline(rows, since_ms=1000, width_ms=1000, count=3)
    assert timeline["buckets"] == [1000, 2000, 3000]
    assert timeline["by_kind"] == [
        {"source_kind": "blackbox_agent", "channel": "proxy", "steps": [0, 0, 4], "failed": [0, 0, 2]},
        {"source_kind": "whitebox_agent", "channel": "gateway", "steps": [3, 0, 0], "failed": [1, 0, 0]},
    ]
    assert [(s["source_name"], s["steps"]) for s in timeline["by_source"]] == [
        ("p", [0, 0, 4]),
        ("a", [2, 0, 0]),
        ("b", [1, 0, 0]),
    ]


def test_channels_are_always_listed_and_unknown_kinds_go_to_other() -> None:
    totals = channel_totals(
        [
            {"source_kind": "blackbox_service", "steps": 3, "failed": 1},
            {"source_kind": "replay", "steps": 2, "failed": 0},
        ]
    )
    assert totals == [
        {"channel": "proxy", "steps": 0, "failed": 0},
        {"channel": "gateway", "steps": 0, "failed": 0},
        {"channel": "service", "steps": 3, "failed": 1},
        {"channel": "otel", "steps": 0, "failed": 0},
        {"channel": "other", "steps": 2, "failed": 0},
    ]


def test_provenance_mix_lists_the_known_kinds_first() -> None:
    mix = provenance_mix(
        [
            {"token_provenance": "zz", "steps": 1, "prompt_tokens": 2, "response_tokens": 3},
            {"token_provenance": "engine", "steps": 4, "prompt_tokens": 5, "response_tokens": 6},
        ]
    )
    assert [(m["token_provenance"], m["steps"]) for m in mix] == [
        ("engine", 4),
        ("retokenized", 0),
        ("none", 0),
        ("zz", 1),
    ]


def test_histogram_edges_span_the_range_in_equal_bins() -> None:
    assert histogram_edges(0.0, 1.0, 4) == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert histogram_edges(2.0, 2.0, 3) == [2.0, 2.0, 2.0, 2.0]


def test_reward_histogram_keeps_version_order_and_fills_empty_bins() -> None:
    rows = [{"policy_version": 3, "bin": 1, "steps": 2}, {"policy_version": None, "bin": 0, "steps": 5}]
    histogram = reward_histogram(rows, 0.0, 1.0, 2)
    assert histogram["versions"] == [
        {"policy_version": 3, "counts": [0, 2]},
        {"policy_version": None, "counts": [5, 0]},
    ]
    assert reward_histogram([], None, None, 2)["edges"] == []


def test_json_safe_turns_nan_and_infinity_into_null_everywhere() -> None:
    value = {"a": math.nan, "b": [1.5, math.inf, {"c": -math.inf}], "d": (1, "x")}
    cleaned = json_safe(value)
    assert cleaned == {"a": None, "b": [1.5, None, {"c": None}], "d": [1, "x"]}
    json.dumps(cleaned, allow_nan=False)


def test_prefix_overall_is_zero_before_any_merge() -> None:
    assert prefix_overall([])["total_tokens"] == 0
    row = {
        "scope_kind": "all",
        "scopes": 1,
        "total_tokens": 9,
        "tree_tokens": 3,
        "saved_tokens": 6,
        "savings_ratio": 3.0,
        "forks": 0,
    }
    assert prefix_overall([{**row, "scope_kind": "trajectory"}, row]) == row


def test_a_group_without_commits_has_no_last_commit_time() -> None:
    assert consumer_group({"group_name": "g", "last_commit_ms": 0})["last_commit_ms"] is None
    assert consumer_group({"group_name": "g", "last_commit_ms": 7})["last_commit_ms"] == 7


def test_json_columns_are_parsed_and_broken_json_is_kept_as_text() -> None:
    assert parse_json_text('[{"role": "user"}]') == [{"role": "user"}]
    assert parse_json_text("not json {") == "not json {"


def test_engines_join_what_the_proxy_holds_with_what_the_pool_holds(tmp_path: Path) -> None:
    """Two proxy processes write their tables; the dashboard adds their counts up, takes the state and the
    resumed version from them, and calls and steps from the pool; an engine that served nothing yet shows."""
    files = [EngineFiles(tmp_path, process=i, processes=2) for i in range(2)]
    row = {"failures": 0, "rollouts": 1, "served": 3}
    files[0].write_status(1, [{**row, "engine": "http://a", "state": "serving", "in_flight": 1,
                               "policy_version": 7},
                              {**row, "engine": "http://c", "state": "serving", "in_flight": 0,
                               "policy_version": None}])
    files[1].write_status(1, [{**row, "engine": "http://a", "state": "serving", "in_flight": 2,
                               "policy_version": 7},
                              {**row, "engine": "http://c", "state": "out", "in_flight": 0,
                               "policy_version": None}])
    pooled = [{"engine": "http://a", "steps": 40, "failed": 1, "last_minute": 30, "policy_version": 6,
               "last_step_ms": 5},
              {"engine": "http://b", "steps": 2, "failed": 0, "last_minute": 0, "policy_version": None,
               "last_step_ms": 1}]
    rows = {r["engine"]: r for r in engine_rows(pooled, snapshot(tmp_path))}
    assert rows["http://a"] == {"engine": "http://a", "state": "serving", "in_flight": 3, "steps": 40,
                                "failed": 1, "calls_per_s": 0.5, "policy_version": 7, "last_step_ms": 5}
    assert rows["http://b"]["state"] is None and rows["http://b"]["steps"] == 2  # no proxy lists it now
    assert rows["http://c"]["state"] == "out" and rows["http://c"]["steps"] == 0
    assert snapshot(tmp_path / "no-proxy") == []
