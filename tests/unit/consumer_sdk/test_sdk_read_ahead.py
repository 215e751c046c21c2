"""How much a ready read takes: ``read_ahead`` batches as far as the token budget allows for steps of the
size seen so far (for a member's first read, the size of the next entries), never less than a batch."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pytest

from clawr1.consumer_sdk import PoolConsumer, UsageError
from clawr1.consumer_sdk.delivery import READ_AHEAD_MAX_TOKENS, scan_for


class NoPool:
    """A transport that is never asked anything in these tests."""

    def query(self, sql: str, parameters: Mapping[str, Any]) -> pa.Table:
        raise AssertionError("no query expected")

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: Sequence[str]) -> None:
        raise AssertionError("no insert expected")

    def close(self) -> None:
        pass


def test_a_read_of_unknown_sizes_is_one_batch() -> None:
    assert scan_for(512, 32, None) == 512


def test_reads_take_read_ahead_batches_within_the_token_budget() -> None:
    assert scan_for(512, 32, 384.0) == 512 * 32
    assert scan_for(512, 32, 4096.0) == int(READ_AHEAD_MAX_TOKENS / 4096)
    assert scan_for(512, 32, 65_536.0) == 512  # long steps: never less than one batch
    assert scan_for(4096, 32, 10.0) == 65_536  # and never more rows than a read holds


def test_read_ahead_one_reads_one_batch() -> None:
    assert scan_for(256, 1, 10.0) == 256


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_read_ahead_must_be_a_positive_integer(bad: Any) -> None:
    with pytest.raises(UsageError, match="read_ahead"):
        PoolConsumer("http://pool.invalid", "g", transport=NoPool(), read_ahead=bad)
