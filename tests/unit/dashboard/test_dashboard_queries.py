"""The dashboard's SQL text: filters bind values through placeholders, never splice them in."""

from __future__ import annotations

import re

import pytest

from clawr1.dashboard import queries
from clawr1.dashboard.api import StepsPage


def test_filters_become_typed_placeholders_with_bound_values() -> None:
    where, params = queries.steps_where({"source_name": "x' OR 1=1 --", "ready": True})
    assert where == "WHERE ready = {f_ready:UInt8} AND source_name = {f_source_name:String}"
    assert params == {"f_ready": 1, "f_source_name": "x' OR 1=1 --"}
    assert queries.steps_where({}) == ("", {})


def test_an_unknown_filter_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="colour"):
        queries.steps_where({"colour": "red"})


def test_a_page_binds_its_limit_and_offset() -> None:
    sql, params = queries.steps_page_sql({"trajectory_id": "t"}, 10, 20)
    assert params == {"f_trajectory_id": "t", "limit": 10, "offset": 20}
    assert "{limit:UInt32}" in sql and "{offset:UInt64}" in sql and "'t'" not in sql
    count_sql, count_params = queries.steps_count_sql({"trajectory_id": "t"})
    assert count_params == {"f_trajectory_id": "t"} and count_sql.endswith("{f_trajectory_id:String}")


def test_the_api_accepts_exactly_the_filters_the_queries_know() -> None:
    assert set(StepsPage.model_fields) == {"limit", "offset", *queries.STEP_FILTERS}


def test_every_statement_binds_user_input_through_placeholders_only() -> None:
    statements = {name: value for name, value in vars(queries).items() if name.endswith("_SQL")}
    assert len(statements) >= 20
    for name, sql in statements.items():
        # Python formatting leaves no {name} holes; ClickHouse placeholders all carry a type.
        holes = re.findall(r"\{([^{}]*)\}", sql)
        assert all(re.fullmatch(r"\w+:\w+(\(\w+\))?", hole) for hole in holes), (name, holes)
