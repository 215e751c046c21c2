"""ClickHouse errors become PoolErrors with the driver's code and name; migrations need no store import."""

from __future__ import annotations

import subprocess
import sys

from clickhouse_connect.driver.exceptions import ClickHouseError, DatabaseError, OperationalError

from clawr1.pool.store import PoolError, pool_error

_BODY = "Code: 60. DB::Exception: Unknown table expression identifier 'nope'. (UNKNOWN_TABLE)"


def test_http_error_keeps_clickhouse_text_code_and_name() -> None:
    exc = DatabaseError(f"Received ClickHouse exception, code: 60, server response: {_BODY} "
                        "(for url http://localhost:8123)", code=60, name="UNKNOWN_TABLE")
    error = pool_error(exc)
    assert isinstance(error, PoolError)
    assert str(error).startswith("Code: 60. DB::Exception")
    assert (error.code, error.name) == (60, "UNKNOWN_TABLE")


def test_code_comes_from_the_exception_not_the_text() -> None:
    # A generic message (show_clickhouse_errors=False) still carries the structured code.
    error = pool_error(DatabaseError("The ClickHouse server returned an error", code=241))
    assert (error.code, error.name) == (241, None)
    # Text that looks like a code but no structured code: none is made up from the text.
    assert pool_error(OperationalError("Network Error: Code: 99. lost")).code is None


def test_errors_without_a_code_have_none() -> None:
    error = pool_error(ClickHouseError("something odd"))
    assert (str(error), error.code, error.name) == ("something odd", None, None)


def test_migrations_do_not_import_the_store() -> None:
    code = "import sys, clawr1.pool.migrations; sys.exit('clawr1.pool.store' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
