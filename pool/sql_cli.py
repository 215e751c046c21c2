"""``clawr1 sql``: read-only SQL against the pool, over the HTTP API or directly on a DSN.

Over the API when ``api_url`` is given (the embedded pool is locked by the process that owns it),
else directly through ``PoolStore`` with the same read-only guards as the API.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

import httpx

from clawr1.pool.sql import AnalystSql, SqlError, WriteRefused
from clawr1.pool.store import PoolError

PROMPT = "pool> "
CONTINUE_PROMPT = "   -> "


class SqlTarget:
    """Where queries go: the pool API (``api_url``) or guarded analyst sessions opened on ``dsn``."""

    def __init__(self, api_url: str | None = None, dsn: str | None = None, api_key: str | None = None,
                 timeout: float = 120.0) -> None:
        if not api_url and not dsn:
            raise SqlError("give an API URL or a pool DSN")
        self._http: httpx.Client | None = None
        self._direct: AnalystSql | None = None
        if api_url:
            headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
            self._http = httpx.Client(base_url=api_url.rstrip("/"), timeout=timeout, headers=headers)
        else:
            self._direct = AnalystSql(str(dsn))

    def run(self, query: str, fmt: str = "TabSeparated") -> str:
        if self._direct is not None:
            return self._direct.run(query, fmt).decode("utf-8", errors="replace")
        assert self._http is not None
        try:
            reply = self._http.post("/v1/sql", json={"query": query, "format": fmt})
        except httpx.HTTPError as exc:
            raise SqlError(f"pool API unreachable: {exc}") from exc
        if reply.status_code == 403:
            raise WriteRefused(_detail(reply))
        if reply.status_code != 200:
            raise SqlError(f"HTTP {reply.status_code}: {_detail(reply)}")
        return reply.content.decode("utf-8", errors="replace")

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
        if self._direct is not None:
            self._direct.close()


def _detail(reply: httpx.Response) -> str:
    try:
        return str(reply.json().get("detail", reply.text))
    except ValueError:
        return reply.text


def run_sql(query: str, api_url: str | None = None, dsn: str | None = None, fmt: str = "TabSeparated",
            api_key: str | None = None) -> str:
    """One read-only query; the result text in ``fmt``. Raises ``SqlError`` (``WriteRefused`` on writes)."""
    target = SqlTarget(api_url, dsn, api_key)
    try:
        return target.run(query, fmt)
    finally:
        target.close()


def interactive(target: SqlTarget, fmt: str = "TabSeparated", read: Callable[[str], str] = input,
                write: Callable[[str], None] = print) -> None:
    """A prompt loop: a statement ends with ``;`` or an empty line; ``exit``, ``quit`` or EOF leaves."""
    lines: list[str] = []
    while True:
        try:
            line = read(CONTINUE_PROMPT if lines else PROMPT)
        except (EOFError, KeyboardInterrupt):
            return
        if not lines and line.strip().lower() in {"exit", "quit", r"\q"}:
            return
        if line.strip():
            lines.append(line)
        if lines and (not line.strip() or line.rstrip().endswith(";")):
            statement, lines = "\n".join(lines), []
            try:
                write(target.run(statement, fmt).rstrip("\n"))
            except SqlError as exc:
                write(f"error: {exc}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="clawr1 sql", description="read-only SQL over the Claw-R1 pool")
    parser.add_argument("query", nargs="?", help="one statement; without it, an interactive prompt")
    parser.add_argument("--api", help="pool API base URL, e.g. http://127.0.0.1:8000")
    parser.add_argument("--dsn", help="pool DSN (chdb:///abs/path or http://user:pass@host:8123/db)")
    parser.add_argument("--format", default="TabSeparated", help="ClickHouse output format")
    parser.add_argument("--api-key", help="API key for the pool API (default: $CLAWR1_API_KEY)")
    args = parser.parse_args(argv)
    try:
        target = SqlTarget(args.api, args.dsn, args.api_key or os.environ.get("CLAWR1_API_KEY"))
    except (SqlError, PoolError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.query is None:
            interactive(target, args.format)
            return 0
        sys.stdout.write(target.run(args.query, args.format))
        return 0
    except SqlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3 if isinstance(exc, WriteRefused) else 1
    finally:
        target.close()


if __name__ == "__main__":
    raise SystemExit(main())
