"""Captured calls become schema-valid raw_llm_call records: exact ids, the agent's view, no secrets."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace

from clawr1.core.conversation import conversation_key
from clawr1.core.json_depth import MAX_JSON_DEPTH, too_deep
from clawr1.core.redaction import TOO_DEEP, TOO_DEEP_NOTE
from clawr1.core.routing import id_tag, key_hash
from clawr1.proxy.hints import Hints
from clawr1.proxy.record import (
    ARGUMENTS_CUT,
    DEEP_ARGUMENTS_NOTE,
    CapturedCall,
    build_record,
    envelope_of,
    spooled,
)
from clawr1.proxy.token_ids import Injection
from clawr1.schemas.codec import codec_for
from clawr1.streams.normalize import step_status
from clawr1.streams.turns import turn_from_llm_call
from tests.support.stream_harness import Harness

MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
SECRET = "sk-proj-supersecret0123456789"


def _sse(*objs: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(o).encode() + b"\n\n" for o in objs) + b"data: [DONE]\n\n"


ENGINE_STREAM = _sse(
    {
        "id": "c1",
        "model": "m",
        "prompt_token_ids": [1, 2, 3],
        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
    },
    {
        "id": "c1",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": {"content": "Hey"},
                "token_ids": [7, 8],
                "logprobs": {"content": [{"logprob": -0.1}, {"logprob": -0.2}]},
            }
        ],
    },
    {
        "id": "c1",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "delta": {},
                "finish_reason": "stop",
                "token_ids": [9],
                "logprobs": {"content": [{"logprob": -0.3}]},
            }
        ],
    },
    {"id": "c1", "model": "m", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}},
)
AGENT_STREAM = _sse(
    {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
    {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": "Hey"}, "logprobs": None}]},
)

CALL = CapturedCall(
    flow_id="flow-1",
    api="openai.chat",
    method="POST",
    url=f"http://up:8000/v1/chat/completions?api_key={SECRET}",
    upstream="http://up:8000",
    request_headers=(("Authorization", f"Bearer {SECRET}"), ("Content-Type", "application/json")),
    request_body=json.dumps({"model": "m", "messages": MESSAGES, "stream": True}).encode(),
    hints=Hints(),
    streamed=True,
    status=200,
    response_headers=(("content-type", "text/event-stream"), ("set-cookie", f"s={SECRET}")),
    response_body=AGENT_STREAM,
    response_encoding="",
    engine_body=ENGINE_STREAM,
    injection=Injection(token_ids=True, logprobs=True),
    started=1000.0,
    first_byte=1000.25,
    finished=1001.0,
    captured_at=1001.5,
)


def test_streamed_call_keeps_engine_ids_and_what_the_agent_saw() -> None:
    key, record = build_record(CALL, "proxy-a")
    name, decoded = codec_for().decode(codec_for().encode("raw_llm_call", record))
    assert name == "raw_llm_call"
    assert key == decoded["conversation_key"] == conversation_key(MESSAGES)
    assert decoded["prompt_token_ids"] == [1, 2, 3] and decoded["token_source"] == "engine"
    (choice,) = decoded["choices"]
    assert (choice["text"], choice["token_ids"], choice["logprobs"], choice["finish_reason"]) == (
        "Hey",
        [7, 8, 9],
        [-0.1, -0.2, -0.3],
        "stop",
    )
    assert json.loads(choice["reply_messages_json"]) == [{"role": "assistant", "content": "Hey"}]
    assert decoded["response_body"] == AGENT_STREAM.decode()
    assert json.loads(decoded["assembled_response"])["choices"][0]["logprobs"] is None
    assert (decoded["prompt_tokens"], decoded["completion_tokens"], decoded["response_id"]) == (3, 3, "c1")
    assert (decoded["request_started_ms"], decoded["first_byte_ms"], decoded["finished_ms"]) == (
        1000000,
        1000250,
        1001000,
    )
    assert json.loads(decoded["messages_json"]) == MESSAGES and decoded["capture_notes"] == []
    assert (
        build_record(CALL, "proxy-a")[1]["event_id"]
        == record["event_id"]
        != build_record(CALL, "b")[1]["event_id"]
    )


def test_no_secret_reaches_the_record() -> None:
    _, record = build_record(CALL, "proxy-a")
    encoded = codec_for().encode("raw_llm_call", record)
    assert SECRET.encode() not in encoded
    assert record["request_headers"] == {"content-type": "application/json"}
    assert record["url"] == "http://up:8000/v1/chat/completions"


def test_trajectory_hint_is_the_key_and_hints_are_kept() -> None:
    hints = Hints("traj-9", "group-1", 4, 3, "agent-x", True)
    key, record = build_record(replace(CALL, hints=hints), "p")
    assert key == "traj-9"
    assert (
        record["trajectory_id"],
        record["prompt_group_id"],
        record["prompt_group_size"],
        record["policy_version"],
        record["agent"],
        record["terminal"],
    ) == ("traj-9", "group-1", 4, 3, "agent-x", True)
    assert record["conversation_key"] == conversation_key(MESSAGES)


def test_the_policy_version_is_the_engines_report_else_its_resumed_version_else_the_hint() -> None:
    def version(body: dict, engine_version: int | None) -> int | None:
        call = replace(CALL, streamed=False, engine_body=None, injection=None, hints=Hints(policy_version=3),
                       response_body=json.dumps(body).encode(), engine="http://up:8000",
                       engine_version=engine_version)
        return build_record(call, "p")[1]["policy_version"]

    message = {"role": "assistant", "content": "x"}
    reply = {"id": "c1", "model": "m", "choices": [{"index": 0, "message": message}]}
    assert version(reply, None) == 3
    assert version(reply, 7) == 7
    assert version({**reply, "metadata": {"weight_version": "default"}}, 7) == 7  # SGLang's unnamed version
    assert version({**reply, "metadata": {"weight_version": "12"}}, 7) == 12
    assert version({**reply, "metadata": {"weight_version": 13}}, None) == 13
    assert build_record(replace(CALL, engine="http://up:8000"), "p")[1]["engine"] == "http://up:8000"


def test_the_event_id_is_routable_to_the_records_kafka_key() -> None:
    plain_key, plain = build_record(CALL, "p")
    _, hinted = build_record(replace(CALL, hints=Hints(trajectory_id="traj-9")), "p")
    assert plain_key == conversation_key(MESSAGES) and id_tag(plain["event_id"]) == key_hash(plain_key)
    assert id_tag(hinted["event_id"]) == key_hash("traj-9")
    assert build_record(CALL, "p")[1]["event_id"] == plain["event_id"]  # the same capture, the same id


def test_inconsistent_ids_are_noted_not_fixed() -> None:
    engine = ENGINE_STREAM.replace(b'"completion_tokens": 3', b'"completion_tokens": 5')
    _, record = build_record(replace(CALL, engine_body=engine), "p")
    assert record["choices"][0]["token_ids"] == [7, 8, 9]
    assert record["capture_notes"] == ["response token ids total 3, usage says 5"]


def test_plain_compressed_response_without_ids_says_so() -> None:
    body = {
        "id": "c2",
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
    }
    call = replace(
        CALL,
        streamed=False,
        response_body=gzip.compress(json.dumps(body).encode()),
        response_encoding="gzip",
        engine_body=None,
        injection=None,
    )
    _, record = build_record(call, "p")
    assert record["token_source"] == "none" and record["prompt_token_ids"] == []
    assert json.loads(record["assembled_response"]) == body and record["choices"][0]["text"] == "ok"


def test_upstream_errors_and_aborts_become_failed_calls() -> None:
    error_body = json.dumps({"error": {"message": "model overloaded"}}).encode()
    _, failed = build_record(
        replace(CALL, streamed=False, status=503, response_body=error_body, engine_body=None), "p"
    )
    assert failed["error"] == "HTTP 503: model overloaded" and failed["choices"] == []
    _, refused = build_record(
        replace(
            CALL,
            streamed=False,
            status=None,
            response_body=b"",
            engine_body=None,
            first_byte=None,
            error="Connection refused",
        ),
        "p",
    )
    assert refused["error"] == "Connection refused" and refused["response_status"] is None
    cut = ENGINE_STREAM[: ENGINE_STREAM.index(b'"finish_reason"')]
    _, aborted = build_record(replace(CALL, engine_body=cut, error="Client disconnected."), "p")
    assert aborted["error"] == "Client disconnected." and aborted["choices"][0]["text"] == "Hey"
    codec_for().encode("raw_llm_call", aborted)
    # The agent read the whole stream and hung up before the upstream closed it: not a failure.
    _, finished = build_record(replace(CALL, error="Client disconnected."), "p")
    assert finished["error"] is None and any("closed the connection after" in n
                                             for n in finished["capture_notes"])


def test_refused_and_cut_calls_become_refused_and_truncated_steps() -> None:
    """The contract with the streams: finish reason ``refusal`` and the truncation note set the status."""
    refusal = _sse(
        {"id": "c3", "choices": [{"index": 0, "delta": {"role": "assistant", "refusal": "No"}}]},
        {"id": "c3", "choices": [{"index": 0, "delta": {"refusal": "pe."}, "finish_reason": "stop"}]},
    )
    plain = replace(CALL, engine_body=None, injection=None)
    cut = ENGINE_STREAM[: ENGINE_STREAM.index(b"data: [DONE]")]
    cases = {
        "refused": replace(plain, response_body=refusal),
        "truncated": replace(CALL, engine_body=cut),
        "ok": CALL,
        "failed": replace(CALL, engine_body=cut, error="Server disconnected."),
    }
    for status, call in cases.items():
        _, record = build_record(call, "p")
        _, decoded = codec_for().decode(codec_for().encode("raw_llm_call", record))
        turn = turn_from_llm_call(decoded)
        assert [step_status(turn, reply) for reply in turn.replies] == [status], status
    _, refused = build_record(cases["refused"], "p")
    assert (refused["choices"][0]["text"], refused["choices"][0]["finish_reason"]) == ("Nope.", "refusal")
    _, truncated = build_record(cases["truncated"], "p")
    assert truncated["capture_notes"] == ["stream truncated: no [DONE]"] and truncated["error"] is None


def test_hook_notes_and_client_connection_reach_the_record() -> None:
    call = replace(CALL, client_connection="conn-1", notes=("token ids not requested: up:8000 refused",))
    _, record = build_record(call, "p")
    assert record["client_connection"] == "conn-1"
    assert record["capture_notes"] == ["token ids not requested: up:8000 refused"]


def test_spooled_calls_combine_into_one_envelope_with_those_an_earlier_release_spooled() -> None:
    codec = codec_for()
    _, first = build_record(CALL, "p")
    _, second = build_record(replace(CALL, flow_id="other", engine_body=ENGINE_STREAM), "p")
    alone = spooled(codec, first)
    assert codec.decode_all(alone) == ("raw_llm_call", [codec.decode(codec.encode("raw_llm_call", first))[1]])
    older = codec.encode("raw_llm_call", second)  # a single record, as spooled before envelopes
    name, records = codec.decode_all(envelope_of(codec, [alone, older]))
    assert name == "raw_llm_call"
    assert [r["event_id"] for r in records] == [first["event_id"], second["event_id"]]
    assert records[1]["choices"][0]["token_ids"] == second["choices"][0]["token_ids"]


def test_a_request_body_is_stored_as_the_text_json_reads_and_redacted_once_read() -> None:
    """The request body is stored as the text ``json.loads`` reads from it (UTF-8, or UTF-16/32 as its
    first bytes tell), so a secret in a UTF-16 body is found like any other; its parse is reused for
    redaction only when it is that text's parse (nothing replaced in decoding)."""
    body = {"model": "m1", "messages": [{"role": "user", "content": f"use {SECRET}"}]}
    plain = replace(CALL, request_body=json.dumps(body).encode(), streamed=False, injection=None,
                    engine_body=None, response_body=b'{"id": "c", "choices": []}')
    text = json.dumps(body)
    for data in (text.encode(), b"\xef\xbb\xbf" + text.encode(), text.encode("utf-16"),
                 text.encode("utf-16-le"), text.encode("utf-16-be"), text.encode("utf-32")):
        _, record = build_record(replace(plain, request_body=data), "proxy-a")
        assert SECRET not in record["request_body"] and SECRET not in record["messages_json"], data[:4]
        assert json.loads(record["request_body"])["model"] == record["model"] == "m1"
        codec_for().encode("raw_llm_call", record)
    # A lone surrogate, escaped (JavaScript writes "\udXXX" for text cut inside a pair) or as bytes
    # json.loads reads but UTF-8 does not: the call is recorded, the surrogate replaced, no secret kept.
    escaped = json.dumps({**body, "messages": [{"role": "user", "content": f"cut \ud83d use {SECRET}"}]})
    assert "\\ud83d" in escaped and json.loads(escaped)["model"] == "m1"
    raw = text.replace("use", "use \udfff").encode("utf-8", "surrogatepass")
    for data in (escaped.encode(), raw, escaped.encode("utf-16"), text.replace("use", "use \udfff").encode(
            "utf-16-le", "surrogatepass")):
        _, record = build_record(replace(plain, request_body=data), "proxy-a")
        assert SECRET not in record["request_body"] and SECRET not in record["messages_json"]
        assert "\ufffd" in record["messages_json"] and record["model"] == "m1"
        codec_for().encode("raw_llm_call", record)
    # The same in the engine's reply, plain and streamed (an escape, as a JavaScript server writes it).
    cut = '{"id": "c", "model": "m", "choices": [{"index": 0, "finish_reason": "stop", '
    replies = {False: (cut + '"message": {"role": "assistant", "content": "ok \\ud83d"}}]}').encode(),
               True: _sse(json.loads(cut + '"delta": {"content": "ok \\ud83d"}}]}'))}
    for streamed, reply in replies.items():
        _, record = build_record(replace(plain, streamed=streamed, response_body=reply), "proxy-a")
        assert record["choices"][0]["text"] == "ok \ufffd" and record["model"] == "m"
        codec_for().encode("raw_llm_call", record)
    not_json = b'{"model": "m", "note": "\xff"'
    _, record = build_record(replace(plain, request_body=not_json), "proxy-a")
    assert record["request_body"] == not_json.decode("utf-8", "replace")


def _chat_call(flow_id: str, messages: list[dict], reply: dict,
               request_body: bytes | None = None) -> CapturedCall:
    response = {"id": f"c-{flow_id}", "model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 2},
                "choices": [{"index": 0, "finish_reason": "tool_calls", "message": reply}]}
    body = json.dumps({"model": "m", "messages": messages}).encode() if request_body is None else request_body
    return replace(CALL, flow_id=flow_id, streamed=False, request_body=body, engine_body=None, injection=None,
                   response_headers=(("content-type", "application/json"),),
                   response_body=json.dumps(response).encode())


def test_a_tool_call_with_arguments_of_any_depth_lands_as_a_flagged_step() -> None:
    """50,000-deep arguments were answered 200, then dead-lettered by the streams (RecursionError): the
    record keeps them cut past the limit and says so, the step and its continuation land and link."""
    deep = "[" * 50_000 + "]" * 50_000
    reply = {"role": "assistant", "content": None,
             "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": deep}}]}
    first = _chat_call("deep-1", MESSAGES, reply)
    echoed = [*MESSAGES, reply, {"role": "tool", "tool_call_id": "t1", "content": "done"}]
    second = _chat_call("deep-2", echoed, {"role": "assistant", "content": "ok"})
    harness = Harness(codec_for())
    for call in (first, second):
        key, record = build_record(call, "p")
        assert DEEP_ARGUMENTS_NOTE in record["capture_notes"]
        for field in ("messages_json", *(c[name] for c in record["choices"]
                                         for name in ("tool_calls_json", "reply_messages_json"))):
            assert deep not in field and not too_deep(field)
        harness.llm(codec_for().decode(codec_for().encode("raw_llm_call", record))[1], key)
        harness.checkpoint()
    steps = sorted(harness.steps.values(), key=lambda s: s["step_index"])
    assert len(steps) == 2 and steps[1]["parent_step_id"] == steps[0]["step_id"]
    (call,) = json.loads(steps[0]["tool_calls_json"])
    assert call["function"]["arguments"] == deep[:MAX_JSON_DEPTH] + ARGUMENTS_CUT
    assert not any(p.topic for p in harness.published if "dead" in p.topic)


def test_a_body_nested_past_the_limit_is_noted_and_not_kept() -> None:
    """Such a body cannot be read field by field, so neither can its secret-named fields be found."""
    deep = b'{"messages": [{"role": "user", "content": "hi", "password": "S3cret"}], "x": ' + \
        b"[" * 300 + b"]" * 300 + b"}"
    _, record = build_record(_chat_call("deep-body", MESSAGES, {"role": "assistant", "content": "ok"}, deep),
                             "p")
    assert "request body nests deeper than 200 levels: not read" in record["capture_notes"]
    assert record["request_body"] == TOO_DEEP and TOO_DEEP_NOTE in record["capture_notes"]
    assert b"S3cret" not in codec_for().encode("raw_llm_call", record)
