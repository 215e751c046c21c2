"""Token-id injection takes back out exactly what it added, from plain bodies and live SSE streams."""

from __future__ import annotations

import json

from clawr1.proxy.stream import SseRewriter, StreamTee
from clawr1.proxy.token_ids import (
    Injection,
    TokenIdPolicy,
    inject,
    inject_body,
    refused_field,
    strip_body,
    strip_chunk,
    strip_json,
    wants_sglext,
)

BOTH = Injection(token_ids=True, logprobs=True)


def test_inject_adds_only_what_the_agent_did_not_ask_for() -> None:
    body = {"messages": []}
    assert inject("openai.chat", body) == BOTH
    assert body == {"messages": [], "return_token_ids": True, "logprobs": True}
    asked = {"messages": [], "return_token_ids": True, "logprobs": True}
    assert inject("openai.chat", asked) is None
    completions = {"prompt": "x", "logprobs": 0}
    assert inject("openai.completions", completions) == Injection(token_ids=True, logprobs=False)
    assert inject("anthropic.messages", {"messages": []}) is None


def test_inject_body_splices_without_reparsing_and_falls_back_when_names_occur() -> None:
    spliced, injection = inject_body("openai.chat", b' {"model": "m", "messages": []}')
    assert injection == BOTH
    assert json.loads(spliced) == {"return_token_ids": True, "logprobs": True, "model": "m", "messages": []}
    spliced, _ = inject_body("openai.completions", b"{}")
    assert json.loads(spliced) == {"return_token_ids": True, "logprobs": 1}
    # The field name appears inside a message: the body is parsed, nothing is duplicated.
    body = b'{"messages": [{"role": "user", "content": "what does \\"logprobs\\" mean?"}]}'
    parsed, injection = inject_body("openai.chat", body)
    assert injection == BOTH and json.loads(parsed)["logprobs"] is True
    assert inject_body("openai.chat", b'{"return_token_ids": true, "logprobs": true}') is None
    assert inject_body("openai.chat", b"not json") is None


def test_plain_vllm_body_gets_nulls_back_where_the_engine_writes_nulls() -> None:
    body = {
        "id": "c",
        "prompt_logprobs": None,
        "prompt_token_ids": [1, 2],
        "choices": [{"index": 0, "message": {}, "logprobs": {"content": []}, "token_ids": [3]}],
    }
    stripped = json.loads(strip_body(json.dumps(body).encode(), BOTH) or b"")
    assert stripped == {
        "id": "c",
        "prompt_logprobs": None,
        "prompt_token_ids": None,
        "choices": [{"index": 0, "message": {}, "logprobs": None, "token_ids": None}],
    }


def test_stream_chunk_loses_injected_fields_entirely() -> None:
    chunk = {
        "id": "c",
        "prompt_token_ids": [1],
        "choices": [
            {
                "index": 0,
                "delta": {},
                "logprobs": {"content": []},
                "token_ids": [5],
                "response_token_ids": [5],
            }
        ],
    }
    assert strip_json(chunk, BOTH)
    assert chunk == {"id": "c", "choices": [{"index": 0, "delta": {}, "logprobs": None}]}
    assert not strip_json(chunk, BOTH)
    assert strip_body(b'{"id": "c", "choices": []}', BOTH) is None


def _events(*objs: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(o, separators=(",", ":")).encode() + b"\n\n" for o in objs)


def test_rewriter_strips_events_split_anywhere_and_passes_others_byte_for_byte() -> None:
    upstream = (
        _events({"id": "a", "choices": [{"index": 0, "delta": {"content": "x"}, "token_ids": [1]}]})
        + b": keep-alive\n\n"
        + _events({"id": "b", "choices": []})
        + b"data: [DONE]\n\n"
    )
    for size in (1, 7, len(upstream)):
        rewriter = SseRewriter(lambda obj: strip_json(obj, BOTH))
        out = b"".join(rewriter.feed(upstream[i : i + size]) for i in range(0, len(upstream), size))
        out += rewriter.flush()
        assert out == (
            _events({"id": "a", "choices": [{"index": 0, "delta": {"content": "x"}}]})
            + b": keep-alive\n\n"
            + _events({"id": "b", "choices": []})
            + b"data: [DONE]\n\n"
        )


def test_rewriter_keeps_event_names_and_crlf_framing() -> None:
    rewriter = SseRewriter(lambda obj: strip_json(obj, BOTH))
    raw = b'event: chunk\r\ndata: {"prompt_token_ids":[1],"choices":[]}\r\n\r\n'
    assert rewriter.feed(raw) == b'event: chunk\r\ndata: {"choices":[]}\r\n\r\n'


def test_tee_forwards_at_once_and_never_sends_an_empty_chunk() -> None:
    plain = StreamTee()
    assert plain(b"data: 1\n\n") == [b"data: 1\n\n"]
    assert plain(b"") == []
    assert bytes(plain.upstream) == b"data: 1\n\n" and plain.sent is None
    rewriting = StreamTee(SseRewriter(lambda obj: strip_json(obj, BOTH)))
    assert rewriting(b'data: {"prompt_token_ids":[1],') == []
    assert rewriting(b'"choices":[]}\n\n') == [b'data: {"choices":[]}\n\n']
    assert rewriting(b"") == []
    assert bytes(rewriting.upstream) == b'data: {"prompt_token_ids":[1],"choices":[]}\n\n'
    assert bytes(rewriting.sent or b"") == b'data: {"choices":[]}\n\n'


def test_policy_asks_listed_hosts_until_one_refuses() -> None:
    policy = TokenIdPolicy.parse(" vllm:8000, sglang ,")
    assert policy.skip_reason("vllm", 8000) is None and policy.skip_reason("SGLang", 30000) is None
    assert policy.skip_reason("vllm", 9000) == \
        "token ids not requested: vllm:9000 is not in CLAWR1_TOKEN_ID_HOSTS"
    policy.remember_refusal("vllm", 8000)
    assert policy.skip_reason("vllm", 8000) == \
        "token ids not requested: vllm:8000 refused injected fields earlier"
    assert TokenIdPolicy.parse("*").skip_reason("api.openai.com", 443) is None
    assert TokenIdPolicy.parse("").skip_reason("127.0.0.1", 8000) is not None


def test_only_an_error_naming_an_injected_field_is_a_refusal() -> None:
    openai_style = b'{"error": {"message": "Unrecognized request argument supplied: return_token_ids"}}'
    assert refused_field(400, openai_style, BOTH) == "return_token_ids"
    reasoning = b'{"error": {"message": "logprobs is not supported with this model."}}'
    assert refused_field(400, reasoning, BOTH) == "logprobs"
    assert refused_field(422, reasoning, BOTH) == "logprobs"
    assert refused_field(400, reasoning, Injection(token_ids=True, logprobs=False)) is None  # the agent's own
    assert refused_field(400, b'{"error": {"message": "messages must be a list"}}', BOTH) is None
    assert refused_field(500, openai_style, BOTH) is None


def test_agent_asking_sglang_itself_is_left_alone() -> None:
    assert wants_sglext({"x-sglext-return-output-ids": "1"}, b"{}")
    assert wants_sglext({}, b'{"return_input_ids_in_sglext": true}')
    assert not wants_sglext({}, b'{"messages": []}')


def test_sglext_is_stripped_and_a_chunk_that_only_carried_it_is_dropped() -> None:
    sglang = Injection(token_ids=True, logprobs=False, sglext=True)
    plain = {"id": "c", "sglext": {"input_ids": [1]},
             "choices": [{"index": 0, "message": {"content": "x"}, "sglext": {"output_ids": [2]}}]}
    assert strip_chunk(plain, sglang) is True
    assert plain == {"id": "c", "choices": [{"index": 0, "message": {"content": "x"}}]}
    only_ids = {"id": "c", "choices": [{"index": 1, "delta": {}, "finish_reason": None}],
                "sglext": {"input_ids": [1], "output_ids": [2]}}
    events = b"data: " + json.dumps(only_ids).encode() + b"\n\ndata: [DONE]\n\n"
    assert strip_chunk(only_ids, sglang) is None
    finish = {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "sglext": {}}
    assert strip_chunk(finish, sglang) is True and "sglext" not in finish
    # Asked for by the agent: untouched.
    asked = {"choices": [], "sglext": {"output_ids": [2]}}
    assert strip_chunk(asked, BOTH) is False and asked["sglext"] == {"output_ids": [2]}
    rewriter = SseRewriter(lambda obj: strip_chunk(obj, sglang))
    assert rewriter.feed(events) == b"data: [DONE]\n\n"
