"""Base-URL mode: official SDKs, httpx and curl get through the proxy exactly what they get directly,
and each call lands on the real Kafka topic once, with exact prompts, replies, tool calls and token ids."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import anthropic
import httpx
import openai
import pytest

from clawr1.core.conversation import conversation_key
from clawr1.demo.standin.toy import (
    DEFAULT_MODEL,
    completion_prompt_ids,
    decode,
    make_reply,
    render_prompt,
    toy_logprob,
)
from clawr1.proxy.chains import UNKNOWN_PARENT_NOTE
from tests.support.proxy import EmbeddedProxy, Standin, TopicReader, marked

SECRET = "sk-proj-test-secret-4f9d2c7e1a"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "search",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    }
]


def conversation(marker: str) -> list[dict]:
    return [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": f"Task {marker}: say hi"},
    ]


def openai_pair(standin: Standin, proxy: EmbeddedProxy) -> tuple[openai.OpenAI, openai.OpenAI]:
    return (
        openai.OpenAI(base_url=f"{standin.url}/v1", api_key=SECRET),
        openai.OpenAI(base_url=f"{proxy.reverse_url}/v1", api_key=SECRET),
    )


def test_chat_n2_equals_direct_and_records_engine_token_ids(
    standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    messages = conversation(marker)
    direct, proxied = openai_pair(standin, proxy)
    request = {"model": DEFAULT_MODEL, "messages": messages, "n": 2}
    assert (
        proxied.chat.completions.create(**request).model_dump()
        == direct.chat.completions.create(**request).model_dump()
    )
    raw_direct = httpx.post(f"{standin.url}/v1/chat/completions", json=request)
    raw_proxied = httpx.post(f"{proxy.reverse_url}/v1/chat/completions", json=request)
    assert raw_proxied.content == raw_direct.content

    sdk_event, _ = events.wait_for(marked(marker), count=2)
    record = sdk_event.record
    assert (record["api"], record["streamed"], record["token_source"]) == ("openai.chat", False, "engine")
    assert json.loads(record["request_body"]) == request  # as the agent sent it, without injected fields
    assert record["response_body"] == raw_direct.text
    assert record["prompt_token_ids"] == render_prompt(messages)
    for index, choice in enumerate(record["choices"]):
        reply = make_reply([DEFAULT_MODEL, messages], index, ["lookup"], False, None)
        ids = reply.token_ids()
        assert (choice["text"], choice["token_ids"], choice["finish_reason"]) == (reply.text, ids, "stop")
        assert decode(choice["token_ids"]) == choice["text"]
        assert choice["logprobs"] == [toy_logprob(t, k) for k, t in enumerate(ids)]
    assert record["completion_tokens"] == sum(len(c["token_ids"]) for c in record["choices"])
    assert sdk_event.key == record["conversation_key"] == conversation_key(messages)
    assert record["capture_notes"] == [] and SECRET.encode() not in sdk_event.value
    upstream = next(r for r in standin.engine.received if marker.encode() in r.body)
    assert json.loads(upstream.body)["return_token_ids"] is True


def test_streamed_tool_call_arrives_chunk_for_chunk(
    standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    messages = conversation(marker)
    direct, proxied = openai_pair(standin, proxy)
    request = {
        "model": DEFAULT_MODEL,
        "messages": messages,
        "tools": TOOLS,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    direct_chunks = [c.model_dump() for c in direct.chat.completions.create(**request)]
    assert [c.model_dump() for c in proxied.chat.completions.create(**request)] == direct_chunks

    (event,) = events.wait_for(marked(marker))
    record = event.record
    reply = make_reply([DEFAULT_MODEL, messages], 0, ["lookup"], True, None)
    (call,) = reply.tool_calls
    (choice,) = record["choices"]
    assert record["streamed"] and choice["finish_reason"] == "tool_calls"
    assert json.loads(choice["tool_calls_json"]) == [
        {"id": call.id, "type": "function", "function": {"name": "lookup", "arguments": call.arguments}}
    ]
    assert choice["token_ids"] == reply.token_ids() and record["prompt_token_ids"] == render_prompt(messages)
    assert (record["prompt_tokens"], record["completion_tokens"]) == (
        len(render_prompt(messages)),
        len(reply.token_ids()),
    )
    assert "token_ids" not in record["response_body"] and record["capture_notes"] == []


def test_stream_chunks_reach_the_agent_as_the_engine_sends_them(proxy: EmbeddedProxy) -> None:
    client = openai.OpenAI(base_url=f"{proxy.reverse_url}/v1", api_key=SECRET)
    started = time.monotonic()
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=conversation(uuid.uuid4().hex),
        stream=True,
        extra_headers={"x-standin-chunk-delay": "0.25"},
    )
    arrivals = [time.monotonic() - started for _ in stream]
    assert len(arrivals) >= 8
    assert arrivals[0] < 1.0, f"first chunk after {arrivals[0]:.2f}s"
    assert arrivals[-1] - arrivals[0] > 0.25 * (len(arrivals) - 3), arrivals


def test_completions_plain_and_streamed(standin: Standin, proxy: EmbeddedProxy, events: TopicReader) -> None:
    marker = uuid.uuid4().hex
    prompt = f"Once upon a time ({marker})"
    direct, proxied = openai_pair(standin, proxy)
    assert (
        proxied.completions.create(model=DEFAULT_MODEL, prompt=prompt, n=2).model_dump()
        == direct.completions.create(model=DEFAULT_MODEL, prompt=prompt, n=2).model_dump()
    )
    assert [
        c.model_dump() for c in proxied.completions.create(model=DEFAULT_MODEL, prompt=prompt, stream=True)
    ] == [c.model_dump() for c in direct.completions.create(model=DEFAULT_MODEL, prompt=prompt, stream=True)]

    found = events.wait_for(marked(marker), count=2)
    for event in found:
        record = event.record
        assert record["api"] == "openai.completions" and record["prompt_token_ids"] == completion_prompt_ids(
            prompt
        )
        for choice in record["choices"]:
            reply = make_reply([DEFAULT_MODEL, prompt], choice["index"], (), False, None)
            assert (choice["text"], choice["token_ids"]) == (reply.text, reply.token_ids())
            assert len(choice["logprobs"]) == len(choice["token_ids"])
    assert sorted(len(e.record["choices"]) for e in found) == [1, 2]


def test_responses_api_plain_and_streamed(
    standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    direct, proxied = openai_pair(standin, proxy)
    request = {"model": DEFAULT_MODEL, "instructions": "Be brief.", "input": f"Explain {marker}"}
    assert proxied.responses.create(**request).model_dump() == direct.responses.create(**request).model_dump()
    assert [e.model_dump() for e in proxied.responses.create(**request, stream=True)] == [
        e.model_dump() for e in direct.responses.create(**request, stream=True)
    ]

    for event in events.wait_for(marked(marker), count=2):
        record = event.record
        messages = [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"Explain {marker}"},
        ]
        reply = make_reply([DEFAULT_MODEL, messages], 0, (), True, None)
        (choice,) = record["choices"]
        assert (record["api"], record["token_source"], choice["text"]) == (
            "openai.responses",
            "none",
            reply.text,
        )
        assert record["response_id"].startswith("resp_") and record["prompt_token_ids"] == []
        assert json.loads(record["messages_json"]) == messages
        assert record["conversation_key"] == conversation_key(messages)


def test_responses_chained_by_previous_response_id_store_the_full_prompt_under_the_parents_key(
    standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    _, agent = openai_pair(standin, proxy)
    ask = {"model": DEFAULT_MODEL, "instructions": "Be brief."}  # instructions never carry over: resent
    first = agent.responses.create(**ask, input=f"Explain {marker}")
    second = agent.responses.create(**ask, input=f"More on {marker}", previous_response_id=first.id)
    third = agent.responses.create(**ask, input=f"Last on {marker}", previous_response_id=second.id,
                                   stream=True)
    last_id = next(e.response.id for e in third if e.type == "response.completed")
    agent.responses.create(model=DEFAULT_MODEL, input=f"Orphan {marker}", previous_response_id="resp_unseen")

    by_input = {json.loads(e.record["request_body"])["input"].split()[0]: e
                for e in events.wait_for(marked(marker), count=4)}
    explain = [{"role": "user", "content": f"Explain {marker}"},
               {"role": "assistant", "content": [{"type": "output_text", "text": first.output_text,
                                                  "annotations": []}]}]
    more = [{"role": "user", "content": f"More on {marker}"},
            {"role": "assistant", "content": [{"type": "output_text", "text": second.output_text,
                                               "annotations": []}]}]
    system = {"role": "system", "content": "Be brief."}
    expected = {"More": [system, *explain, {"role": "user", "content": f"More on {marker}"}],
                "Last": [system, *explain, *more, {"role": "user", "content": f"Last on {marker}"}]}
    for word, messages in expected.items():
        record, key = by_input[word].record, by_input[word].key
        assert json.loads(record["messages_json"]) == messages
        assert record["conversation_key"] == key == by_input["Explain"].key  # the parent's partition
        assert any(n.startswith("previous_response_id resp_") for n in record["capture_notes"])
    assert by_input["Last"].record["response_id"] == last_id
    orphan = by_input["Orphan"].record
    assert json.loads(orphan["messages_json"]) == [{"role": "user", "content": f"Orphan {marker}"}]
    assert any(n.startswith(f"{UNKNOWN_PARENT_NOTE}: resp_unseen") for n in orphan["capture_notes"])


def test_anthropic_messages_plain_and_streamed(
    standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    direct = anthropic.Anthropic(base_url=standin.url, api_key=SECRET)
    proxied = anthropic.Anthropic(base_url=proxy.reverse_url, api_key=SECRET)
    tools = [{"name": "lookup", "description": "search", "input_schema": {"type": "object"}}]
    request = {
        "model": "claude-standin",
        "max_tokens": 200,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": f"Find {marker}"}],
    }
    assert (
        proxied.messages.create(**request, tools=tools).model_dump()
        == direct.messages.create(**request, tools=tools).model_dump()
    )
    with proxied.messages.stream(**request) as through, direct.messages.stream(**request) as reference:
        assert [e.model_dump() for e in through] == [e.model_dump() for e in reference]

    tool_event, text_event = sorted(
        events.wait_for(marked(marker), count=2), key=lambda e: e.record["streamed"]
    )
    assert (
        tool_event.record["api"] == "anthropic.messages"
        and tool_event.record["choices"][0]["finish_reason"] == "tool_use"
    )
    (call,) = json.loads(tool_event.record["choices"][0]["tool_calls_json"])
    assert call["function"]["name"] == "lookup" and json.loads(call["function"]["arguments"])["query"]
    assert text_event.record["streamed"] and text_event.record["choices"][0]["text"].startswith("Choice 0:")
    assert all(SECRET.encode() not in e.value for e in (tool_event, text_event))


def test_curl_sees_identical_bytes(standin: Standin, proxy: EmbeddedProxy, events: TopicReader) -> None:
    marker = uuid.uuid4().hex
    for stream in (False, True):
        body = json.dumps({"model": DEFAULT_MODEL, "messages": conversation(marker), "stream": stream})

        def curl(base: str, payload: str = body) -> bytes:
            return subprocess.run(
                [
                    "curl",
                    "-sS",
                    "-N",
                    f"{base}/v1/chat/completions",
                    "-H",
                    "content-type: application/json",
                    "-H",
                    f"authorization: Bearer {SECRET}",
                    "-d",
                    payload,
                ],
                check=True,
                capture_output=True,
                timeout=30,
            ).stdout

        assert curl(proxy.reverse_url) == curl(standin.url)
    assert {e.record["streamed"] for e in events.wait_for(marked(marker), count=2)} == {False, True}


def test_hints_are_recorded_and_stripped_before_the_upstream(
    standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    _, proxied = openai_pair(standin, proxy)
    hints = {
        "X-Claw-Trajectory-Id": f"traj-{marker}",
        "X-Claw-Prompt-Group-Id": "group-7",
        "X-Claw-Prompt-Group-Size": "4",
        "X-Claw-Policy-Version": "12",
        "X-Claw-Agent": "swe-agent",
        "X-Claw-Terminal": "true",
    }
    proxied.chat.completions.create(model=DEFAULT_MODEL, messages=conversation(marker), extra_headers=hints)
    (event,) = events.wait_for(marked(marker))
    record = event.record
    assert event.key == f"traj-{marker}"
    assert (
        record["trajectory_id"],
        record["prompt_group_id"],
        record["prompt_group_size"],
        record["policy_version"],
        record["agent"],
        record["terminal"],
    ) == (f"traj-{marker}", "group-7", 4, 12, "swe-agent", True)
    upstream = next(r for r in standin.engine.received if marker.encode() in r.body)
    assert not any(name.lower().startswith("x-claw") for name in upstream.headers)

    bad = uuid.uuid4().hex
    with pytest.raises(openai.BadRequestError, match="X-Claw-Prompt-Group-Size must be an integer"):
        proxied.chat.completions.create(
            model=DEFAULT_MODEL,
            messages=conversation(bad),
            extra_headers={"X-Claw-Prompt-Group-Size": "many"},
        )
    assert not any(bad.encode() in r.body for r in standin.engine.received)


def test_secrets_are_forwarded_but_never_recorded(
    standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    secrets = {
        "authorization": f"Bearer {SECRET}",
        "x-api-key": "sk-ant-api03-hidden-1",
        "api-key": "azure-hidden-2",
        "cookie": "session=hidden-3",
        "x-goog-api-key": "AIzaSyHidden-4-abcdefghijklmnop",
    }
    response = httpx.post(
        f"{proxy.reverse_url}/v1/chat/completions?key=hidden-5&alt=json",
        headers=secrets,
        json={"model": DEFAULT_MODEL, "messages": conversation(marker)},
    )
    assert response.status_code == 200
    upstream = next(r for r in standin.engine.received if marker.encode() in r.body)
    assert (
        upstream.headers["authorization"] == f"Bearer {SECRET}"
        and upstream.headers["cookie"] == "session=hidden-3"
    )
    (event,) = events.wait_for(marked(marker))
    for secret in (SECRET, "hidden-1", "hidden-2", "hidden-3", "Hidden-4", "hidden-5"):
        assert secret.encode() not in event.value, secret
    assert event.record["url"].endswith("/v1/chat/completions?alt=json")


def test_other_paths_pass_through_unrecorded(
    standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    assert httpx.get(f"{proxy.reverse_url}/v1/models").json() == httpx.get(f"{standin.url}/v1/models").json()
    marker = uuid.uuid4().hex
    httpx.post(
        f"{proxy.reverse_url}/v1/chat/completions",
        json={"model": DEFAULT_MODEL, "messages": conversation(marker)},
    )
    events.wait_for(marked(marker))
    assert events.events(lambda r: "/v1/models" in r["url"]) == []
