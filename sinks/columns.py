"""Envelopes' records -> one Arrow block of pool columns per flush, without a Python loop per token.

The row path (``rows.py``) unpacks every token array into a list of Python ints, checks it, and hands
clickhouse-connect tuples it serializes value by value: in the stack that was most of the sink's CPU.
An envelope already carries its token arrays packed (little-endian int32 / float64 bytes,
``clawr1/schemas/batch.py``), so here they go to Arrow list columns from one buffer per column, the
scalar fields go column by column, and the insert is Arrow (``PoolStore.insert_arrow``).

It only ever *accepts*: a block with a record the row path would refuse (a negative token id, a time
outside ``DateTime64``'s range, an unknown reward state, a malformed packed array) is not built
(``build`` answers None) and the sink takes that message record by record, with the row path's own
reasons. What it builds holds the same values as the row path's rows
(``tests/integration/pool/test_pool_sink_columns.py`` inserts both and compares).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from clawr1.core.epoch import MAX_EPOCH_MS
from clawr1.schemas.codec import current_schema
from clawr1.sinks.rows import REWARD_STATES, SOURCE_COLUMNS, Origin, TableRoute

TIME = pa.timestamp("ms", tz="UTC")
_SCALARS = {"string": pa.string(), "int": pa.int32(), "long": pa.int64(), "double": pa.float64()}
_PACKED: dict[str, tuple[np.dtype[Any], pa.DataType]] = {
    "int": (np.dtype("<i4"), pa.uint32()), "double": (np.dtype("<f8"), pa.float64())}

Column = Callable[[list[Any]], pa.Array]


class _Refused(Exception):
    """A value the row path must word: the block is not built."""


def _without_null(avro_type: Any) -> Any:
    if isinstance(avro_type, list):
        branches = [branch for branch in avro_type if branch != "null"]
        return branches[0] if len(branches) == 1 else avro_type
    return avro_type


def _arrow_type(avro_type: Any) -> pa.DataType:
    kind = _without_null(avro_type)
    if isinstance(kind, str) and kind in _SCALARS:
        return _SCALARS[kind]
    if isinstance(kind, dict) and kind.get("type") == "map":
        return pa.map_(pa.string(), _arrow_type(kind["values"]))
    if isinstance(kind, dict) and kind.get("type") == "array":
        return pa.list_(_arrow_type(kind["items"]))
    raise TypeError(f"no Arrow column for Avro type {avro_type!r}")


def _packed(dtype: np.dtype[Any], item: pa.DataType) -> Column:
    """Packed arrays (None: empty, as the row path stores it) as one list column over one buffer."""
    def build(values: list[Any]) -> pa.Array:
        sizes = np.fromiter((len(v) if v else 0 for v in values), np.int64, len(values))
        if (sizes % dtype.itemsize).any():
            raise _Refused
        offsets = np.zeros(len(values) + 1, np.int64)
        np.cumsum(sizes // dtype.itemsize, out=offsets[1:])
        flat = np.frombuffer(b"".join(v for v in values if v), dtype)
        if dtype.kind == "i":
            if flat.size and flat.min() < 0:  # ids above 2^31 cannot be packed: the row path's range
                raise _Refused
            flat = flat.view(np.uint32)
        # 64-bit offsets: a flush may hold more than 2^31 token ids in all (ClickHouse reads large lists).
        return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(flat, item))
    return build


def _time(values: list[Any]) -> pa.Array:
    present = [v for v in values if v is not None]
    if present and not (min(present) >= 0 and max(present) < MAX_EPOCH_MS):
        raise _Refused
    return pa.array(values, pa.int64()).cast(TIME)


def _flag(values: list[Any]) -> pa.Array:
    return pa.array(np.fromiter(values, np.uint8, len(values)))


def _state(values: list[Any]) -> pa.Array:
    if not REWARD_STATES.issuperset(values):
        raise _Refused
    return pa.array(values, pa.string())


def _typed(arrow_type: pa.DataType) -> Column:
    if pa.types.is_map(arrow_type):
        return lambda values: pa.array([list(v.items()) for v in values], arrow_type)
    return lambda values: pa.array(values, arrow_type)


def _column(name: str, avro_type: Any, route: TableRoute) -> Column:
    kind = _without_null(avro_type)
    if isinstance(kind, dict) and kind.get("type") == "array" and kind["items"] in _PACKED:
        return _packed(*_PACKED[kind["items"]])
    if name in route.times:
        return _time
    if name in route.states:
        return _state
    if kind == "boolean":
        return _flag
    return _typed(_arrow_type(avro_type))


@dataclass(frozen=True)
class ColumnPlan:
    """How a columnar route's packed records become its table's columns."""

    route: TableRoute
    columns: tuple[tuple[str, Column], ...]

    @classmethod
    def of(cls, route: TableRoute) -> ColumnPlan:
        fields = {f["name"]: f["type"] for f in current_schema(route.schema).raw["fields"]}
        record_columns = [name for name in route.columns if name not in SOURCE_COLUMNS]
        missing = set(record_columns) - set(fields)
        if missing:
            raise TypeError(f"{route.table} columns not in {route.schema}.avsc: {sorted(missing)}")
        return cls(route, tuple((name, _column(name, fields[name], route)) for name in record_columns))

    def build(self, envelopes: Sequence[tuple[list[dict[str, Any]], Origin]],
              stamp_ms: int) -> pa.Table | None:
        """The records of ``envelopes`` ((packed records, the message's origin) each) as one block, or
        None when any of them needs the row path. Building has a fixed cost per column (~1 ms for a
        step's 50), so the sink builds once per flush, not once per envelope."""
        records = [record for envelope, _ in envelopes for record in envelope]
        try:
            arrays = {name: build([record[name] for record in records]) for name, build in self.columns}
        except (_Refused, KeyError, TypeError, ValueError, OverflowError, pa.ArrowException):
            return None
        counts = [len(envelope) for envelope, _ in envelopes]
        origins = [origin for _, origin in envelopes]
        arrays.update({
            "ingested_at": pa.array(np.full(len(records), stamp_ms, np.int64)).cast(TIME),
            "source_topic": pa.array(np.repeat([o.topic for o in origins], counts).tolist(), pa.string()),
            "source_partition": pa.array(np.repeat([o.partition for o in origins], counts).astype(np.int32)),
            "source_offset": pa.array(np.repeat([o.offset for o in origins], counts).astype(np.int64)),
        })
        return pa.table([arrays[name] for name in self.route.columns], names=list(self.route.columns))
