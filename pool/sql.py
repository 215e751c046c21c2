"""Read-only SQL over the pool, shared by the HTTP API and the ``clawr1 sql`` CLI.

Two guards, because either alone has gaps: a statement check (one statement, a read verb, no
``INTO OUTFILE``, no ``FORMAT``/``SETTINGS`` of its own) gives a clear refusal before anything runs, and
ClickHouse's ``readonly=1`` refuses every write, setting change and file/URL table function the check
could miss. ``max_execution_time`` and ``max_result_rows`` bound what one query may cost.

The limits travel in a ``SETTINGS`` clause appended to the query, not as client settings: chDB applies
client settings with session ``SET``s and cannot reset ``readonly`` afterwards, which would leave the
shared engine handle read-only. A query-level clause ends with the query, on chDB and a server alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pool.store import PoolError, PoolStore

OUTPUT_FORMATS: dict[str, str] = {
    "JSONEachRow": "application/x-ndjson",
    "JSON": "application/json",
    "JSONCompact": "application/json",
    "TabSeparated": "text/tab-separated-values; charset=utf-8",
    "TabSeparatedWithNames": "text/tab-separated-values; charset=utf-8",
    "CSV": "text/csv; charset=utf-8",
    "CSVWithNames": "text/csv; charset=utf-8",
    "Arrow": "application/vnd.apache.arrow.file",
    "ArrowStream": "application/vnd.apache.arrow.stream",
    "Parquet": "application/vnd.apache.parquet",
    "PrettyCompact": "text/plain; charset=utf-8",
    "PrettyCompactMonoBlock": "text/plain; charset=utf-8",
    "Markdown": "text/markdown; charset=utf-8",
    "Vertical": "text/plain; charset=utf-8",
}
"""Formats a caller may ask for, with the media type the API answers with."""

READ_VERBS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXPLAIN", "EXISTS"})
READONLY_ERROR_CODE = 164


class SqlError(ValueError):
    """The query failed; the message is ClickHouse's text (HTTP 400)."""


class WriteRefused(SqlError):
    """The query would write or change settings (HTTP 403)."""


@dataclass(frozen=True)
class SqlLimits:
    max_execution_time: float = 30.0
    max_result_rows: int = 100_000
    max_result_bytes: int = 512 * 1024 * 1024

    def clause(self) -> str:
        """The SETTINGS clause that bounds one query; on its own line, so a trailing comment can't eat it.

        JSON integers stay numbers whatever the server version's default, so clients parse one shape.
        """
        return (f"\nSETTINGS max_execution_time = {float(self.max_execution_time)}, "
                f"max_result_rows = {int(self.max_result_rows)}, "
                f"max_result_bytes = {int(self.max_result_bytes)}, "
                "result_overflow_mode = 'throw', output_format_json_quote_64bit_integers = 0, readonly = 1")


_LITERALS_AND_COMMENTS = re.compile(
    r"'(?:[^'\\]|\\.|'')*'|\"(?:[^\"\\]|\\.)*\"|`(?:[^`\\]|\\.)*`|--[^\n]*|#[^\n]*|/\*.*?\*/", re.DOTALL
)
_OWN_FORMAT = re.compile(r"\bFORMAT\s+\w+\s*$", re.IGNORECASE)
_OUTFILE = re.compile(r"\bINTO\s+OUTFILE\b", re.IGNORECASE)
_SETTINGS_CLAUSE = re.compile(r"\bSETTINGS\b", re.IGNORECASE)


def _blank(match: re.Match[str]) -> str:
    text = match.group(0)
    return "''" if text[0] in "'\"`" else " "


def check_read_only(sql: str) -> str:
    """The query without a trailing ``;`` if it is one read statement; raises otherwise."""
    skeleton = _LITERALS_AND_COMMENTS.sub(_blank, sql).strip()
    body = skeleton.rstrip(";").strip()
    if not body:
        raise SqlError("empty query")
    if ";" in body:
        raise WriteRefused("only one statement per request")
    verb = body.lstrip("(").split(None, 1)[0].upper()
    if verb not in READ_VERBS:
        raise WriteRefused(f"{verb} is not a read-only statement; allowed: {', '.join(sorted(READ_VERBS))}")
    if _OUTFILE.search(body):
        raise WriteRefused("INTO OUTFILE writes files and is refused")
    if _SETTINGS_CLAUSE.search(body):
        raise WriteRefused("SETTINGS clauses are refused: limits are set by the server")
    if _OWN_FORMAT.search(body):
        raise SqlError("drop the FORMAT clause and ask for the format in the request instead")
    return sql.strip().rstrip(";").rstrip()


def run_read_only(store: PoolStore, sql: str, fmt: str = "JSONEachRow", limits: SqlLimits | None = None,
                  parameters: Mapping[str, Any] | None = None) -> bytes:
    """The result of one read-only query in ``fmt``; ``SqlError``/``WriteRefused`` say why not.

    ``parameters`` fill ClickHouse query parameters (``{name:Type}`` in the query), bound server-side.
    """
    if fmt not in OUTPUT_FORMATS:
        raise SqlError(f"unknown format {fmt!r}; one of {', '.join(OUTPUT_FORMATS)}")
    query = check_read_only(sql)
    try:
        return store.raw_query(query + (limits or SqlLimits()).clause(), fmt, parameters=parameters)
    except PoolError as exc:
        if exc.code == READONLY_ERROR_CODE:
            raise WriteRefused(str(exc)) from exc
        raise SqlError(str(exc)) from exc
