"""How much a ready poll reads ahead: one batch before the consumer has seen any step, then
``read_ahead`` batches as far as the token budget allows for steps of the size seen so far."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
import pytest

from clawr1.consumer_sdk import PoolConsumer, UsageError
from clawr1.consumer_sdk.consumer import READ_AHEAD_MAX_TOKENS


class NoPool:
    """A transport that is never asked anything in these tests."""

    def query(self, sql: str, parameters: Mapping[str, Any]) -> pa.Table:
        raise AssertionError("no query expected")

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: Sequence[str]) -> None:
        raise AssertionError("no insert expected")

    def close(self) -> None:
        pass


def consumer(read_ahead: int = 32) -> PoolConsumer:
    return PoolConsumer("http://pool.invalid", "g", transport=NoPool(), read_ahead=read_ahead)


def test_the_first_read_is_one_batch() -> None:
    assert consumer()._scan(512) == 512


def test_later_reads_take_read_ahead_batches_within_the_token_budget() -> None:
    c = consumer()
    c._tokens_per_step = 384.0
    assert c._scan(512) == 512 * 32
    c._tokens_per_step = 4096.0
    assert c._scan(512) == int(READ_AHEAD_MAX_TOKENS / 4096)
    c._tokens_per_step = 65_536.0  # long steps: never less than one batch
    assert c._scan(512) == 512


def test_read_ahead_one_reads_one_batch() -> None:
    c = consumer(read_ahead=1)
    c._tokens_per_step = 10.0
    assert c._scan(256) == 256


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, None])
def test_read_ahead_must_be_a_positive_integer(bad: Any) -> None:
    with pytest.raises(UsageError, match="read_ahead"):
        PoolConsumer("http://pool.invalid", "g", transport=NoPool(), read_ahead=bad)
