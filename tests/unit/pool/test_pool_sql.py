"""The guard's pure parts: function catalogue resolution, canonical-shape statements, session settings."""

from __future__ import annotations

import pytest

from clawr1.pool.sql import SqlLimits
from clawr1.pool.sql_guard import Catalogue, GuardRefusal, check_canonical


def row(name: str, category: str, alias_to: str = "", case_insensitive: int = 0, aggregate: int = 0) -> dict:
    return {"name": name, "categories": category, "alias_to": alias_to, "case_insensitive": case_insensitive,
            "is_aggregate": aggregate}


CATALOGUE = Catalogue.build([
    row("sum", "Aggregate Functions", case_insensitive=1, aggregate=1),
    row("uniqExact", "Aggregate Functions", aggregate=1),
    row("plus", "Arithmetic"),
    row("file", "Other"),
    row("hostName", "Other"),
    row("hostname", "", alias_to="hostName"),
    row("lcase", "", alias_to="lower", case_insensitive=1),
    row("lower", "String", case_insensitive=1),
    row("caseWithExpression", "Internal"),
    row("aiGenerate", "AI"),
    row("newThing", "Some Future Category"),
], ["If", "Array", "State", "Merge", "OrNull"])


@pytest.mark.parametrize("name", ["sum", "SUM", "sumIf", "SUMIf", "sumArrayIf", "uniqExactStateMerge", "plus",
                                  "lcase", "LCASE", "lower", "caseWithExpression"])
def test_pure_functions_aliases_and_combinators_pass(name: str) -> None:
    assert CATALOGUE.allows(name)


@pytest.mark.parametrize("name", ["file", "FILE", "hostname", "hostName", "aiGenerate", "newThing", "plusIf",
                                  "fileIf", "unknown", "uniqexact", "If", "db.sum"])
def test_outside_reaching_unknown_and_non_aggregate_combinations_are_refused(name: str) -> None:
    assert not CATALOGUE.allows(name)


@pytest.mark.parametrize(("canonical", "runs"), [
    ("DESCRIBE TABLE steps", "DESCRIBE TABLE `steps`"),
    ("DESCRIBE TABLE pool.steps", "DESCRIBE TABLE `steps`"),
    ("EXISTS TABLE steps", "EXISTS TABLE `steps`"),
    ("SHOW CREATE VIEW steps", "SHOW CREATE VIEW `steps`"),
])
def test_describe_exists_show_create_of_a_pool_table_are_rebuilt(canonical: str, runs: str) -> None:
    assert check_canonical(canonical, "pool").text == runs


@pytest.mark.parametrize("canonical", [
    "DESCRIBE TABLE system.processes", "DESCRIBE TABLE (SELECT 1)", "DESCRIBE TABLE steps SETTINGS x = 1",
    "DESCRIBE TABLE steps FORMAT JSON", "DESCRIBE TABLE `a b`", "EXISTS DATABASE system",
    "SHOW CREATE USER default", "SHOW PROCESSLIST", "INSERT INTO steps VALUES (1)", "",
])
def test_other_statements_without_json_are_refused(canonical: str) -> None:
    with pytest.raises(GuardRefusal):
        check_canonical(canonical, "pool")


def test_session_settings_end_read_only_after_the_limits() -> None:
    settings = SqlLimits(max_execution_time=5, max_result_rows=10).session_settings()
    assert list(settings)[-1] == "readonly" and settings["readonly"] == 1
    assert settings["max_execution_time"] == 5.0 and settings["max_result_rows"] == 10
    assert {"max_memory_usage", "max_result_bytes", "max_rows_to_read"} <= set(settings)
