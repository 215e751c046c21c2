"""The pool's HTTP routes and the SQL CLI on a seeded pool; every documented example query runs."""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from clawr1.pool.admission import SqlError
from clawr1.pool.api import pool_router
from clawr1.pool.sql import WriteRefused
from clawr1.pool.sql_cli import SqlTarget, interactive, run_sql
from clawr1.pool.store import PoolStore
from clawr1.sinks.rows import (
    DEAD_LETTER_COLUMNS,
    PREFIX_NODE_COLUMNS,
    STEP_COLUMNS,
    Origin,
    prefix_node_row,
    sink_dead_letter_row,
    step_row,
)
from tests.support.asgi import serve_asgi
from tests.support.records import record, step

DOCS = Path(__file__).resolve().parents[3] / "docs" / "pool.md"
NOW = 1_760_000_000_000


def seed(store: PoolStore) -> None:
    origin = Origin("clawr1.steps", 0, 0, None, None)
    steps = []
    for t in range(6):
        for i in range(1 + t % 3):
            steps.append(step(
                f"s{t}-{i}", 1, trajectory_id=f"t{t}", step_index=i, policy_version=t % 3, reward=t / 10,
                reward_status="final", ready=True, token_provenance="engine" if t % 2 else "retokenized",
                source_kind="blackbox_agent" if t < 3 else "whitebox_agent",
                prompt_id="sha256:9f2c4e1ab07d" if (t, i) == (4, 1) else f"p{t}-{i}"))
    store.insert("step_versions", [step_row(s, origin, NOW) for s in steps], STEP_COLUMNS)
    nodes = [record("prefix_node", scope_id=f"g{g}", scope_kind=kind, node_id="n0", token_ids=[1, 2, 3],
                    version=1, total_tokens=30, tree_tokens=12, forks=g, updated_at_ms=NOW)
             for g, kind in enumerate(("prompt_group", "prompt_group", "trajectory"))]
    store.insert("prefix_node_versions", [prefix_node_row(n, origin, NOW) for n in nodes],
                 PREFIX_NODE_COLUMNS)
    dead = [sink_dead_letter_row(Origin("clawr1.steps", 0, o, None, b"\x01"), "undecodable", NOW)
            for o in (1, 2)]
    store.insert("dead_letter_log", dead, DEAD_LETTER_COLUMNS)


@pytest.fixture
def client(pool_store: PoolStore) -> Iterator[TestClient]:
    seed(pool_store)
    app = FastAPI()
    app.include_router(pool_router(pool_store))
    with TestClient(app) as test_client:
        yield test_client


def documented_queries() -> list[str]:
    section = DOCS.read_text().split("### Example queries", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```sql\n(.*?)```", section, re.DOTALL)


def test_every_documented_example_query_answers_rows(client: TestClient) -> None:
    queries = documented_queries()
    assert len(queries) >= 6
    for query in queries:
        reply = client.post("/v1/sql", json={"query": query, "format": "JSONEachRow"})
        assert reply.status_code == 200, (query, reply.text)
        rows = [json.loads(line) for line in reply.text.splitlines()]
        assert rows, f"no rows from the documented query:\n{query}"


def test_example_figures_are_right(client: TestClient) -> None:
    reply = client.post("/v1/sql", json={"query": documented_queries()[0]})
    by_version = {r["policy_version"]: r for r in map(json.loads, reply.text.splitlines())}
    assert {v: r["steps"] for v, r in by_version.items()} == {0: 2, 1: 4, 2: 6}
    dead = client.post("/v1/sql", json={"query": documented_queries()[3]}).text
    assert json.loads(dead.splitlines()[0])["messages"] == 2


def test_sql_formats(client: TestClient) -> None:
    query = "SELECT step_id, reward FROM steps WHERE trajectory_id = 't1' ORDER BY step_id"
    tsv = client.post("/v1/sql", json={"query": query, "format": "TabSeparated"})
    assert tsv.text == "s1-0\t0.1\ns1-1\t0.1\n"
    assert tsv.headers["content-type"].startswith("text/tab-separated-values")
    rows = list(csv.reader(io.StringIO(client.post("/v1/sql", json={"query": query, "format": "CSV"}).text)))
    assert rows == [["s1-0", "0.1"], ["s1-1", "0.1"]]
    whole = client.post("/v1/sql", json={"query": query, "format": "JSON"}).json()
    assert whole["rows"] == 2 and whole["data"][0] == {"step_id": "s1-0", "reward": 0.1}
    arrow = client.post("/v1/sql", json={"query": query, "format": "ArrowStream"})
    table = pa.ipc.open_stream(arrow.content).read_all()
    assert table.column("step_id").to_pylist() == ["s1-0", "s1-1"]


def test_bad_sql_writes_and_limits(client: TestClient) -> None:
    bad = client.post("/v1/sql", json={"query": "SELECT nope FROM steps"})
    assert bad.status_code == 400 and "UNKNOWN_IDENTIFIER" in bad.json()["detail"]
    for write in ("INSERT INTO steps_versions VALUES (1)", "DROP TABLE steps", "SELECT 1; DROP TABLE steps",
                  "SELECT 1 SETTINGS readonly = 0", "SELECT 1 INTO OUTFILE '/tmp/x'",
                  "ALTER TABLE step_versions DELETE WHERE 1"):
        reply = client.post("/v1/sql", json={"query": write})
        assert reply.status_code == 403, (write, reply.text)
    outside = client.post("/v1/sql", json={"query": "SELECT * FROM file('/etc/hostname', 'LineAsString')"})
    assert outside.status_code == 403 and "table function file" in outside.json()["detail"]
    many = client.post("/v1/sql", json={"query": "SELECT number FROM numbers(100)", "max_rows": 10})
    assert many.status_code == 400 and "Limit for result exceeded" in many.json()["detail"]
    unknown = client.post("/v1/sql", json={"query": "SELECT 1", "format": "Pretty"})
    assert unknown.status_code == 400 and "unknown format" in unknown.json()["detail"]
    assert client.post("/v1/sql", json={"query": "  ; "}).status_code == 400
    bound = client.post("/v1/sql", json={"query": "SELECT step_id FROM steps WHERE trajectory_id = {t:String}"
                                                  " ORDER BY step_id", "parameters": {"t": "t1"}})
    assert bound.status_code == 200 and bound.text == '{"step_id":"s1-0"}\n{"step_id":"s1-1"}\n'
    missing = client.post("/v1/sql", json={"query": "SELECT {t:String}"})
    assert missing.status_code == 400
    literal = client.post("/v1/sql", json={"query": "SELECT 'a;b -- DROP' AS s", "format": "TabSeparated"})
    assert literal.status_code == 200 and literal.text == "a;b -- DROP\n"


def test_insert_only_into_consumer_tables(client: TestClient, pool_store: PoolStore) -> None:
    row = {"name": "fresh", "filters_json": '{"ready": true}', "saved_at_ns": 5}
    for _ in range(2):
        reply = client.post("/v1/pool/insert/consumer_presets",
                            json={"rows": [row], "dedup_token": "preset-1"})
        assert reply.status_code == 200 and reply.json() == {"table": "consumer_presets", "rows": 1}
    assert pool_store.query("SELECT name, saved_at_ns FROM consumer_presets FINAL") == [
        {"name": "fresh", "saved_at_ns": 5}]
    refused = client.post("/v1/pool/insert/step_versions", json={"rows": [{"step_id": "x"}]})
    assert refused.status_code == 403 and "not writable" in refused.json()["detail"]
    typo = client.post("/v1/pool/insert/consumer_presets", json={"rows": [{**row, "nmae": "x"}]})
    assert typo.status_code == 400 and "nmae" in typo.json()["detail"]
    wrong_type = client.post("/v1/pool/insert/consumer_presets",
                             json={"rows": [{**row, "saved_at_ns": "soon"}]})
    assert wrong_type.status_code == 400
    assert client.post("/v1/pool/insert/consumer_presets", json={"rowz": []}).status_code == 422


def arrow_body(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_insert_takes_an_arrow_stream(client: TestClient, pool_store: PoolStore) -> None:
    arrow = {"Content-Type": "application/vnd.apache.arrow.stream"}
    rows = pa.table({"group_name": ["g", "g"], "epoch": ["", ""], "step_id": ["a", "b"],
                     "step_version": pa.array([1, 2], pa.int64())})
    reply = client.post("/v1/pool/insert/consumer_commits", content=arrow_body(rows), headers=arrow)
    assert reply.status_code == 200 and reply.json() == {"table": "consumer_commits", "rows": 2}
    assert pool_store.query("SELECT step_id, step_version FROM consumer_commits ORDER BY step_id") == [
        {"step_id": "a", "step_version": 1}, {"step_id": "b", "step_version": 2}]
    garbage = client.post("/v1/pool/insert/consumer_commits", content=b"not arrow", headers=arrow)
    assert garbage.status_code == 400 and "not an Arrow IPC stream" in garbage.json()["detail"]
    ownerless = client.post("/v1/pool/insert/consumer_commits", headers=arrow,
                            content=arrow_body(rows.drop_columns(["group_name"])))
    assert ownerless.status_code == 400 and "group_name" in ownerless.json()["detail"]
    misspelled = rows.rename_columns(["group_name", "epoch", "stepid", "step_version"])
    typo = client.post("/v1/pool/insert/consumer_commits", headers=arrow, content=arrow_body(misspelled))
    assert typo.status_code == 400 and "stepid" in typo.json()["detail"]
    refused = client.post("/v1/pool/insert/step_versions", content=arrow_body(rows), headers=arrow)
    assert refused.status_code == 403


def test_an_arrow_stream_naming_a_column_twice_is_a_400(client: TestClient, pool_store: PoolStore) -> None:
    """Two ``group_name`` columns were a 500 (the owner check could not pick one)."""
    arrow = {"Content-Type": "application/vnd.apache.arrow.stream"}
    for repeated in ("group_name", "epoch"):
        columns = {"group_name": ["trainer"], "epoch": [""], "floor_ms": pa.array([1], pa.int64()),
                   "set_at_ns": pa.array([1], pa.int64())}
        table = pa.Table.from_arrays([*columns.values(), pa.array(["other"])], [*columns, repeated])
        reply = client.post("/v1/pool/insert/consumer_positions", content=arrow_body(table), headers=arrow)
        assert reply.status_code == 400, reply.text
        assert f"{repeated!r} more than once" in reply.json()["detail"]
    assert pool_store.query("SELECT count() AS n FROM consumer_positions") == [{"n": 0}]


@pytest.fixture
def api_url(pool_store: PoolStore) -> Iterator[str]:
    """The router served over real HTTP (tests/support/asgi.py), for the CLI's API path."""
    seed(pool_store)
    app = FastAPI()
    app.include_router(pool_router(pool_store))
    with serve_asgi(app) as server:
        yield server.url


def test_sql_cli_over_the_api_and_directly(api_url: str, pool_store: PoolStore, pool_dsn: str) -> None:
    query = "SELECT count() AS n FROM steps"
    assert run_sql(query, api_url=api_url) == "12\n"
    assert run_sql(query, api_url=api_url, fmt="JSONEachRow") == '{"n":12}\n'
    direct_dsn = f"{pool_dsn}?database={pool_store.database}"
    assert run_sql(query, dsn=direct_dsn, fmt="CSV") == "12\n"
    with pytest.raises(WriteRefused):
        run_sql("DROP TABLE steps", api_url=api_url)
    with pytest.raises(SqlError, match="UNKNOWN_TABLE"):
        run_sql("SELECT * FROM nowhere", dsn=direct_dsn)

    lines = iter(["SELECT count()", "FROM steps;", "SELECT nope;", "", "quit"])
    out: list[str] = []
    target = SqlTarget(api_url=api_url)
    try:
        interactive(target, read=lambda _prompt: next(lines), write=out.append)
    finally:
        target.close()
    assert out[0] == "12"
    assert out[1].startswith("error: HTTP 400") and "nope" in out[1]
