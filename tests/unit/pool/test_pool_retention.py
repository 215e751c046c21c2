"""The retention and prune SQL builders (pure): TTL statements from settings, prune's keys and deletions."""

from __future__ import annotations

import pytest

from clawr1.core.registry import SettingsError
from clawr1.core.settings import load_settings
from clawr1.pool.cluster import cluster_statements
from clawr1.pool.prune import (
    KEY_KINDS,
    TABLES,
    PruneError,
    PruneFilter,
    chosen_keys_sql,
    count_sql,
    delete_sql,
    doomed_sql,
    fill_keys_sql,
    parse_age,
    report,
)
from clawr1.pool.retention import Retention, current_ttl, ttl_statements


@pytest.mark.parametrize(("text", "seconds"), [("30d", 30 * 86400), ("12h", 43200), ("90m", 5400),
                                               ("45s", 45), ("2w", 14 * 86400), (" 1.5d ", 1.5 * 86400)])
def test_ages_read_as_seconds(text: str, seconds: float) -> None:
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["30", "30 days", "-1d", "0d", "d", "1y", ""])
def test_malformed_ages_are_refused_with_an_example(text: str) -> None:
    with pytest.raises(PruneError, match="e.g. 30d"):
        parse_age(text)


def test_a_prune_without_a_filter_is_refused() -> None:
    with pytest.raises(PruneError, match="needs a filter"):
        PruneFilter().condition()
    with pytest.raises(PruneError, match="channel must not be empty"):
        PruneFilter(channel="").condition()
    with pytest.raises(PruneError, match="age must be positive"):
        PruneFilter(older_than_s=0).condition()


def test_filters_combine_with_and_and_an_unknown_value_never_matches() -> None:
    condition, params = PruneFilter(older_than_s=1.5, policy_version_below=3, channel="val").condition()
    assert condition == ("ifNull(ingested_at < now64(3) - toIntervalMillisecond({p_age_ms:UInt64}) AND "
                         "policy_version < {p_policy:Int64} AND channel = {p_channel:String}, 0)")
    assert params == {"p_age_ms": 1500, "p_policy": 3, "p_channel": "val"}
    assert PruneFilter(policy_version_below=0).condition() == (
        "ifNull(policy_version < {p_policy:Int64}, 0)", {"p_policy": 0})


def test_keys_left_without_steps_are_those_whose_every_step_matches() -> None:
    assert chosen_keys_sql("step", "M") == "SELECT trajectory_id, step_id AS id FROM steps WHERE M"
    for kind, column in (("trajectory", "trajectory_id"), ("prompt_group", "prompt_group_id"),
                         ("response", "response_id")):
        sql = chosen_keys_sql(kind, "M")
        assert f"WHERE {column} IN (SELECT {column} FROM steps WHERE M AND {column} != '')" in sql
        assert f"GROUP BY {column} HAVING min(M) = 1" in sql
    assert chosen_keys_sql("trajectory", "M").startswith("SELECT id AS trajectory_id, id FROM")
    with pytest.raises(ValueError, match="no key kind"):
        chosen_keys_sql("node", "M")


def test_the_keys_are_chosen_in_one_statement() -> None:
    sql = fill_keys_sql("M")
    assert sql.startswith("INSERT INTO prune_keys (prune_id, kind, trajectory_id, id) SELECT {p_id:String}")
    assert sql.count(" UNION ALL ") == len(KEY_KINDS) - 1
    assert all(f"SELECT '{kind}' AS kind" in sql for kind in KEY_KINDS)


def test_deletions_read_only_the_chosen_keys() -> None:
    for table in TABLES:
        sql = delete_sql(table)
        assert sql.startswith(f"DELETE FROM {table} WHERE ")
        assert "FROM steps" not in sql and "FROM prune_keys WHERE prune_id = {p_id:String}" in sql


def test_what_each_table_loses() -> None:
    def keys(kind: str) -> str:
        return f"K_{kind}"

    assert doomed_sql("step_versions", keys) == "(trajectory_id, step_id) IN (K_step)"
    assert doomed_sql("delivery_log", keys) == "(trajectory_id, step_id) IN (K_step)"
    assert doomed_sql("consumer_commits", keys) == "step_id IN (SELECT id FROM (K_step))"
    assert doomed_sql("feedback_log", keys) == (
        "(target_kind = 'step' AND target_id IN (SELECT id FROM (K_step))) OR (target_kind = 'response' AND "
        "target_id IN (SELECT id FROM (K_response))) OR (target_kind = 'trajectory' AND target_id IN "
        "(SELECT id FROM (K_trajectory)))")
    assert doomed_sql("prefix_node_versions", keys) == (
        "(scope_kind = 'trajectory' AND scope_id IN (SELECT id FROM (K_trajectory))) OR "
        "(scope_kind = 'prompt_group' AND scope_id IN (SELECT id FROM (K_prompt_group)))")
    assert doomed_sql("step_lookup", keys) == "trajectory_id IN (SELECT id FROM (K_trajectory))"
    with pytest.raises(ValueError, match="does not delete"):
        doomed_sql("dead_letter_log", keys)
    assert count_sql(keys).count("SELECT count() FROM") == len(TABLES)


def test_the_log_goes_before_the_steps_and_the_steps_before_what_hangs_on_them() -> None:
    assert TABLES.index("delivery_log") < TABLES.index("step_versions") < min(
        TABLES.index(t) for t in ("consumer_commits", "feedback_log", "prefix_node_versions", "step_lookup"))


def test_the_report_names_every_table() -> None:
    text = report({"step_versions": 3, "step_lookup": 9}, dry_run=True)
    assert text.splitlines() == ["dry run, nothing deleted; rows a prune would delete:",
                                 "  step_versions  3", "  step_lookup    9"]
    assert report({"step_versions": 3}, dry_run=False).startswith("rows deleted:")


def test_step_data_is_kept_and_transient_tables_are_bounded_by_default() -> None:
    ttls = Retention().table_ttls()
    assert {t for t, ttl in ttls.items() if ttl is None} == {
        "step_versions", "feedback_log", "prefix_node_versions", "consumer_commits", "step_lookup"}
    assert ttls["delivery_log"] == "toDateTime(logged_at) + toIntervalDay(30)"
    assert ttls["dead_letter_log"] == "toDateTime(ingested_at) + toIntervalDay(30)"


def test_the_lookup_outlives_the_steps_it_points_at_by_a_day() -> None:
    ttls = Retention(step_days=7).table_ttls()
    assert ttls["step_versions"] == "toDateTime(ingested_at) + toIntervalDay(7)"
    assert ttls["consumer_commits"] == "toDateTime(committed_at) + toIntervalDay(7)"
    assert ttls["step_lookup"] == "indexed_on + toIntervalDay(8)"


def test_retention_reads_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLAWR1_POOL_STEP_TTL_DAYS", "90")
    monkeypatch.setenv("CLAWR1_POOL_DELIVERY_LOG_TTL_DAYS", "0")
    monkeypatch.setenv("CLAWR1_POOL_DEAD_LETTER_TTL_DAYS", "7")
    assert Retention.from_settings(load_settings()) == Retention(90, 0, 7)
    monkeypatch.setenv("CLAWR1_POOL_STEP_TTL_DAYS", "-1")
    with pytest.raises(SettingsError, match="CLAWR1_POOL_STEP_TTL_DAYS must be 0 or more"):
        Retention.from_settings(load_settings())


def test_a_table_ttl_is_read_from_the_engine_description() -> None:
    assert current_ttl("ReplacingMergeTree ORDER BY dlq_id SETTINGS index_granularity = 8192") is None
    ttl = "toDateTime(logged_at) + toIntervalDay(30)"
    assert current_ttl(f"MergeTree ORDER BY logged_at TTL {ttl} SETTINGS index_granularity = 8") == ttl
    replicated = ("ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/db/t', '{replica}', version) "
                  "ORDER BY id TTL indexed_on + toIntervalDay(8)")
    assert current_ttl(replicated) == "indexed_on + toIntervalDay(8)"


def test_only_tables_whose_ttl_differs_are_altered() -> None:
    wanted = {"a": "x + toIntervalDay(1)", "b": None, "c": "y + toIntervalDay(2)", "d": None}
    current = {"a": "x + toIntervalDay(1)", "b": "z + toIntervalDay(3)", "c": "y + toIntervalDay(9)",
               "d": None}
    assert ttl_statements(current, wanted) == ["ALTER TABLE b REMOVE TTL",
                                               "ALTER TABLE c MODIFY TTL y + toIntervalDay(2)"]


def test_on_a_cluster_a_ttl_is_the_local_tables() -> None:
    ttl = "toDateTime(ingested_at) + toIntervalDay(7)"
    assert cluster_statements(f"ALTER TABLE step_versions MODIFY TTL {ttl}", "c1", "pool") == [
        f"ALTER TABLE pool.step_versions_local ON CLUSTER c1 MODIFY TTL {ttl}"]
    assert cluster_statements("ALTER TABLE step_lookup REMOVE TTL", "c1", "pool") == [
        "ALTER TABLE pool.step_lookup_local ON CLUSTER c1 REMOVE TTL"]
