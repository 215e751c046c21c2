"""The fast path of ``POST /v1/steps``: plain white-box steps validated, hashed and packed without
building a pydantic model per step.

It only ever *accepts*: an item that is not plainly valid (a float token id, an int logprob, a
missing prompt, a too-long id, a bad channel, anything unusual) makes ``pack_steps`` answer None,
and the request goes the model path (``StepIn`` + ``check_step`` + ``step_record`` + ``pack_record``),
which gives the one answer and the same reasons as always. What it accepts, the model path accepts
too, with the same ids and the same packed records, hence the same Avro: both are encoded by the one
codec (``AvroCodec.encode_batch``); ``tests/unit/gateway/test_gateway_fastpath.py`` checks it differentially
with hypothesis. Token arrays stay packed arrays from the JSON lists on: the checks over their values
run once per request over all of them (NumPy), and the packed bytes are what the envelope carries.

It fills ``whitebox_step.avsc`` as it is: ``fits_schema`` answers False, and the model path serves
every step, when the schema's fields differ from ``FIELDS`` (a test fails then too, so whoever
changes the schema updates this file).
"""

from __future__ import annotations

import functools
import re
import struct
import sys
from array import array
from typing import Any, NamedTuple

import numpy as np
import orjson
from pydantic_core import SchemaValidator, ValidationError, core_schema

from clawr1.core.ids import id_problem
from clawr1.core.json_depth import too_deep
from clawr1.core.routing import routable_id
from clawr1.gateway.models import AVRO_INT_LIMIT, AVRO_LONG_LIMIT, CHANNEL_PATTERN, NAME_MAX, StepIn
from clawr1.gateway.records import compact_json, digest_of, identity_bytes, packed_bytes
from clawr1.gateway.redacting import redact_step
from clawr1.gateway.validation import message_problems
from clawr1.schemas.codec import current_schema

SCHEMA = "whitebox_step"
# (name, Avro type) of every field of whitebox_step.avsc, in order, as this packer fills them.
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


# Python writes floats of 1e16 and beyond in exponent form; see ``pack_body``.
_ROUNDED = "e+"


# ---- checks: each returns the value as StepIn would hold it, or raises _Decline ----------------

def _text(value: Any, low: int, high: int) -> str:
    if type(value) is not str or not low <= len(value) <= high:
        raise _Decline
    return value


def _optional_text(value: Any, low: int, high: int) -> str | None:
    return None if value is None else _text(value, low, high)


def _id(value: Any) -> str:
    if type(value) is not str or id_problem(value) is not None:
        raise _Decline
    return value


def _optional_id(value: Any) -> str | None:
    return None if value is None else _id(value)


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
    if (kind is not int and kind is not float) or not -_FLOAT_EXACT < value < _FLOAT_EXACT:
        raise _Decline  # also NaN and the infinities, and a float orjson may have rounded (pack_body)
    return float(value)


def _flag(value: Any) -> bool:
    if type(value) is not bool:
        raise _Decline
    return bool(value)


# Every item an int, not a bool or a float (3.0): the model path words those. Checked in Rust, half
# the cost of ``set(map(type, ids))`` in Python; the range is the packing's and ``_plain_numbers``'.
_INTS_ONLY = SchemaValidator(core_schema.list_schema(core_schema.int_schema(strict=True)))


@functools.lru_cache(maxsize=1024)
def _int32s(count: int) -> struct.Struct:
    return struct.Struct(f"<{count}i")


def _token_ids(value: Any) -> array:
    """Int token ids below 2**31 as a packed int32 array (``_plain_numbers`` checks they are >= 0).
    Packed by a ``struct.Struct`` of the list's length: a third of ``array("i", value)``'s cost, which
    converts item by item (range checked in both)."""
    if type(value) is not list:
        raise _Decline
    try:
        _INTS_ONLY.validate_python(value)
        packed = array("i")
        packed.frombytes(_int32s(len(value)).pack(*value))
        return packed
    except (ValidationError, struct.error):
        raise _Decline from None


def _logprobs(value: Any) -> array | None:
    """Float logprobs as a packed float64 array (``_plain_numbers`` checks they are finite)."""
    if value is None:
        return None
    if type(value) is not list or (value and set(map(type, value)) != {float}):
        raise _Decline
    return array("d", value)


def _messages(value: Any) -> list[dict[str, Any]] | None:
    if value is None:
        return None
    if type(value) is not list or any(type(m) is not dict for m in value) or message_problems(value, ""):
        raise _Decline
    return value


class PackedStep(NamedTuple):
    """A step as its envelope carries it: id (answered to the client), Kafka key, packed record."""

    step_id: str
    key: str
    record: dict[str, Any]


class _Step(NamedTuple):
    """A checked step: its packed record and the arrays ``_plain_numbers`` still has to check."""

    record: dict[str, Any]
    token_ids: tuple[array, array]
    logprobs: array | None


def _plain_numbers(steps: list[_Step]) -> bool:
    """Token ids >= 0 and logprobs finite and below 2**53 in magnitude (beyond, orjson may have rounded
    an integer: ``pack_body``), over every step of the request in one pass each."""
    ids = b"".join(packed.tobytes() for step in steps for packed in step.token_ids)
    if ids and np.frombuffer(ids, np.int32).min() < 0:
        return False
    logprobs = b"".join(step.logprobs.tobytes() for step in steps if step.logprobs is not None)
    return not logprobs or bool((np.abs(np.frombuffer(logprobs, np.float64)) < _FLOAT_EXACT).all())


def fits_schema() -> bool:
    """Whether ``whitebox_step.avsc`` is the schema this path fills (and the machine little-endian, as
    its packed arrays are); otherwise the model path serves every step."""
    return tuple((f["name"], f["type"]) for f in current_schema(SCHEMA).raw["fields"]) == FIELDS \
        and _LITTLE_ENDIAN


def pack_body(raw: bytes, source_name: str, received_at_ms: int, max_batch: int) -> list[PackedStep] | None:
    """``pack_steps`` of a raw body (one step or a list of at most ``max_batch``) as orjson parses it:
    half the CPU of ``validation.parse_json``. None where orjson refuses it too: the model path then
    parses it and words the refusal, or accepts what only ``parse_json`` reads (a number beyond a
    double's range).

    orjson reads an integer beyond 64 bits as a float, where ``parse_json`` keeps it an int. So the
    checks decline every number that may be such a float: token ids and integer fields must be ints in
    range, rewards and logprobs below 2**53 in magnitude, and the JSON kept for metadata and messages
    must hold no exponent form. A body nested deeper than ``MAX_JSON_DEPTH`` (orjson reads 1,024 levels)
    is left to ``parse_json``, which refuses it."""
    if too_deep(raw):
        return None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    items = body if isinstance(body, list) else [body]
    if not items or len(items) > max_batch:
        return None
    return pack_steps(items, source_name, received_at_ms)


def pack_steps(items: list[Any], source_name: str, received_at_ms: int) -> list[PackedStep] | None:
    """The steps of ``items`` (the parsed JSON body's objects) exactly as the model path
    (``step_record`` + ``pack_record``) makes them, or None when any needs the model path."""
    try:
        steps = [_step(item, source_name, received_at_ms) for item in items]
    except (_Decline, ValueError, TypeError, OverflowError, UnicodeError):
        return None
    if not _plain_numbers(steps):
        return None
    return [PackedStep(s.record["step_id"], s.record["trajectory_id"], s.record) for s in steps]


def _step(item: Any, source_name: str, received_at_ms: int) -> _Step:
    if type(item) is not dict or not item.keys() <= _STEP_FIELDS:
        raise _Decline
    get = item.get
    step_id = _optional_id(get("step_id"))
    trajectory_id = _id(get("trajectory_id"))
    step_index = _integer(get("step_index"), 0, AVRO_INT_LIMIT)
    group_id = _optional_id(get("prompt_group_id"))
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
    # Secrets go before anything is derived from the text, as on the model path (records.step_record).
    named: dict[str, Any] = {"step_id": step_id, "trajectory_id": trajectory_id, "prompt_group_id": group_id,
                             "model": model, "agent": agent, "prompt_messages": messages,
                             "response_text": response_text, "metadata": metadata}
    changes = redact_step(named, token_ids=bool(prompt) or bool(response))
    if changes:
        named.update(changes)
        step_id, trajectory_id, group_id = named["step_id"], named["trajectory_id"], named["prompt_group_id"]
        model, agent, messages = named["model"], named["agent"], named["prompt_messages"]
        response_text, metadata = named["response_text"], named["metadata"]
    metadata_json = compact_json(metadata)  # ValueError (not finite): declined
    messages_json = None if messages is None else compact_json(messages)
    if _ROUNDED in metadata_json or (messages_json is not None and _ROUNDED in messages_json):
        raise _Decline  # a float of 1e16 or more, maybe an integer orjson rounded (or such a text)

    # records.step_record's id and digest, from the same bytes.
    identity = identity_bytes(source_name, trajectory_id, step_index, messages, response_text,
                              packed_bytes(prompt), packed_bytes(response))
    if step_id is not None:
        step_id.encode()  # a lone surrogate is the model path's to refuse (every other text is in the digest)
    rest = {"trajectory_id": trajectory_id, "step_index": step_index, "prompt_group_id": group_id,
            "prompt_group_size": group_size, "prompt_messages": messages,
            "response_text": response_text, "reward": reward, "reward_final": reward_final,
            "terminal": terminal, "policy_version": policy_version, "model": model, "agent": agent,
            "channel": channel, "metadata": metadata}
    record = {
        "step_id": step_id or routable_id(trajectory_id, identity),
        "trajectory_id": trajectory_id,
        "step_index": step_index,
        "prompt_group_id": group_id,
        "prompt_group_size": group_size,
        "prompt_token_ids": prompt.tobytes(),
        "response_token_ids": response.tobytes(),
        "response_logprobs": None if logprobs is None else logprobs.tobytes(),
        "prompt_messages": messages_json,
        "response_text": response_text,
        "reward": reward,
        "reward_final": reward_final,
        "terminal": terminal,
        "policy_version": policy_version,
        "model": model,
        "agent": agent,
        "source_name": source_name,
        "metadata_json": metadata_json,
        "received_at_ms": received_at_ms,
        "content_digest": digest_of(identity, rest, logprobs),
        "channel": channel,
    }
    return _Step(record, (prompt, response), logprobs)
