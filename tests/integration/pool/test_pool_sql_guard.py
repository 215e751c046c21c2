"""The analyst SQL guard against an attacker holding a read key, over live HTTP on a real chDB pool.

Every corpus entry must answer 4xx; afterwards the pool's tables and row counts are unchanged, the
corpus's target file does not exist, a local listener saw no connection, and ordinary queries still
answer. A hypothesis fuzz recombines the corpus: whatever the guard lets through runs in the read-only
session without writing, reading files or reaching the network.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawr1.pool.sql import AnalystSql, SqlError, SqlLimits, WriteRefused
from clawr1.pool.sql_guard import TABLE_FUNCTIONS
from clawr1.pool.store import PoolStore
from tests.integration.pool.test_pool_api import api_url  # noqa: F401  (the live-HTTP fixture)


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP port on 127.0.0.1 that no query may reach."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    server.setblocking(False)
    try:
        yield server
    finally:
        server.close()


def reached(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
    except BlockingIOError:
        return False
    return True


def pool_state(store: PoolStore) -> dict[str, int | None]:
    """Every table and view of the pool with its row count (None for views)."""
    rows = store.query("SELECT name, total_rows FROM system.tables WHERE database = {db:String}",
                       parameters={"db": store.database})
    return {row["name"]: row["total_rows"] for row in rows}


_ANALYSTS: dict[str, AnalystSql] = {}


def analyst_for(store: PoolStore) -> AnalystSql:
    """One analyst per test database, so fuzz examples share its sessions and catalogue."""
    if store.database not in _ANALYSTS:
        _ANALYSTS[store.database] = AnalystSql(store.dsn, store.database, SqlLimits(max_execution_time=5))
    return _ANALYSTS[store.database]


CORPUS = [
    # heredocs and tagged heredocs hiding a second statement, a write, a file
    "SELECT $$'$$; DROP TABLE IF EXISTS step_versions; SELECT 1 --'",
    "SELECT $a$'$a$; DROP TABLE step_versions; SELECT $a$'$a$",
    "SELECT $$x$$ INTO OUTFILE '{file}'",
    "SELECT $t$a$t$ AS x; INSERT INTO consumer_presets (name) VALUES ('x')",
    "SELECT $$ $$ || file('{file}')",
    # comments of every kind
    "SELECT 1 -- ;\n; DROP TABLE step_versions",
    "SELECT 1 #!\n; DROP TABLE step_versions",
    "SELECT 1 # x\n; DROP TABLE step_versions",
    "SELECT 1 /* /* */ ; DROP TABLE step_versions */ ; DROP TABLE step_versions",
    "/* nested /* */ */ DROP TABLE step_versions",
    "SELECT 1 /* unterminated ; DROP TABLE step_versions",
    "--\nDROP TABLE step_versions",
    # backslash escapes
    "SELECT 'a\\\\'; DROP TABLE step_versions; --'",
    "SELECT \"a\\\"; DROP TABLE step_versions; --\"",
    "SELECT `a\\`; DROP TABLE step_versions; --`",
    # multi-statements
    "SELECT 1; SELECT 2",
    "SELECT 1;;DROP TABLE step_versions",
    "SELECT 1 PARALLEL WITH DROP TABLE step_versions",
    # files, network, processes, other servers
    "SELECT file('/proc/self/environ')",
    "SELECT file('{file}')",
    "SELECT FILE('/etc/passwd')",
    "SELECT `file`('/etc/passwd')",
    "SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "DESCRIBE url('http://127.0.0.1:{port}/x', 'CSV')",
    "DESCRIBE (SELECT * FROM url('http://127.0.0.1:{port}/x', 'CSV', 'a String'))",
    "SELECT * FROM url('http://127.0.0.1:{port}/', CSV, 'a String')",
    "SELECT * FROM remote('127.0.0.1:{port}', system.one)",
    "SELECT * FROM s3('http://127.0.0.1:{port}/b/k', 'CSV', 'a String')",
    "SELECT * FROM mysql('127.0.0.1:{port}', 'd', 't', 'u', 'p')",
    "SELECT * FROM postgresql('127.0.0.1:{port}', 'd', 't', 'u', 'p')",
    "SELECT * FROM executable('id', 'TSV', 'a String')",
    "SELECT * FROM input('a String')",
    "SELECT * FROM view(SELECT * FROM file('/etc/passwd', 'LineAsString'))",
    "SELECT * FROM merge('system', '.*')",
    "SELECT * FROM cluster('default', system.one)",
    "SELECT * FROM python('x')",
    "SELECT * FROM numbers(1) WHERE 1 IN (SELECT 1 FROM url('http://127.0.0.1:{port}/', CSV, 'a UInt8'))",
    "WITH x AS (SELECT * FROM file('/etc/passwd', 'LineAsString')) SELECT * FROM x",
    "SELECT (SELECT file('/etc/passwd'))",
    "SELECT COLUMNS('step_id') APPLY(file) FROM steps",
    "SELECT dictGet('d', 'a', toUInt64(1))",
    "SELECT joinGet('system.x', 'a', 1)",
    "SELECT hasColumnInTable('system', 'processes', 'query')",
    "SELECT sleep(3)",
    "SELECT getSetting('readonly')",
    "SELECT hostName(), currentUser(), version()",
    "SELECT aiGenerate('hi')",
    "SELECT addressToSymbol(1)",
    "SELECT lemmatize('en', 'x')",
    "SELECT regionToName(1)",
    "SELECT evalMLMethod(1)",
    "SELECT db.f(1)",
    # system and other databases, tables from parameters
    "SELECT * FROM system.processes",
    "SELECT query FROM system.query_log",
    "SELECT * FROM system.one",
    "SELECT * FROM information_schema.tables",
    "SELECT * FROM default.steps",
    "SELECT * FROM steps WHERE step_id IN system.processes",
    "SHOW PROCESSLIST", "SHOW DATABASES", "SHOW SETTINGS LIKE '%'", "SHOW TABLES FROM system",
    "SHOW CREATE TABLE system.processes", "DESCRIBE TABLE system.processes", "EXISTS TABLE system.processes",
    "SHOW GRANTS", "SHOW USERS", "SHOW CREATE USER default", "SHOW ACCESS", "SHOW FUNCTIONS",
    "SHOW DICTIONARIES", "SHOW CLUSTERS", "SHOW MERGES",
    # settings, outfile, format
    "SELECT 1 SETTINGS readonly = 0",
    "SET readonly = 0",
    "SET readonly = 2",
    "SELECT * FROM steps SETTINGS max_result_rows = 0",
    "WITH 1 AS x SELECT x SETTINGS max_execution_time = 0",
    "EXPLAIN SELECT 1 SETTINGS readonly = 0",
    "EXPLAIN max_threads = 64 SELECT 1",
    "EXPLAIN TABLE OVERRIDE mysql('a', 'b', 'c', 'd', 'e') PARTITION BY x",
    "EXPLAIN SELECT * FROM file('/etc/passwd', 'LineAsString')",
    "SELECT 1 INTO OUTFILE '{file}'",
    "SELECT 1 INTO OUTFILE '{file}' TRUNCATE",
    "SELECT 1 INTO OUTFILE '{file}' AND STDOUT",
    "SELECT 1 FORMAT JSON",
    "DESCRIBE TABLE steps FORMAT JSON",
    "DESCRIBE TABLE steps SETTINGS readonly = 0",
    # DDL, DML, SYSTEM, KILL, access
    "DROP TABLE step_versions", "TRUNCATE TABLE step_versions", "DROP DATABASE {db}",
    "ALTER TABLE step_versions DELETE WHERE 1", "ALTER TABLE step_versions UPDATE reward = 0 WHERE 1",
    "DELETE FROM step_versions WHERE 1", "INSERT INTO consumer_presets (name) VALUES ('x')",
    "INSERT INTO FUNCTION file('{file}') SELECT 1", "CREATE TABLE x (a UInt8) ENGINE = Memory",
    "CREATE TEMPORARY TABLE x (a UInt8)", "CREATE VIEW v AS SELECT 1", "CREATE FUNCTION f AS x -> x",
    "CREATE DICTIONARY d (a UInt8) PRIMARY KEY a SOURCE(FILE(path '{file}' format 'TSV')) "
    "LAYOUT(FLAT()) LIFETIME(0)",
    "OPTIMIZE TABLE step_versions FINAL", "ATTACH TABLE x", "DETACH TABLE step_versions",
    "RENAME TABLE step_versions TO x", "EXCHANGE TABLES step_versions AND consumer_presets",
    "UNDROP TABLE x", "GRANT ALL ON *.* TO default", "REVOKE ALL ON *.* FROM default", "CREATE USER u",
    "SYSTEM FLUSH LOGS", "SYSTEM SHUTDOWN", "KILL QUERY WHERE 1",
    "BACKUP TABLE step_versions TO File('{file}')",
    "USE system", "CHECK TABLE step_versions", "WATCH x",
    # parameters naming tables
    "SELECT * FROM {t:Identifier}",
    # unicode look-alikes and invisible characters
    "\u0405ELECT 1",
    "SELECT f\u0456le('/etc/passwd')",
    "SELECT 1\uff1b DROP TABLE step_versions",
    "DROP\u00a0TABLE step_versions",
    "SELECT 1\u200b; DROP TABLE step_versions",
    "\uff24\uff32\uff2f\uff30 TABLE step_versions",
    "SELECT 'a'\u2019; DROP TABLE step_versions",
    "SELECT 1\x00; DROP TABLE step_versions",
    # empty and too deep
    "  ;  ", "-- only a comment",
    "SELECT " + "(" * 3000 + "1" + ")" * 3000,
]

ORDINARY = [
    "SELECT count() AS n FROM steps",
    "WITH t AS (SELECT trajectory_id FROM steps) SELECT count() FROM t",
    "SELECT 1 UNION ALL SELECT 2",
    "SHOW TABLES", "DESCRIBE TABLE steps", "DESC steps;", "EXISTS TABLE steps", "SHOW CREATE TABLE steps",
    "EXPLAIN indexes = 1 SELECT * FROM steps WHERE prompt_id = 'x'", "EXPLAIN AST SELECT 1",
    "SELECT number FROM numbers(3)",
    "SELECT sumIf(number, number > 1), uniqExactIf(number, 1) FROM numbers(5)",
    "SELECT count() FROM steps WHERE step_id LIKE 's%'",
    "SELECT 'a;b -- DROP' AS s, $$heredoc; DROP$$ AS h -- a comment; with a semicolon",
    "SELECT 'a\\'; DROP TABLE step_versions; SELECT \\''",
    "SELECT arrayMap(x -> x * 2, [1, 2]), CASE 1 WHEN 1 THEN 'one' END, toTypeName(1), formatReadableSize(1)",
    "SELECT count() FROM {db}.steps",
]


def corpus_entry(text: str, file: Path, port: int, database: str) -> str:
    return text.replace("{file}", str(file)).replace("{port}", str(port)).replace("{db}", database)


def test_attack_corpus_is_refused_and_leaves_no_trace(api_url: str, pool_store: PoolStore,  # noqa: F811
                                                      listener: socket.socket, tmp_path: Path) -> None:
    target = tmp_path / "written.pth"
    port = listener.getsockname()[1]
    before = pool_state(pool_store)
    with httpx.Client(base_url=api_url, timeout=60) as http:
        for text in CORPUS:
            query = corpus_entry(text, target, port, pool_store.database)
            parameters = {"t": "system.processes"} if "Identifier" in query else {}
            reply = http.post("/v1/sql", json={"query": query, "parameters": parameters})
            assert 400 <= reply.status_code < 500, (query, reply.status_code, reply.text)
        for query in ORDINARY:
            query = corpus_entry(query, target, port, pool_store.database)
            reply = http.post("/v1/sql", json={"query": query})
            assert reply.status_code == 200, (query, reply.text)
    assert pool_state(pool_store) == before
    assert not target.exists()
    assert not reached(listener)


def test_every_refused_function_and_table_function_is_refused(api_url: str,  # noqa: F811
                                                              pool_store: PoolStore) -> None:
    """The whole engine catalogue: each table function outside the allow-list, and each function the guard
    does not allow, answers 403 without running (or 400 where such a call cannot even parse)."""
    functions = pool_store.query("SELECT name FROM system.functions")
    table_functions = [r["name"] for r in pool_store.query("SELECT name FROM system.table_functions")]
    guard = AnalystSql(pool_store.dsn, pool_store.database)
    try:
        guard.check("SELECT 1")  # loads the catalogue
        catalogue = guard._catalogue
        assert catalogue is not None
        refused = sorted(r["name"] for r in functions if not catalogue.allows(r["name"]))
    finally:
        guard.close()
    assert {"file", "dictGet", "joinGet", "sleep", "hostName", "aiGenerate", "getSetting"} <= set(refused)
    queries = [f"SELECT * FROM {name}('x')" for name in table_functions
               if name.lower() not in TABLE_FUNCTIONS]
    queries += [f"SELECT `{name}`('x')" for name in refused]
    with httpx.Client(base_url=api_url, timeout=60) as http:
        for query in queries:
            reply = http.post("/v1/sql", json={"query": query})
            refused = reply.status_code == 403
            unparsable = reply.status_code == 400 and "Syntax error" in reply.json()["detail"]
            assert refused or unparsable, (query, reply.text)


def test_session_is_read_only_from_its_start(pool_store: PoolStore) -> None:
    """Even past the guard, the engine session itself refuses writes and setting changes."""
    from clawr1.pool.sql import open_session

    client = open_session(pool_store.dsn, pool_store.database, SqlLimits(max_result_rows=7))
    try:
        assert client.query("SELECT getSetting('readonly'), getSetting('max_result_rows')").result_rows == [
            (1, 7)]
        for statement in ("SET readonly = 0", "SET max_result_rows = 0", "DROP TABLE step_versions",
                          "SELECT 1 SETTINGS max_result_rows = 100"):
            with pytest.raises(Exception, match="READONLY|readonly"):
                client.command(statement)
        assert client.query("SELECT getSetting('readonly')").result_rows == [(1,)]
    finally:
        client.close()


def test_percent_with_parameters_and_parameter_mistakes_are_400s(api_url: str) -> None:  # noqa: F811
    with httpx.Client(base_url=api_url, timeout=60) as http:
        like = http.post("/v1/sql", json={
            "query": "SELECT count() AS n FROM steps WHERE step_id LIKE {p:String}",
            "parameters": {"p": "s1%"}})
        assert like.status_code == 200 and like.json() == {"n": 2}
        for query, parameters in (("SELECT '%' AS p", {"x": 1}), ("SELECT '%(x)s'", {"x": "1"}),
                                  ("SELECT {p:String} LIKE '%'", {}), ("SELECT {p:String}", {"bad name": 1})):
            reply = http.post("/v1/sql", json={"query": query, "parameters": parameters})
            assert reply.status_code == 400, (query, reply.text)


def test_limits_and_streaming(api_url: str) -> None:  # noqa: F811
    with httpx.Client(base_url=api_url, timeout=60) as http:
        over = http.post("/v1/sql", json={"query": "SELECT number FROM numbers(100)", "max_rows": 10})
        assert over.status_code == 400 and "Limit for result exceeded" in over.json()["detail"]
        with http.stream("POST", "/v1/sql", json={"query": "SELECT number FROM numbers(90000)"}) as reply:
            chunks = list(reply.iter_raw())
        assert reply.status_code == 200 and len(chunks) > 1
        assert sum(1 for _ in b"".join(chunks).splitlines()) == 90000
        # An error never cuts a result silently: before the first chunk it is a 400; past it the status is
        # sent, so the body ends with the engine's error on a line of its own.
        for _ in range(3):
            broken = http.post("/v1/sql", json={"query": "SELECT number FROM numbers(1000000)"})
            last = broken.text.splitlines()[-1]
            assert (broken.status_code == 400 and "Limit for result exceeded" in broken.json()["detail"]) or (
                broken.status_code == 200 and last.startswith("Code: 396.") and "Limit for result" in last)


FRAGMENTS = [
    "SELECT 1", "SELECT count() FROM steps", ";", " ", "\n", "--", "#!", "# ", "/*", "*/", "$$", "$a$", "'",
    "\\", "\"", "`", "DROP TABLE step_versions", "INTO OUTFILE '{file}'", "SETTINGS readonly = 0",
    "FORMAT JSON", "file('{file}')", "url('http://127.0.0.1:{port}/', CSV, 'a String')", "UNION ALL",
    "FROM", "(", ")", ",", "INSERT INTO consumer_presets (name) VALUES ('x')", "WITH x AS (SELECT 1)",
    "SELECT * FROM", "numbers(2)", "system.one", "AS", "x", "\u200b", "\uff1b", "EXPLAIN", "DESCRIBE",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=8))
def test_fuzz_whatever_passes_the_guard_stays_inside(parts: list[str], pool_store: PoolStore,
                                                     listener: socket.socket, tmp_path: Path) -> None:
    target = tmp_path / "fuzz.out"
    port = listener.getsockname()[1]
    query = corpus_entry("".join(parts), target, port, pool_store.database)
    before = pool_state(pool_store)
    analyst = analyst_for(pool_store)
    try:
        analyst.check(query)
    except SqlError:
        return
    with contextlib.suppress(SqlError):  # a query that fails is fine; a write or an outside read is not
        analyst.run(query)
    assert not target.exists(), query
    assert not reached(listener), query
    assert pool_state(pool_store) == before, query


SERVER = Path(__file__).resolve().parents[3] / "pool" / "server"


def test_server_user_profile_matches_the_api_limits_and_parses(pool_store: PoolStore) -> None:
    """The users.d profile and the SQL DDL pin readonly and the default limits, grant SELECT on the pool
    database only, and parse (the DDL with the engine's own parser)."""
    import xml.etree.ElementTree as ElementTree

    root = ElementTree.parse(SERVER / "users.d" / "clawr1-analyst.xml").getroot()
    profile = root.find("profiles/clawr1_analyst")
    assert profile is not None
    limits = SqlLimits().session_settings()
    for name, value in limits.items():
        written = str(int(value)) if isinstance(value, float) else str(value)
        assert profile.findtext(name) == written, name
        if name != "readonly":
            assert profile.find(f"constraints/{name}") is not None, name
    grants = [g.text for g in root.findall("users/clawr1_analyst/grants/query")]
    assert [g for g in grants if g and "system." not in g] == ["GRANT SELECT ON default.*"]
    statements = [s.strip() for s in (SERVER / "analyst.sql").read_text().split(";") if s.strip()]
    body = [s for s in statements if not all(line.startswith("--") for line in s.splitlines())]
    for statement in body:
        pool_store.query("SELECT formatQuerySingleLine({q:String})", parameters={"q": statement})
    assert any("GRANT SELECT ON clawr1.* TO clawr1_analyst" in s for s in body)
    granted = [s.upper() for s in body if s.upper().startswith("GRANT")]
    assert granted and all(g.startswith("GRANT SELECT ON ") for g in granted)
    assert not any(word in g for g in granted for word in ("FILE", "URL", "REMOTE", "SOURCES", "*.*"))


def test_an_accepted_text_is_checked_by_the_engine_once(pool_store: PoolStore,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK repeats its query texts: the second time the remembered verdict answers, while a new
    text (and every refused one) still goes through the engine's parser."""
    guard = AnalystSql(pool_store.dsn, pool_store.database)
    try:
        first = guard.check("SELECT count() FROM steps WHERE step_id = {id:String}")
        with pytest.raises(WriteRefused):
            guard.check("SELECT file('/etc/passwd')")

        def engine_parse(client: object, text: str) -> object:
            raise AssertionError(f"parsed again: {text}")

        monkeypatch.setattr(guard, "_parse_and_check", engine_parse)
        assert guard.check("SELECT count() FROM steps WHERE step_id = {id:String}") == first
        with pytest.raises(AssertionError, match="parsed again"):
            guard.check("SELECT file('/etc/passwd')")
    finally:
        guard.close()
