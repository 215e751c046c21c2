"""The fast path of ``POST /v1/steps``: plain white-box steps validated, hashed and Avro-encoded
without building a pydantic model per step or calling fastavro per record.

It only ever *accepts*: an item that is not plainly valid (a float token id, an int logprob, a
missing prompt, a too-long id, a bad channel, anything unusual) makes ``step_messages`` answer None,
and the request goes the model path (``StepIn`` + ``check_step`` + ``step_record`` + the codec),
which gives the one answer and the same reasons as always. What it accepts, the model path accepts
too, with the same ids and byte-identical Avro (``tests/unit/test_gateway_fastpath.py`` checks both
differentially with hypothesis).

The record encoder is written for ``whitebox_step.avsc`` as it is: ``StepEncoder.for_codec`` answers
None, and the model path serves every step, when the schema's fields differ from ``FIELDS`` (a test
fails then too, so whoever changes the schema updates this file).
"""

from __future__ import annotations

import re
import struct
import sys
from array import array
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from clawr1.gateway.models import AVRO_INT_LIMIT, AVRO_LONG_LIMIT, CHANNEL_PATTERN, ID_MAX, NAME_MAX, StepIn
from clawr1.gateway.records import compact_json, digest_of, identity_bytes, packed_bytes, uuid5_of
from clawr1.schemas.codec import AvroCodec, current_schema

SCHEMA = "whitebox_step"
# (name, Avro type) of every field of whitebox_step.avsc, in order, as this encoder writes them.
FIELDS: tuple[tuple[str, Any], ...] = (
    ("step_id", "string"), ("trajectory_id", "string"), ("step_index", "int"),
    ("prompt_group_id", ["null", "string"]), ("prompt_group_size", ["null", "int"]),
    ("prompt_token_ids", {"type": "array", "items": "int"}),
    ("response_token_ids", {"type": "array", "items": "int"}),
    ("response_logprobs", ["null", {"type": "array", "items": "double"}]),
    ("prompt_messages", ["null", "string"]), ("response_text", ["null", "string"]),
    ("reward", ["null", "double"]), ("reward_final", "boolean"), ("terminal", "boolean"),
    ("policy_version", ["null", "long"]), ("model", ["null", "string"]), ("agent", ["null", "string"]),
    ("source_name", "string"), ("metadata_json", "string"), ("received_at_ms", "long"),
    ("content_digest", "string"), ("channel", "string"),
)
_STEP_FIELDS = frozenset(StepIn.model_fields)
_CHANNEL = re.compile(CHANNEL_PATTERN)
_FLOAT_EXACT = 2**53
_LITTLE_ENDIAN = sys.byteorder == "little"


class _Decline(Exception):
    """Not plainly valid: the model path decides."""


# ---- checks: each returns the value as StepIn would hold it, or raises _Decline ----------------

def _text(value: Any, low: int, high: int) -> str:
    if type(value) is not str or not low <= len(value) <= high:
        raise _Decline
    return value


def _optional_text(value: Any, low: int, high: int) -> str | None:
    return None if value is None else _text(value, low, high)


def _integer(value: Any, low: int, high: int) -> int:
    kind = type(value)
    if kind is float and value.is_integer():
        value = int(value)
    elif kind is not int:
        raise _Decline
    if not low <= value < high:
        raise _Decline
    return int(value)


def _optional_integer(value: Any, low: int, high: int) -> int | None:
    return None if value is None else _integer(value, low, high)


def _real(value: Any) -> float | None:
    if value is None:
        return None
    kind = type(value)
    if kind is int and -_FLOAT_EXACT < value < _FLOAT_EXACT:
        value = float(value)
    elif kind is not float or value != value or value in (float("inf"), float("-inf")):
        raise _Decline
    return float(value)


def _flag(value: Any) -> bool:
    if type(value) is not bool:
        raise _Decline
    return bool(value)


def _token_ids(value: Any) -> array:
    """Int token ids in [0, 2**31) as a packed int32 array."""
    if type(value) is not list:
        raise _Decline
    if value and set(map(type, value)) != {int}:  # floats (3.0) and bools: the model path
        raise _Decline
    try:
        packed = array("i", value)
    except OverflowError:
        raise _Decline from None
    if packed and np.frombuffer(packed, np.int32).min() < 0:
        raise _Decline
    return packed


def _logprobs(value: Any) -> array | None:
    if value is None:
        return None
    if type(value) is not list or (value and set(map(type, value)) != {float}):
        raise _Decline
    packed = array("d", value)
    if packed and not np.isfinite(np.frombuffer(packed, np.float64)).all():
        raise _Decline
    return packed


def _messages(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if type(value) is not list or any(type(m) is not dict for m in value):
        raise _Decline
    return value


# ---- Avro binary, as fastavro writes it ------------------------------------------------------

def _varint_of(n: int) -> bytes:
    """Avro int/long: zigzag, then base-128 little-endian groups."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_SMALL_VARINTS = [_varint_of(n) for n in range(1 << 13)]  # lengths, indices, small counts: 2 bytes at most


def _varint(n: int) -> bytes:
    return _SMALL_VARINTS[n] if 0 <= n < 1 << 13 else _varint_of(n)


def _string(text: str) -> bytes:
    data = text.encode()
    return _varint(len(data)) + data


def _optional_string(text: str | None) -> bytes:
    return b"\x00" if text is None else b"\x02" + _string(text)


def _optional_long(n: int | None) -> bytes:
    return b"\x00" if n is None else b"\x02" + _varint(n)


_VARINT_LIMITS = (1 << 7, 1 << 14, 1 << 21, 1 << 28)  # a zigzagged int32 needs 1 more byte at each


def _int_arrays(arrays: list[array]) -> list[bytes]:
    """Avro encodings of many int arrays (non-negative ints here): each one block of its items, then
    the 0 terminator. The varints of all of them are built in one vectorized pass, column by column
    (7 bits each), so a 100-step request pays NumPy's call overhead once, not 200 times."""
    lengths = [len(a) for a in arrays]
    if not any(lengths):
        return [b"\x00"] * len(arrays)
    z = np.frombuffer(b"".join(a.tobytes() for a in arrays), np.int32).astype(np.uint32) << np.uint32(1)
    top = int(z.max())
    width = 1 + sum(top >= limit for limit in _VARINT_LIMITS)
    groups = np.empty((len(z), width), np.uint8)
    rest: Any = z
    for k in range(width):
        groups[:, k] = rest & 0x7F
        rest = rest >> 7
    sizes = np.ones(len(z), np.uint8)
    for limit in _VARINT_LIMITS[:width - 1]:
        sizes += z >= limit
    columns = np.arange(width, dtype=np.uint8)
    if width > 1:
        groups[:, :-1] |= (columns[:-1] < (sizes - 1)[:, None]).astype(np.uint8) << 7
    body = groups[columns < sizes[:, None]].tobytes()
    ends = np.cumsum(sizes, dtype=np.int64).tolist()  # byte offset after each item
    out = []
    item = byte = 0
    for length in lengths:
        if not length:
            out.append(b"\x00")
            continue
        item += length
        end = ends[item - 1]
        out.append(_varint(length) + body[byte:end] + b"\x00")
        byte = end
    return out


def _double_array(packed: array | None) -> bytes:
    if packed is None:
        return b"\x00"
    if not packed:
        return b"\x02\x00"
    return b"\x02" + _varint(len(packed)) + packed.tobytes() + b"\x00"


def _optional_double(value: float | None) -> bytes:
    return b"\x00" if value is None else b"\x02" + struct.pack("<d", value)


class StepEncoder:
    """Plain steps -> (id, Kafka key, Avro bytes) as the model path would produce them."""

    def __init__(self, header: Callable[[], bytes]) -> None:
        self._header_of = header
        self._header: bytes | None = None

    @classmethod
    def for_codec(cls, codec: AvroCodec) -> StepEncoder | None:
        """An encoder framing records as ``codec`` does, or None when the schema is not the one this
        encoder writes (or the machine is big-endian)."""
        fields = tuple((f["name"], f["type"]) for f in current_schema(SCHEMA).raw["fields"])
        if fields != FIELDS or not _LITTLE_ENDIAN:
            return None

        def header() -> bytes:
            # The codec's own framing (single-object fingerprint or registry id), taken from one record.
            sample = codec.encode(SCHEMA, {
                "step_id": "", "trajectory_id": "", "step_index": 0, "received_at_ms": 0})
            return sample[:10] if sample[:1] == b"\xc3" else sample[:5]

        return cls(header)

    def encode(self, items: list[Any], source_name: str,
               received_at_ms: int) -> tuple[list[tuple[str, str, bytes]], list[str]] | None:
        """[(key, value)] and the ids of ``items`` (the parsed JSON body's objects), or None when any
        item needs the model path."""
        if self._header is None:
            self._header = self._header_of()
        try:
            steps = [self._step(item, source_name, received_at_ms) for item in items]
        except (_Decline, ValueError, TypeError, OverflowError, UnicodeError):
            return None
        arrays = _int_arrays([ids for step in steps for ids in (step.prompt, step.response)])
        out = [(step.step_id, step.key, b"".join((step.head, arrays[2 * n], arrays[2 * n + 1], step.tail)))
               for n, step in enumerate(steps)]
        return out, [step.step_id for step in steps]

    def _step(self, item: Any, source_name: str, received_at_ms: int) -> _Step:
        if type(item) is not dict or not item.keys() <= _STEP_FIELDS:
            raise _Decline
        get = item.get
        step_id = _optional_text(get("step_id"), 1, ID_MAX)
        trajectory_id = _text(get("trajectory_id"), 1, ID_MAX)
        step_index = _integer(get("step_index"), 0, AVRO_INT_LIMIT)
        group_id = _optional_text(get("prompt_group_id"), 1, ID_MAX)
        group_size = _optional_integer(get("prompt_group_size"), 1, AVRO_INT_LIMIT)
        prompt = _token_ids(get("prompt_token_ids", []))
        response = _token_ids(get("response_token_ids", []))
        logprobs = _logprobs(get("response_logprobs"))
        messages = _messages(get("prompt_messages"))
        response_text = get("response_text")
        if response_text is not None and type(response_text) is not str:
            raise _Decline
        reward = _real(get("reward"))
        reward_final = _flag(get("reward_final", True))
        terminal = _flag(get("terminal", False))
        policy_version = _optional_integer(get("policy_version"), 0, AVRO_LONG_LIMIT)
        model = _optional_text(get("model"), 1, NAME_MAX)
        agent = _optional_text(get("agent"), 1, NAME_MAX)
        channel = get("channel", "train")
        if type(channel) is not str or _CHANNEL.fullmatch(channel) is None:
            raise _Decline
        metadata = get("metadata", {})
        if type(metadata) is not dict:
            raise _Decline
        # check_step's cross-field rules; any failure is for the model path to word.
        if logprobs is not None and len(logprobs) != len(response):
            raise _Decline
        if (not prompt and not messages) or (not response and response_text is None):
            raise _Decline
        metadata_json = compact_json(metadata)  # ValueError (not finite): declined
        messages_json = None if messages is None else compact_json(messages)

        # records.step_record's id and digest, from the same bytes.
        identity = identity_bytes(source_name, trajectory_id, step_index, messages, response_text,
                                  packed_bytes(prompt), packed_bytes(response))
        step_id = step_id or uuid5_of(identity)
        rest = {"trajectory_id": trajectory_id, "step_index": step_index, "prompt_group_id": group_id,
                "prompt_group_size": group_size, "prompt_messages": messages,
                "response_text": response_text, "reward": reward, "reward_final": reward_final,
                "terminal": terminal, "policy_version": policy_version, "model": model, "agent": agent,
                "channel": channel, "metadata": metadata}
        digest = digest_of(identity, rest, logprobs)

        assert self._header is not None
        head = b"".join((self._header, _string(step_id), _string(trajectory_id), _varint(step_index),
                         _optional_string(group_id), _optional_long(group_size)))
        tail = b"".join((
            _double_array(logprobs), _optional_string(messages_json), _optional_string(response_text),
            _optional_double(reward), b"\x01" if reward_final else b"\x00", b"\x01" if terminal else b"\x00",
            _optional_long(policy_version), _optional_string(model), _optional_string(agent),
            _string(source_name), _string(metadata_json), _varint(received_at_ms),
            _string(digest), _string(channel),
        ))
        return _Step(step_id, trajectory_id, head, prompt, response, tail)


class _Step(NamedTuple):
    """A checked step: its id and key, and its Avro record around the two token-id arrays."""

    step_id: str
    key: str
    head: bytes
    prompt: array
    response: array
    tail: bytes
