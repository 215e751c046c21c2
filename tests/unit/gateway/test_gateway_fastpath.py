"""The steps fast path against the model path: it accepts only what StepIn + check_step accept, and
what it accepts gets the same id, key and packed record, hence byte-identical Avro from the one codec;
anything else it leaves to the model path (which words the refusal)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from clawr1.core.json_depth import MAX_JSON_DEPTH
from clawr1.gateway.errors import ApiError
from clawr1.gateway.fastpath import fits_schema, pack_body, pack_steps
from clawr1.gateway.models import StepIn
from clawr1.gateway.records import step_record
from clawr1.gateway.validation import check_step, parse_json
from clawr1.schemas.codec import codec_for, pack_record
from tests.support.steps import make_step

CODEC = codec_for("")
SOURCE, NOW = "agent-a", 1_700_000_000_123
Encoded = tuple[str, str, dict[str, Any], bytes]


def model_path(item: Any) -> Encoded | None:
    """(id, key, packed record, its Avro) as the model path produces them, or None when it refuses
    the item."""
    try:
        step = StepIn.model_validate(item)
    except ValidationError:
        return None
    if check_step(step):
        return None
    try:
        out = step_record(step, SOURCE, NOW)
        packed = pack_record("whitebox_step", out.record)
        return out.id, out.key, packed, CODEC.encode_batch("whitebox_step", [packed])
    except (ValueError, UnicodeError):  # e.g. a lone surrogate: not the fast path's to accept either
        return None


def fast_path(items: list[Any]) -> list[Encoded] | None:
    steps = pack_steps(items, SOURCE, NOW)
    if steps is None:
        return None
    assert [s.step_id for s in steps] == [s.record["step_id"] for s in steps]
    return [(s.step_id, s.key, s.record, CODEC.encode_batch("whitebox_step", [s.record])) for s in steps]


def test_the_schema_is_the_one_the_fast_path_fills() -> None:
    # Fails when whitebox_step.avsc changes: update clawr1.gateway.fastpath.FIELDS and its packer.
    assert fits_schema()


TOKENS = st.integers(0, 2**31 - 1)
ODD_NUMBERS = st.one_of(st.integers(-3, 3), st.sampled_from([2**31 - 1, 2**31, 2**53, 2**63 - 1, 2**63]),
                        st.floats(allow_nan=True, allow_infinity=True),
                        st.sampled_from([2.0, 0.0, -0.0, 2.5]), st.booleans(), st.none(), st.text(max_size=3))
TEXT = st.text(max_size=8) | st.text(min_size=250, max_size=260) | st.sampled_from(["", "\ud800", "é" * 129])
JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3),
                                                                                        inner, max_size=3),
                           max_leaves=6)


def token_lists() -> st.SearchStrategy[Any]:
    return st.one_of(st.lists(TOKENS, max_size=12), st.lists(st.one_of(TOKENS, ODD_NUMBERS), max_size=6),
                     st.lists(TOKENS, min_size=1, max_size=3).map(lambda v: [float(x) for x in v]),
                     ODD_NUMBERS)


def logprob_lists() -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), st.lists(st.floats(-30, 0), max_size=12),
                     st.lists(st.one_of(st.floats(), ODD_NUMBERS), max_size=4), ODD_NUMBERS)


FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "step_id": st.none() | TEXT | ODD_NUMBERS,
    "trajectory_id": TEXT | ODD_NUMBERS,
    "step_index": st.integers(0, 100) | ODD_NUMBERS,
    "prompt_group_id": st.none() | TEXT,
    "prompt_group_size": st.integers(1, 16) | ODD_NUMBERS,
    "prompt_token_ids": token_lists(),
    "response_token_ids": token_lists(),
    "response_logprobs": logprob_lists(),
    "prompt_messages": st.one_of(st.none(), st.lists(st.dictionaries(st.text(max_size=4), JSON_VALUES,
                                                                     max_size=2), max_size=2),
                                 st.lists(JSON_VALUES, max_size=2)),
    "response_text": st.none() | TEXT | ODD_NUMBERS,
    "reward": st.none() | st.floats(-2, 2) | ODD_NUMBERS,
    "reward_final": st.booleans() | ODD_NUMBERS,
    "terminal": st.booleans() | ODD_NUMBERS,
    "policy_version": st.none() | st.integers(0, 2**63 - 1) | ODD_NUMBERS,
    "model": st.none() | TEXT,
    "agent": st.none() | TEXT,
    "channel": st.sampled_from(["train", "val", "a.b-c_9", "", "x" * 65, "tr ain", "train\n"]) | ODD_NUMBERS,
    "metadata": st.dictionaries(st.text(max_size=4), JSON_VALUES, max_size=3) | ODD_NUMBERS,
    "reward_finl": st.just(True),
}


@st.composite
def step_like(draw: st.DrawFn) -> Any:
    """Mostly plausible steps (so many are valid), each field possibly absent or wrong."""
    step: dict[str, Any] = {"trajectory_id": "t", "step_index": 0,
                            "prompt_token_ids": draw(st.lists(TOKENS, min_size=1, max_size=8)),
                            "response_token_ids": draw(st.lists(TOKENS, min_size=1, max_size=8))}
    if draw(st.booleans()):
        step["response_logprobs"] = [-0.5] * len(step["response_token_ids"])
    for name in draw(st.lists(st.sampled_from(sorted(FIELDS)), max_size=4, unique=True)):
        if name in step and draw(st.integers(0, 5)) == 0:
            del step[name]
        else:
            step[name] = draw(FIELDS[name])
    return step if draw(st.integers(0, 30)) else draw(JSON_VALUES)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(item=step_like())
@example(item={"trajectory_id": "t", "step_index": 0, "prompt_token_ids": [1], "response_token_ids": [2],
               "reward": 1})
@example(item={"trajectory_id": "t", "step_index": 2.0, "prompt_token_ids": [1.0], "response_token_ids": [2]})
@example(item={"trajectory_id": "t", "step_index": 0, "prompt_token_ids": [True], "response_token_ids": [2]})
@example(item={"trajectory_id": "t", "step_index": 0, "prompt_messages": [], "response_text": ""})
@example(item={"trajectory_id": "t", "step_index": 0, "prompt_token_ids": [1], "response_text": "",
               "metadata": {"x": math.inf}})
def test_the_fast_path_accepts_only_what_the_model_path_accepts_with_identical_bytes(item: Any) -> None:
    fast = fast_path([item])
    if fast is None:
        return  # declined: the model path answers (accepts, or refuses with its reasons)
    assert fast == [model_path(item)]


PLAIN = [
    {"trajectory_id": "t", "step_index": 0, "prompt_token_ids": [1, 2, 3], "response_token_ids": [4, 5]},
    {"trajectory_id": "t", "step_index": 3, "prompt_token_ids": list(range(0, 2**31, 2**24)),
     "response_token_ids": [0, 127, 128, 16383, 16384, 2**21, 2**28 - 1, 2**28, 2**31 - 1],
     "response_logprobs": [-0.1] * 9, "reward": 1, "reward_final": False, "terminal": True,
     "policy_version": 2**63 - 1, "model": "m", "agent": "a", "channel": "val", "prompt_group_id": "g",
     "prompt_group_size": 8, "metadata": {"n": [1, 2.5, None], "é": "ü"}, "step_id": "given-id"},
    {"trajectory_id": "t", "step_index": 1, "prompt_messages": [{"role": "user", "content": "hi"}],
     "response_text": "hello", "response_logprobs": []},
    {"trajectory_id": "t", "step_index": 1, "prompt_token_ids": [5], "response_text": "",
     "response_logprobs": None, "reward": None, "model": None},
]


@pytest.mark.parametrize("item", PLAIN)
def test_plain_steps_take_the_fast_path(item: dict[str, Any]) -> None:
    assert fast_path([item]) == [model_path(item)]


def test_the_bench_step_takes_the_fast_path() -> None:
    items = parse_json(json.dumps([make_step(n) for n in range(5)]).encode())
    assert fast_path(items) == [model_path(item) for item in items]


def test_one_item_for_the_model_path_sends_the_whole_request_there() -> None:
    bad = {**PLAIN[0], "step_index": -1}
    assert fast_path([PLAIN[0], bad]) is None
    assert fast_path([PLAIN[0], {**PLAIN[0], "prompt_token_ids": [1.0]}]) is None  # valid, not plain


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=st.lists(step_like(), min_size=1, max_size=5))
def test_a_batch_takes_the_fast_path_whole_or_not_at_all(items: list[Any]) -> None:
    fast = fast_path(items)
    if fast is not None:
        assert fast == [model_path(item) for item in items]


def as_body(value: Any) -> bytes:
    """A JSON text of ``value`` as a client sends it (NaN and the infinities as Python writes them)."""
    return json.dumps(value).encode()


BIG = 2**64  # beyond 64 bits: orjson reads it as a float, parse_json as an int


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=step_like() | st.lists(step_like(), min_size=1, max_size=3))
@example(body={**PLAIN[1], "metadata": {"n": BIG}})
@example(body={**PLAIN[1], "metadata": {"n": -BIG}})
@example(body={**PLAIN[2], "prompt_messages": [{"role": "user", "content": "hi", "n": BIG}]})
@example(body={**PLAIN[0], "reward": BIG})
@example(body={**PLAIN[0], "reward": 2**53})
@example(body={**PLAIN[1], "response_logprobs": [-BIG] * 9})
@example(body={**PLAIN[0], "step_index": BIG})
@example(body={**PLAIN[0], "policy_version": -2**63 - 1})
@example(body={**PLAIN[0], "prompt_token_ids": [BIG]})
@example(body={**PLAIN[0], "reward": 1e400})
def test_the_orjson_parse_accepts_only_what_parse_json_packs_the_same(body: Any) -> None:
    """``pack_body`` parses with orjson; what it accepts, it packs as ``pack_steps`` packs the body as
    ``parse_json`` reads it (that path is checked against the model path above)."""
    raw = as_body(body)
    fast = pack_body(raw, SOURCE, NOW, max_batch=10)
    if fast is None:
        return  # the model path parses it with parse_json and answers
    reference = parse_json(raw)
    assert fast == pack_steps(reference if isinstance(reference, list) else [reference], SOURCE, NOW)


@pytest.mark.parametrize("body", [
    {**PLAIN[1], "metadata": {"n": BIG}}, {**PLAIN[0], "reward": BIG}, {**PLAIN[0], "policy_version": BIG},
    {**PLAIN[1], "response_logprobs": [-float(BIG)] * 9}, {**PLAIN[0], "metadata": {"n": 1e16}},
    {**PLAIN[0], "reward": math.nan}, [PLAIN[0]] * 11, [], b"not json",
    {**PLAIN[0], "trajectory_id": "t\r\n"}, {**PLAIN[0], "step_id": "s\x00"},
    {**PLAIN[0], "prompt_messages": [{"role": "assistant", "tool_calls": [
        {"function": {"name": "f", "arguments": "[" * 201 + "]" * 201}}]}]}])
def test_numbers_orjson_may_round_and_bodies_it_refuses_go_to_the_model_path(body: Any) -> None:
    raw = body if isinstance(body, bytes) else as_body(body)
    assert pack_body(raw, SOURCE, NOW, max_batch=10) is None


def nested(depth: int) -> Any:
    """An object ``depth`` levels deep (``{}`` is one), objects and lists in turn."""
    value: Any = {} if depth % 2 else []
    for level in range(depth - 1, 0, -1):
        value = {"a": value} if level % 2 else [value]
    return value


def test_metadata_nests_as_deep_as_on_the_model_path_and_no_deeper() -> None:
    """orjson reads 1,024 levels: the fast path packed 300-deep metadata the API's limit refuses."""
    at_limit = {**PLAIN[0], "metadata": nested(MAX_JSON_DEPTH - 1)}  # the body is one more level
    assert pack_body(as_body(at_limit), SOURCE, NOW, max_batch=10) is not None
    for depth in (MAX_JSON_DEPTH, 300, 600):
        raw = as_body({**PLAIN[0], "metadata": nested(depth)})
        assert pack_body(raw, SOURCE, NOW, max_batch=10) is None, depth
        with pytest.raises(ApiError) as refused:
            parse_json(raw)
        assert refused.value.status == 400 and "nests deeper than 200 levels" in refused.value.message


def test_the_bench_body_takes_the_orjson_parse() -> None:
    raw = as_body([make_step(n) for n in range(5)] + PLAIN)
    assert pack_body(raw, SOURCE, NOW, max_batch=10) == pack_steps(parse_json(raw), SOURCE, NOW) is not None


def test_a_batch_encodes_as_the_model_path_batch_does() -> None:
    fast = fast_path(PLAIN)
    assert fast is not None
    model = [model_path(item) for item in PLAIN]
    assert CODEC.encode_batch("whitebox_step", [record for _, _, record, _ in fast]) == \
        CODEC.encode_batch("whitebox_step", [m[2] for m in model if m is not None])


def test_minted_step_ids_are_routable_to_their_trajectory() -> None:
    from clawr1.core.routing import id_tag, key_hash

    fast = fast_path([PLAIN[0], PLAIN[1]])
    assert fast is not None
    assert id_tag(fast[0][0]) == key_hash("t")
    assert fast[1][0] == "given-id"  # a client's own step id stays as given


def test_with_a_schema_registry_a_fast_path_envelope_is_framed_by_the_registry() -> None:
    from clawr1.schemas.codec import AvroCodec
    from tests.support.schema_registry import RegistryStub

    with RegistryStub(first_id=258) as registry:
        codec = AvroCodec(registry.url)
        steps = pack_steps(PLAIN, SOURCE, NOW)
        assert steps is not None
        value = codec.encode_batch("whitebox_step", [s.record for s in steps])
        assert value[:5] == b"\x00" + (258).to_bytes(4, "big")
        decoded = codec.decode_records(value, "whitebox_step")
        assert [r["step_id"] for r in decoded] == [s.step_id for s in steps]
        assert registry.subjects == {"dev.clawr1.whitebox_step_batch": [258]}
