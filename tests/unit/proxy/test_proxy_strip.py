"""Taking the injected token-id fields out of replies: the proxy's JSON path gives, byte for byte, what
parsing with the standard library gives (it parses with orjson where that reads the same values), and the
live stream rewriter keeps the engine's framing."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawr1.core.json_depth import MAX_JSON_DEPTH, JsonTooDeep
from clawr1.core.redaction import redact_record
from clawr1.proxy.apis import openai_chat
from clawr1.proxy.stream import SseRewriter, token_id_rewriter
from clawr1.proxy.token_ids import (
    Injection,
    cut_id_lists,
    dump,
    inject_body,
    load,
    rewrite_json,
    strip_body,
    strip_chunk,
    strip_json,
)

ALL = Injection(token_ids=True, logprobs=True, sglext=True)
VLLM = Injection(token_ids=True, logprobs=True)
PROMPT = list(range(0, 4000, 3))  # long enough for the vectorised id-list check, with a lone 0


DROP = "drop"


def stdlib_path(data: bytes, injection: Injection, chunk: bool) -> Any:
    """The JSON path parsing with the standard library: the stripped object, None (unchanged) or DROP."""
    try:
        obj = json.loads(data)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    if chunk:
        changed = strip_chunk(obj, injection)
        if changed is None:
            return DROP
    else:
        changed = strip_json(obj, injection)
    return obj if changed else None


def stdlib_body(data: bytes, injection: Injection) -> bytes | None:
    expected = stdlib_path(data, injection, chunk=False)
    try:
        return None if expected is None else dump(expected)
    except ValueError:  # a lone surrogate cannot be written back: the agent gets the engine's body
        return None


def rewrite(upstream: bytes, injection: Injection, size: int) -> bytes:
    rewriter = token_id_rewriter(injection)
    out = b"".join(rewriter.feed(upstream[i:i + size]) for i in range(0, len(upstream), size))
    return out + rewriter.flush()


def stdlib_event(data: bytes, injection: Injection) -> bytes:
    """A one-line ``data:`` event as the standard-library path rewrites it."""
    expected = stdlib_path(data, injection, chunk=True)
    if expected is DROP:
        return b""
    try:
        return b"data: " + (data if expected is None else dump(expected)) + b"\n\n"
    except ValueError:  # cannot be written back: the event passes as it came
        return b"data: " + data + b"\n\n"


def vllm_plain(ids: bool) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": 'say "token_ids": [1] \\ é'},
                     "logprobs": {"content": [{"token": "say", "logprob": -0.25, "bytes": [115, 97, 121],
                                               "top_logprobs": []}]} if ids else None,
                     "finish_reason": "stop", "stop_reason": None, "token_ids": [5, 0, 17] if ids else None}],
        "usage": {"prompt_tokens": len(PROMPT), "completion_tokens": 3}, "prompt_logprobs": None,
        "prompt_token_ids": PROMPT if ids else None, "kv_transfer_params": None,
    }


def test_vllm_plain_body_gets_back_what_the_engine_sends_unasked() -> None:
    assert strip_body(dump(vllm_plain(True)), VLLM) == dump(vllm_plain(False))
    assert strip_body(dump(vllm_plain(False)), VLLM) is None


def test_stream_chunks_lose_the_members() -> None:
    first = {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None,
                                     "finish_reason": None}], "prompt_token_ids": PROMPT}
    assert rewrite(b"data: " + dump(first) + b"\n\n", VLLM, 4096) == \
        b'data: {"id":"c","choices":[{"index":0,"delta":{"role":"assistant"},"logprobs":null,' \
        b'"finish_reason":null}]}\n\n'
    piece = {"id": "c", "choices": [{"token_ids": [7], "index": 0, "delta": {"content": "x"},
                                     "logprobs": {"content": []}, "response_token_ids": [7]}]}
    assert rewrite(b"data: " + dump(piece) + b"\n\n", VLLM, 4096) == \
        b'data: {"id":"c","choices":[{"index":0,"delta":{"content":"x"},"logprobs":null}]}\n\n'
    assert rewrite(b"data: [DONE]\n\n", VLLM, 3) == b"data: [DONE]\n\n"


def test_a_chunk_that_only_carried_sglext_is_dropped() -> None:
    only = {"id": "c", "choices": [{"index": 1, "delta": {}, "finish_reason": None}],
            "sglext": {"input_ids": [1], "output_ids": [2]}}
    assert rewrite(b"data: " + dump(only) + b"\n\n", ALL, 5) == b""
    assert strip_body(dump(only), ALL) == \
        b'{"id":"c","choices":[{"index":1,"delta":{},"finish_reason":null}]}'
    finish = {"sglext": {}, "id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    assert rewrite(b"data: " + dump(finish) + b"\n\n", ALL, 5) == \
        b'data: {"id":"c","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n'


@pytest.mark.parametrize("body", [
    b'{"choices":[{"index":0,"message":{"token_ids":[1]}}]}',  # nested where strip_json never looks
    b'{"prompt_token_ids":[1],"prompt_token_ids":[2],"choices":[]}',  # duplicate key
    b'{"prompt_token_ids":[1],"x":NaN,"choices":[]}',  # the engine's own NaN
    b'{"prompt_token_ids":[1],"choices":[{"\\u0074oken_ids":[2]}]}',  # a key spelled with escapes
    b'{"prompt_token_ids":[1],"x":"\\ud800","choices":[]}',  # a lone surrogate: cannot be written back
    b'{"prompt_token_ids":[1],"x":123456789012345678901234567890,"choices":[]}',  # past 64 bits
    b'{"prompt_token_ids":[1],"choices":[]',  # cut short
    b'{"prompt_token_ids":[1,,2],"choices":[]}',  # not JSON
    b'{"prompt_token_ids":[01],"choices":[]}',
    b'\xef\xbb\xbf{"prompt_token_ids":[1],"choices":[]}',  # a byte-order mark
    b'{"prompt_token_ids":[1],"choices":[],"x":"\xff"}',  # not UTF-8
    b'{"prompt_token_ids": [ 1 , 2 ] , "choices":[{"token_ids":["a"],"logprobs":[-1.5]}]}',
    b'{"prompt_token_ids":null,"choices":[{"token_ids":null,"logprobs":null}]}',
    b'{"choices":[{"token_ids":null,"sglext":null}],"id":"x"}',
    b'{"choices":5,"prompt_token_ids":[1]}', b'{"choices":{"token_ids":[1]}}',
    b'{"content":"token_ids","choices":[]}', b'["prompt_token_ids"]', b"{}", b"",
])
def test_unusual_bodies_are_stripped_as_the_standard_library_reads_them(body: bytes) -> None:
    assert strip_body(body, ALL) == stdlib_body(body, ALL)
    if b"\n" not in body:
        assert rewrite(b"data: " + body + b"\n\n", ALL, 7) == stdlib_event(body, ALL)


# -- id lists cut before parsing ----------------------------------------------------------------

CUT = b'["\\u0000clawr1: ids cut"]'


def whole_text(body: bytes, injection: Injection) -> bytes | None:
    """``strip_body`` with nothing cut: the whole text through the same path."""
    try:
        out = rewrite_json(body, lambda obj: strip_json(obj, injection))
    except ValueError:
        return None
    return out if isinstance(out, bytes) else None


@pytest.mark.parametrize(("body", "cut"), [
    (b'{"prompt_token_ids":[1,20,0,300],"choices":[{"token_ids":[0],"response_token_ids":[5,6]}]}',
     b'{"prompt_token_ids":' + CUT + b',"choices":[{"token_ids":' + CUT + b',"response_token_ids":' + CUT
     + b"}]}"),
    (b'{"x":"\\"prompt_token_ids\\":[1]","token_ids":[2]}',  # in a string: escaped
     b'{"x":"\\"prompt_token_ids\\":[1]","token_ids":' + CUT + b"}"),
    (b'{"prompt_token_ids": [1],"xtoken_ids":[1],"choices":[]}', None),  # spaced; another key
    (b'{"a_token_ids":[1],"token_ids":[],"prompt_token_ids":[-1],"response_token_ids":[1.5]}', None),
    (b'{"token_ids":[01],"prompt_token_ids":[1,,2],"response_token_ids":[1,]}', None),  # not JSON integers
    (b'{"token_ids":[0,00]}', None), (b'{"token_ids":[[1]]}', None), (b'{"token_ids":[1', None),
    (b'"token_ids":[1]', None), (b'{"token_ids":["1"]}', None),
])
def test_only_compact_integer_lists_under_an_id_key_are_cut(body: bytes, cut: bytes | None) -> None:
    assert cut_id_lists(body) == (body if cut is None else cut)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet="0123456789, -", max_size=24))
def test_an_id_list_is_cut_only_when_json_reads_integers_from_it(items: str) -> None:
    try:
        read = json.loads(f"[{items}]")
        integers = bool(read) and all(isinstance(i, int) and i >= 0 for i in read) and " " not in items \
            and "-" not in items
    except ValueError:
        integers = False
    body = f'{{"token_ids":[{items}]}}'.encode()
    assert (cut_id_lists(body) != body) is integers


@pytest.mark.parametrize("body", [
    b'{"choices":[{"message":{"token_ids":[1,2]}}],"prompt_token_ids":[3]}',  # where strip never looks
    b'{"token_ids":[1,2],"choices":[]}',  # at the top, not in a choice: kept
    b'{"prompt_token_ids":[1],"choices":[],"x":"\\u0000clawr1: ids cut"}',  # the mark in the engine's text
    b'{"prompt_token_ids":[1],"choices":[],"x":NaN}', b'{"prompt_token_ids":[1],"choices":[]',
])
def test_a_cut_list_the_transform_keeps_sends_the_whole_text_through(body: bytes) -> None:
    assert cut_id_lists(body) != body
    assert strip_body(body, ALL) == whole_text(body, ALL) == stdlib_body(body, ALL)
    if body.endswith(b"}"):
        assert rewrite(b"data: " + body + b"\n\n", ALL, 9) == stdlib_event(body, ALL)


def test_ids_the_agent_asked_for_are_not_cut() -> None:
    """Without injected ids nothing removes the lists: cutting them would only read the text twice."""
    body = dump(vllm_plain(True))
    own = Injection(token_ids=False, logprobs=True)
    assert strip_body(body, own) == stdlib_body(body, own)
    assert b'"prompt_token_ids":[0,3,6' in (strip_body(body, own) or b"")


# -- differential: random replies in several layouts --------------------------------------------

TRICKY = ['"token_ids":[1]', "\\", '"', "}", "]", "é", "😀", "\n", "NaN", "null", ",", '\\"logprobs\\":']
text = st.one_of(st.text(max_size=12), st.sampled_from(TRICKY))
ids = st.lists(st.integers(0, 200_000), max_size=12)
long_ids = st.one_of(ids, st.lists(st.integers(0, 9), min_size=300, max_size=400))
scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(-1e6, 1e6, allow_nan=False), text)
our_names = st.sampled_from(["token_ids", "prompt_token_ids", "response_token_ids", "logprobs", "sglext"])
keys = st.one_of(st.sampled_from(["content", "role", "x", "top_logprobs"]), our_names)
loose = st.dictionaries(keys, st.one_of(scalar, ids), max_size=3)
logprobs = st.one_of(
    st.none(),
    st.fixed_dictionaries({"content": st.lists(st.fixed_dictionaries(
        {"token": text, "logprob": st.floats(-30, 0), "bytes": ids, "top_logprobs": st.just([])}),
        max_size=3)}),
    st.fixed_dictionaries({"tokens": st.lists(text, max_size=3),
                           "token_logprobs": st.lists(st.floats(-30, 0))}),
)
sglext = st.one_of(st.none(), st.fixed_dictionaries({}, optional={"input_ids": ids, "output_ids": ids}))


@st.composite
def shuffled(draw: st.DrawFn, members: st.SearchStrategy[dict[str, Any]]) -> dict[str, Any]:
    return dict(draw(st.permutations(list(draw(members).items()))))


choice = shuffled(st.fixed_dictionaries({"index": st.integers(0, 3)}, optional={
    "message": loose, "delta": loose, "logprobs": logprobs, "token_ids": st.one_of(st.none(), ids),
    "response_token_ids": ids, "prompt_token_ids": long_ids, "sglext": sglext,
    "finish_reason": st.one_of(st.none(), st.just("stop")), "text": text}))
reply = shuffled(st.fixed_dictionaries({"id": text}, optional={
    "choices": st.one_of(st.lists(choice, max_size=3), scalar),
    "prompt_token_ids": st.one_of(st.none(), long_ids),
    "usage": st.one_of(st.none(), loose), "sglext": sglext, "prompt_logprobs": st.none(), "extra": loose,
    "model": text}))
injections = st.builds(Injection, st.booleans(), st.booleans(), st.booleans())
LAYOUTS = {
    "compact": lambda o: dump(o),
    "ascii": lambda o: json.dumps(o, ensure_ascii=True, separators=(",", ":")).encode(),
    "spaced": lambda o: json.dumps(o).encode(),
    "indented": lambda o: json.dumps(o, indent=2, ensure_ascii=False).encode(),
}


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reply, injections, st.sampled_from(sorted(LAYOUTS)))
def test_differential_against_the_standard_library(obj: dict[str, Any], injection: Injection,
                                                   layout: str) -> None:
    body = LAYOUTS[layout](obj)
    assert strip_body(body, injection) == stdlib_body(body, injection)
    if b"\n" not in body:
        assert rewrite(b"data: " + body + b"\n\n", injection, 64) == stdlib_event(body, injection)


@settings(max_examples=200, deadline=None)
@given(reply, injections, st.data())
def test_a_damaged_document_is_handled_as_the_standard_library_reads_it(obj: dict[str, Any],
                                                                       injection: Injection,
                                                                       data: st.DataObject) -> None:
    body = dump(obj)
    at = data.draw(st.integers(0, len(body) - 1))
    damage = data.draw(st.sampled_from([b"", b",", b"[", b"}", b"0", b'"', b"\\"]))
    damaged = body[:at] + damage + body[at + 1:]
    assert strip_body(damaged, injection) == stdlib_body(damaged, injection)
    if b"\n" not in damaged:
        assert rewrite(b"data: " + damaged + b"\n\n", injection, 64) == stdlib_event(damaged, injection)


# -- the JSON path reads what the standard library reads ------------------------------------------

@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reply, st.sampled_from(sorted(LAYOUTS)))
def test_load_reads_every_reply_as_the_standard_library_does(obj: dict[str, Any], layout: str) -> None:
    data = LAYOUTS[layout](obj)
    assert repr(load(data)) == repr(json.loads(data))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(), st.floats(allow_nan=False), st.floats(allow_nan=True, allow_infinity=True)))
def test_load_reads_every_number_as_the_standard_library_does(number: float) -> None:
    data = json.dumps({"x": [number, -number if number == number else 0]}).encode()
    assert repr(load(data)) == repr(json.loads(data))  # repr: int stays int, -0.0 and NaN compared too


@pytest.mark.parametrize("data", [
    b'{"x":NaN,"y":Infinity,"z":-Infinity}',  # the standard library's extensions
    b'{"x":1e400}',  # infinite as a double
    b'{"x":"\\ud800"}',  # a lone surrogate
    b'\xef\xbb\xbf{"x":1}',  # a byte-order mark
    b'{"x":123456789012345678901234567890}', b'{"x":18446744073709551616}',  # past 64 bits
    b'{"x":-9223372036854775809}', b'{"x":18446744073709551615}', b'{"x":-9223372036854775808}',
    b'{"x":1,"x":2}', b'{"x":-0.0,"y":5e-324,"z":1.7976931348623157e308}',
    '{"x":"é😀"}'.encode("utf-16"),  # the standard library detects UTF-16
])
def test_load_reads_the_edge_cases_as_the_standard_library_does(data: bytes) -> None:
    assert repr(load(data)) == repr(json.loads(data))


@pytest.mark.parametrize("data", [b'{"x":', b'{"x":1,}', b"\xff", b'{"x":"\xff"}', b'{"x":"a\x01"}',
                                  b'{"x":01}', b"[1] [2]", b""])
def test_load_refuses_what_the_standard_library_refuses(data: bytes) -> None:
    with pytest.raises(ValueError):
        json.loads(data)
    with pytest.raises(ValueError):
        load(data)


# -- the live stream rewriter ------------------------------------------------------------------

def test_stream_rewriting_does_not_depend_on_where_chunks_split() -> None:
    chunks = [
        {"id": "c", "choices": [{"index": 0, "delta": {"role": "assistant"}, "logprobs": None}],
         "prompt_token_ids": PROMPT},
        {"id": "c", "choices": [{"index": 0, "delta": {"content": "a\\n"}, "logprobs": {"content": [
            {"token": "a", "logprob": -1.0, "bytes": [97], "top_logprobs": []}]}, "token_ids": [97]}]},
        {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
         "sglext": {"output_ids": [1]}},
        {"id": "c", "choices": [{"index": 0, "delta": {}}], "sglext": {"output_ids": [1]}},
    ]
    upstream = b"".join(b"data: " + dump(c) + b"\n\n" for c in chunks) + b": ping\n\ndata: [DONE]\n\n"
    expected = b"".join(stdlib_event(dump(c), ALL) for c in chunks) + b": ping\n\ndata: [DONE]\n\n"
    for size in (1, 5, 4096, len(upstream)):
        assert rewrite(upstream, ALL, size) == expected
    assert expected.count(b"data: ") == 4  # the sglext-only chunk is gone


def test_stream_framing_is_kept_as_the_engine_sent_it() -> None:
    raw = b'data:{"prompt_token_ids":' + dump(PROMPT) + b',"choices":[]}\r\n\r\n'
    assert rewrite(raw, VLLM, 700) == b'data:{"choices":[]}\r\n\r\n'
    assert rewrite(b'data:{"prompt_token_ids":[1],"choices":[]}\r\n\r\n', VLLM, 7) == \
        b'data:{"choices":[]}\r\n\r\n'
    # Two data lines: joined, as the SSE spec reads them, and written as one.
    split = b'data: {"prompt_token_ids":[1],\ndata: "choices":[]}\n\n'
    assert rewrite(split, VLLM, 7) == b'data: {"choices":[]}\n\n'
    named = b'event: chunk\r\ndata: {"prompt_token_ids":[1],"choices":[]}\r\n\r\n'
    assert rewrite(named, VLLM, 3) == b'event: chunk\r\ndata: {"choices":[]}\r\n\r\n'


def test_an_event_no_path_can_rewrite_passes_unchanged() -> None:
    def broken(obj: dict[str, Any]) -> bool:
        raise RuntimeError("boom")

    rewriter = SseRewriter(broken)
    event = b'data: {"prompt_token_ids":[1]}\n\n'
    assert rewriter.feed(event) == event


def test_redaction_leaves_number_fields_alone_and_the_same_objects() -> None:
    record = {"request_body": "key sk-abcdefghijklmnopqrstuvwxyz123456", "prompt_token_ids": PROMPT,
              "choices": [{"text": "ok", "token_ids": [1, 2], "logprobs": [-0.5, -1.0]}], "capture_notes": []}
    redacted = redact_record(record)
    assert "sk-abcdefghijklmnopqrstuvwxyz123456" not in redacted["request_body"]
    assert redacted["prompt_token_ids"] is PROMPT
    assert redacted["choices"][0] == {"text": "ok", "token_ids": [1, 2], "logprobs": [-0.5, -1.0]}


def test_a_lone_surrogate_from_the_engine_still_loses_the_injected_members() -> None:
    """A JavaScript server escapes a lone surrogate (text cut inside a pair) as ``\\ud83d``; UTF-8 cannot
    write it, so stripping gave up and the agent got the token ids it never asked for. Now the body
    goes back with non-ASCII escaped: the same JSON, the surrogate as it came."""
    reply = vllm_plain(True)
    reply["choices"][0]["message"]["content"] = "cut \ud83d é"
    asked = vllm_plain(False)
    asked["choices"][0]["message"]["content"] = "cut \ud83d é"
    stripped = strip_body(json.dumps(reply).encode(), VLLM)
    assert stripped is not None and json.loads(stripped) == asked
    chunk = {"id": "c", "choices": [{"index": 0, "delta": {"content": "cut \ud83d"}, "logprobs": None,
                                     "finish_reason": None}], "prompt_token_ids": PROMPT}
    out = rewrite(b"data: " + json.dumps(chunk).encode() + b"\n\n", VLLM, 4096)
    del chunk["prompt_token_ids"]
    assert json.loads(out.removeprefix(b"data: ")) == chunk
    request = {"model": "m", "messages": [{"role": "user", "content": "cut \ud83d"}], "logprobs": False}
    injected = inject_body(openai_chat.NAME, json.dumps(request).encode())
    assert injected is not None and json.loads(injected[0])["messages"] == request["messages"]


@pytest.mark.parametrize("depth", [201, 1_100, 50_000])
def test_json_of_any_depth_reaches_the_agent_as_the_engine_sent_it(depth: int) -> None:
    """Past the one nesting limit nothing is parsed (a RecursionError escaped the hooks past 1,024): the
    agent gets the engine's bytes, the request goes upstream as the agent sent it."""
    deep = ("[" * depth + "]" * depth).encode()
    reply = b'{"choices": [], "prompt_token_ids": [1], "x": ' + deep + b"}"
    assert strip_body(reply, ALL) is None
    request = b'{"logprobs": true, "messages": ' + deep + b"}"
    assert inject_body(openai_chat.NAME, request) is None
    with pytest.raises(ValueError, match="nests deeper than 200 levels"):
        load(reply)
    rewriter = SseRewriter(lambda obj: strip_chunk(obj, ALL))
    event = b"data: " + reply + b"\n\n"
    assert rewriter.feed(event) + rewriter.flush() == event


@pytest.mark.parametrize("wrap", ["[{}]", '{{"a": {}}}'])
def test_load_reads_up_to_the_limit_and_no_further(wrap: str) -> None:
    """``load`` checks what orjson read against the one limit through orjson's own writing limit."""
    def nested(depth: int) -> bytes:
        text = "1"
        for _ in range(depth):
            text = wrap.format(text)
        return text.encode()

    assert load(nested(MAX_JSON_DEPTH)) == json.loads(nested(MAX_JSON_DEPTH))
    for depth in (MAX_JSON_DEPTH + 1, 254, 255, 1_024, 1_025):
        with pytest.raises(JsonTooDeep):
            load(nested(depth))
    with pytest.raises(JsonTooDeep):  # the standard library's path (a NaN): measured on the text
        load(b'{"x": NaN, "y": ' + nested(MAX_JSON_DEPTH) + b"}")
