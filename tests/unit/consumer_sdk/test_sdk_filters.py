"""Curation filters: validation, JSON round trip, and SQL that binds every user value."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta, timezone

import pytest

from clawr1.consumer_sdk.errors import InvalidFilter, UsageError
from clawr1.consumer_sdk.filters import Filters, filter_sql
from clawr1.consumer_sdk.queries import Scope, steps_sql, whole_groups_sql
from clawr1.pool.migrations import DELIVERY_FILTER_FIELDS, DELIVERY_KEYS, STEP_FIELDS

PLACEHOLDER = re.compile(r"\{(\w+):([^}]+)\}")


def test_defaults_deliver_ready_train_steps_only() -> None:
    clauses, params = filter_sql(Filters(), None)
    assert clauses == ["ready = 1", "NOT hasAny(quality_labels, ['excluded', 'untrainable'])",
                       "channel IN {f_channel:Array(String)}"]
    assert params == {"f_channel": ["train"]}
    everything = Filters(ready=None, channel=None, include_superseded=True, include_excluded=True)
    assert filter_sql(everything, None) == ([], {})
    assert filter_sql(Filters(ready=None, channel=None, include_excluded=True), None)[0] == [
        "link_status != 'superseded'"]
    assert filter_sql(Filters(ready=False), None)[0][0] == "ready = 0"


def test_channel_is_one_name_a_list_or_every_channel() -> None:
    assert Filters.from_kwargs(channel="val").channel == ("val",)
    assert Filters.from_kwargs(channel=["train", "val"]).channel == ("train", "val")
    assert Filters.from_kwargs(channel=None).channel == ()
    assert filter_sql(Filters(channel="val"), None)[1] == {"f_channel": ["val"]}
    # Presets keep only what differs from the defaults: the train default is implicit, "every" is not.
    assert Filters().to_json() == "{}"
    assert Filters.from_json(Filters(channel=None).to_json()).channel == ()
    assert Filters.from_json(Filters(channel="val").to_json()).channel == ("val",)
    with pytest.raises(InvalidFilter, match="channel"):
        Filters.from_kwargs(channel=[""])


def test_every_filter_becomes_a_bound_clause() -> None:
    since = datetime(2026, 1, 1, tzinfo=UTC)
    f = Filters(
        reward_status="final",
        min_reward=0.5,
        max_reward=1,
        quality_labels=["good", "long"],
        exclude_quality_labels="toxic",
        min_quality_score=0.7,
        source_kind=["whitebox_agent"],
        source_name="team-a",
        token_provenance="engine",
        since=since,
        until=since + timedelta(days=1),
        min_policy_version=3,
        max_staleness=2,
    )
    clauses, params = filter_sql(f, current_policy_version=10)
    sql = " AND ".join(clauses)
    bound = dict(PLACEHOLDER.findall(sql))
    assert set(bound) == set(params)
    assert params["f_reward_status"] == ["final"]
    assert params["f_min_reward"] == 0.5 and params["f_max_reward"] == 1.0
    assert params["f_quality_labels"] == ["good", "long"]
    assert params["f_exclude_quality_labels"] == ["toxic"]
    assert params["f_source_name"] == ["team-a"]
    assert params["f_token_provenance"] == ["engine"]
    assert params["f_since"] == int(since.timestamp() * 1000)
    assert params["f_until"] - params["f_since"] == 86_400_000
    assert params["f_min_policy_version"] == 3
    assert params["f_fresh_policy_version"] == 8
    assert bound["f_since"] == "Int64" and bound["f_quality_labels"] == "Array(String)"


def test_filters_read_only_columns_the_delivery_log_keeps() -> None:
    """A ready read picks its range in the delivery log alone, whose payload columns expire."""
    every = Filters(reward_status="final", min_reward=0.5, max_reward=1, quality_labels="good",
                    exclude_quality_labels="toxic", min_quality_score=0.7, source_kind="whitebox_agent",
                    source_name="a", token_provenance="engine", since=1, until=2, min_policy_version=3,
                    max_staleness=2, channel="val")
    clauses = filter_sql(every, current_policy_version=10)[0] + filter_sql(Filters(ready=None), 1)[0]
    read = {name for name in STEP_FIELDS if re.search(rf"\b{name}\b", " AND ".join(clauses))}
    kept = {*DELIVERY_KEYS, *DELIVERY_FILTER_FIELDS}
    assert read and read <= kept, read - kept


def test_user_values_never_reach_sql_text() -> None:
    hostile = "x') OR 1=1 --"
    f = Filters(source_name=hostile, quality_labels=[hostile])
    clauses, params = filter_sql(f, None)
    assert all(hostile not in c for c in clauses)
    assert hostile in params["f_source_name"]
    scope = Scope(group=hostile, epoch=hostile, floor_ms=0, in_flight=(hostile,), member=1, members=3)
    for sql, scope_params in (
        steps_sql("*", clauses, scope, 10, 100),
        whole_groups_sql("*", clauses, scope, 10, 100, 2),
    ):
        assert hostile not in sql
        assert set(dict(PLACEHOLDER.findall(sql))) <= set(params) | set(scope_params)
        assert scope_params["c_group"] == hostile


def test_max_staleness_needs_a_reported_version() -> None:
    with pytest.raises(UsageError, match="report_policy_version"):
        filter_sql(Filters(max_staleness=1), None)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"reward_status": "done"}, "reward_status"),
        ({"source_kind": ["robot"]}, "source_kind"),
        ({"token_provenance": "guessed"}, "token_provenance"),
        ({"min_reward": "high"}, "min_reward"),
        ({"min_reward": True}, "min_reward"),
        ({"min_policy_version": 1.5}, "min_policy_version"),
        ({"max_staleness": -1}, "max_staleness"),
        ({"min_reward": 2, "max_reward": 1}, "min_reward"),
        ({"since": datetime(2026, 1, 1)}, "timezone-aware"),
        ({"since": 10, "until": 5}, "before"),
        ({"quality_labels": [""]}, "non-empty"),
        ({"quality_labels": {"a": 1}}, "quality_labels"),
        ({"ready": "yes"}, "ready"),
        ({"reward": 1}, "unknown filter"),
    ],
)
def test_bad_filters_are_refused_with_the_name(kwargs: dict, needle: str) -> None:
    with pytest.raises(InvalidFilter, match=needle):
        Filters.from_kwargs(**kwargs)


def test_json_round_trip_keeps_only_what_differs() -> None:
    tz = timezone(timedelta(hours=2))
    f = Filters(reward_status=("final",), token_provenance="engine", min_reward=0.0,
                since=datetime(2026, 3, 1, 12, tzinfo=tz))
    text = f.to_json()
    assert json.loads(text) == {
        "min_reward": 0.0,
        "reward_status": ["final"],
        "since": int(datetime(2026, 3, 1, 10, tzinfo=UTC).timestamp() * 1000),
        "token_provenance": ["engine"],
    }
    assert Filters.from_json(text) == f
    assert Filters.from_json(Filters().to_json()) == Filters()


def test_merged_refines_a_preset() -> None:
    base = Filters(token_provenance="engine", reward_status="final")
    refined = base.merged(min_reward=0.2, reward_status=None)
    assert refined.token_provenance == ("engine",)
    assert refined.reward_status == ()
    assert refined.min_reward == 0.2


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"colour": "red"}'])
def test_corrupt_stored_filters_are_reported(text: str) -> None:
    with pytest.raises(InvalidFilter):
        Filters.from_json(text)


def test_membership_partition_appears_only_for_several_members() -> None:
    one = Scope("g", "", 0, (), 0, 1)
    three = Scope("g", "", 0, (), 2, 3)
    assert "cityHash64" not in steps_sql("*", [], one, 5, None)[0]
    assert "cityHash64(step_id)" in steps_sql("*", [], three, 5, None)[0]
    assert "cityHash64(prompt_group_id)" in whole_groups_sql("*", [], three, 5, None, None)[0]
