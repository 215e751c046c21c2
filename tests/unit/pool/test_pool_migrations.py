"""The migration list: steps mirror step.avsc, ids are unique, the SDK's migrations run after ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clawr1.pool.consumer_tables import CONSUMER_MIGRATIONS
from clawr1.pool.migrations import POOL_MIGRATIONS, STEP_FIELDS, all_migrations, split_statements

STEP_SCHEMA = Path(__file__).resolve().parents[3] / "schemas" / "step.avsc"


def test_step_columns_mirror_the_step_schema_one_to_one() -> None:
    fields = [f["name"] for f in json.loads(STEP_SCHEMA.read_text())["fields"]]
    assert list(STEP_FIELDS) == fields


def test_consumer_migrations_follow_the_pool_migrations() -> None:
    ids = [migration_id for migration_id, _ in all_migrations()]
    assert ids == [m for m, _ in POOL_MIGRATIONS] + [m for m, _ in CONSUMER_MIGRATIONS]
    assert len(set(ids)) == len(ids)


def test_every_statement_is_rerunnable() -> None:
    for migration_id, sql in all_migrations():
        for statement in split_statements(sql):
            head = " ".join(statement.split()[:8]).upper()
            if head.startswith("INSERT INTO"):
                # A backfill copies only the rows not already there, so repeating it adds nothing.
                assert "NOT IN (SELECT" in " ".join(statement.split()).upper(), (migration_id, head)
                continue
            # Setting a feed's query again sets the same query.
            rerunnable = "IF NOT EXISTS" in head or "OR REPLACE" in head or "MODIFY QUERY" in head
            assert rerunnable or (head.startswith("DROP") and "IF EXISTS" in head), (migration_id, head)


def test_split_statements_cuts_at_line_ending_semicolons_only() -> None:
    sql = "CREATE VIEW a AS SELECT ';' AS s;\nCREATE VIEW b AS SELECT 1;  \n\n"
    assert split_statements(sql) == ["CREATE VIEW a AS SELECT ';' AS s", "CREATE VIEW b AS SELECT 1"]
    assert split_statements("SELECT 1") == ["SELECT 1"]


def test_duplicate_ids_are_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    import clawr1.pool.migrations as migrations

    monkeypatch.setattr(migrations, "CONSUMER_MIGRATIONS", [(POOL_MIGRATIONS[0][0], "SELECT 1")])
    with pytest.raises(ValueError, match="duplicate migration id"):
        migrations.all_migrations()
