"""The read-only statement check: clear refusals before anything reaches ClickHouse."""

from __future__ import annotations

import pytest

from pool.sql import SqlError, SqlLimits, WriteRefused, check_read_only


@pytest.mark.parametrize("sql", [
    "SELECT 1",
    "  select * from steps;  ",
    "WITH t AS (SELECT 1) SELECT * FROM t",
    "(SELECT 1) UNION ALL (SELECT 2)",
    "SHOW TABLES", "DESCRIBE TABLE steps", "DESC steps", "EXISTS TABLE steps",
    "EXPLAIN indexes = 1 SELECT * FROM steps WHERE prompt_id = 'x'",
    "SELECT 'DROP TABLE x; --' AS s",
    "-- a comment; with a semicolon\nSELECT 1",
    "/* INSERT */ SELECT 1",
    "SELECT 'format JSON'",
])
def test_reads_pass(sql: str) -> None:
    assert check_read_only(sql) == sql.strip().rstrip(";").rstrip()


@pytest.mark.parametrize("sql", [
    "INSERT INTO steps VALUES (1)",
    "drop table steps",
    "ALTER TABLE step_versions DELETE WHERE 1",
    "TRUNCATE TABLE steps",
    "CREATE TABLE x (a UInt8) ENGINE = Memory",
    "SET readonly = 0",
    "OPTIMIZE TABLE step_versions FINAL",
    "SYSTEM FLUSH LOGS",
    "SELECT 1; DROP TABLE steps",
    "SELECT 1 SETTINGS readonly = 0",
    "SELECT * FROM steps INTO OUTFILE '/tmp/x'",
])
def test_writes_and_escapes_are_refused(sql: str) -> None:
    with pytest.raises(WriteRefused):
        check_read_only(sql)


def test_empty_and_own_format_are_bad_requests_not_refusals() -> None:
    for sql in ("", "  ;  ", "-- only a comment"):
        with pytest.raises(SqlError) as caught:
            check_read_only(sql)
        assert not isinstance(caught.value, WriteRefused)
    with pytest.raises(SqlError, match="FORMAT"):
        check_read_only("SELECT 1 FORMAT JSON")


def test_limits_clause_starts_on_its_own_line_and_ends_read_only() -> None:
    clause = SqlLimits(max_execution_time=5, max_result_rows=10).clause()
    assert clause.startswith("\nSETTINGS ")
    assert "max_execution_time = 5.0" in clause and "max_result_rows = 10" in clause
    assert clause.endswith("readonly = 1")
