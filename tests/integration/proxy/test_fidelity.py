"""Capture fidelity with the official SDKs: token ids never break an agent, SGLang's ids are read,
refusals and cut streams are recorded as such, and calls carry their client connection."""

from __future__ import annotations

import json
import uuid

import anthropic
import httpx
import openai

from clawr1.demo.standin.toy import DEFAULT_MODEL, REFUSAL, make_reply, render_prompt
from clawr1.proxy.token_ids import SGLEXT_HEADERS
from tests.support.proxy import EmbeddedProxy, Standin, TopicReader, marked

SECRET = "sk-proj-fidelity-secret-31c9"


def messages_for(marker: str) -> list[dict]:
    return [{"role": "user", "content": f"Task {marker}"}]


def via_explicit_proxy(proxy: EmbeddedProxy, upstream: Standin) -> openai.OpenAI:
    client = httpx.Client(proxy=proxy.explicit_url, trust_env=False)
    return openai.OpenAI(base_url=f"{upstream.url}/v1", api_key=SECRET, http_client=client)


def received_bodies(upstream: Standin, marker: str) -> list[dict]:
    return [json.loads(r.body) for r in upstream.engine.received if marker.encode() in r.body]


def test_upstream_refusing_injected_fields_is_retried_once_then_remembered(
    refusing_standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    first, second = uuid.uuid4().hex, uuid.uuid4().hex
    direct = openai.OpenAI(base_url=f"{refusing_standin.url}/v1", api_key=SECRET)
    proxied = via_explicit_proxy(proxy, refusing_standin)
    streamed = {"model": "strict-1", "messages": messages_for(first), "stream": True}
    assert [c.model_dump() for c in proxied.chat.completions.create(**streamed)] == [
        c.model_dump() for c in direct.chat.completions.create(**streamed)
    ]
    # The proxy asked, got the 400, asked again without its fields; the direct call asked once.
    asked, retried, _direct = received_bodies(refusing_standin, first)
    assert asked["return_token_ids"] is True and "return_token_ids" not in retried
    assert retried == streamed

    plain = {"model": "strict-1", "messages": messages_for(second)}
    assert proxied.chat.completions.create(**plain).model_dump() == \
        direct.chat.completions.create(**plain).model_dump()
    through, _direct = received_bodies(refusing_standin, second)
    assert through == plain  # remembered: no injection, no second try
    sent_headers = [r.headers for r in refusing_standin.engine.received if second.encode() in r.body][0]
    assert not any(name in sent_headers for name in SGLEXT_HEADERS)

    (refused,) = events.wait_for(marked(first))
    (remembered,) = events.wait_for(marked(second))
    address = refusing_standin.url.split("://", 1)[1]
    assert refused.record["token_source"] == "none" and refused.record["error"] is None
    assert refused.record["response_status"] == 200 and refused.record["streamed"]
    assert refused.record["choices"][0]["text"] == make_reply(["strict-1", messages_for(first)], 0, (),
                                                              True, None).text
    (note,) = refused.record["capture_notes"]
    assert note.startswith(f"token ids not available: {address} refused the injected field "
                           "'return_token_ids' (HTTP 400); retried without injected fields")
    assert remembered.record["token_source"] == "none"
    assert remembered.record["capture_notes"] == [
        f"token ids not requested: {address} refused injected fields earlier"
    ]


def test_hosts_not_listed_get_no_injection(
    unlisted_standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    request = {"model": DEFAULT_MODEL, "messages": messages_for(marker)}
    via_explicit_proxy(proxy, unlisted_standin).chat.completions.create(**request)
    (received,) = [r for r in unlisted_standin.engine.received if marker.encode() in r.body]
    assert json.loads(received.body) == request
    assert not any(name in received.headers for name in SGLEXT_HEADERS)
    (event,) = events.wait_for(marked(marker))
    address = unlisted_standin.url.split("://", 1)[1]
    assert event.record["token_source"] == "none" and event.record["prompt_token_ids"] == []
    assert event.record["capture_notes"] == [
        f"token ids not requested: {address} is not in CLAWR1_TOKEN_ID_HOSTS"
    ]


def test_sglang_ids_are_asked_for_read_per_choice_and_hidden_from_the_agent(
    standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    messages = messages_for(marker)
    direct = openai.OpenAI(base_url=f"{standin.url}/v1", api_key=SECRET)
    proxied = openai.OpenAI(base_url=f"{proxy.reverse_url}/v1", api_key=SECRET)
    request = {"model": "sglang-1", "messages": messages, "n": 2}
    assert proxied.chat.completions.create(**request).model_dump() == \
        direct.chat.completions.create(**request).model_dump()
    assert [c.model_dump() for c in proxied.chat.completions.create(**request, stream=True)] == [
        c.model_dump() for c in direct.chat.completions.create(**request, stream=True)
    ]
    asked = [r.headers for r in standin.engine.received if marker.encode() in r.body]
    assert sum(all(h.get(name) == "1" for name in SGLEXT_HEADERS) for h in asked) == 2

    found = events.wait_for(marked(marker), count=2)
    assert sorted(e.record["streamed"] for e in found) == [False, True]
    for event in found:
        record = event.record
        assert record["token_source"] == "engine" and record["prompt_token_ids"] == render_prompt(messages)
        assert "sglext" not in record["response_body"] and "sglext" not in record["assembled_response"]
        for choice in record["choices"]:
            reply = make_reply(["sglang-1", messages], choice["index"], (), True, None)
            assert (choice["text"], choice["token_ids"]) == (reply.text, reply.token_ids())
        assert record["capture_notes"] == []


def test_refusals_are_the_reply_text_with_a_refusal_finish(
    standin: Standin, proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    proxied = openai.OpenAI(base_url=f"{proxy.reverse_url}/v1", api_key=SECRET)
    request = {"model": "refuse-1", "messages": messages_for(marker)}
    message = proxied.chat.completions.create(**request).choices[0].message
    assert (message.content, message.refusal) == (None, "".join(REFUSAL))
    deltas = [c.choices[0].delta.refusal for c in proxied.chat.completions.create(**request, stream=True)
              if c.choices]
    assert "".join(d for d in deltas if d) == "".join(REFUSAL)
    claude = anthropic.Anthropic(base_url=proxy.reverse_url, api_key=SECRET)
    claude_request = {"model": "claude-refuse", "max_tokens": 100, "messages": messages_for(marker)}
    assert claude.messages.create(**claude_request).stop_reason == "refusal"
    with claude.messages.stream(**claude_request) as stream:
        assert stream.get_final_message().stop_reason == "refusal"

    found = events.wait_for(marked(marker), count=4)
    assert sorted((e.record["api"], e.record["streamed"]) for e in found) == [
        ("anthropic.messages", False), ("anthropic.messages", True),
        ("openai.chat", False), ("openai.chat", True),
    ]
    for event in found:
        (choice,) = event.record["choices"]
        assert (choice["text"], choice["finish_reason"]) == ("".join(REFUSAL), "refusal")
        assert event.record["error"] is None


def test_streams_cut_without_their_end_are_noted_truncated(
    proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    messages = messages_for(marker)
    proxied = openai.OpenAI(base_url=f"{proxy.reverse_url}/v1", api_key=SECRET)
    request = {"model": DEFAULT_MODEL, "messages": messages, "stream": True}
    cut = {"x-standin-end-after": "3"}
    assert len(list(proxied.chat.completions.create(**request, extra_headers=cut))) == 3
    # Every chunk but [DONE]: the role chunk, one per piece, the finish chunk.
    reply = make_reply([DEFAULT_MODEL, messages], 0, (), True, None)
    until_done = str(len(reply.pieces) + 2)
    assert list(proxied.chat.completions.create(**request, extra_headers={"x-standin-end-after": until_done}))
    claude = anthropic.Anthropic(base_url=proxy.reverse_url, api_key=SECRET)
    with claude.messages.create(model="claude-standin", max_tokens=100, messages=messages, stream=True,
                                extra_headers={"x-standin-end-after": "4"}) as stream:
        # The fourth event was a ping, which the SDK does not surface.
        assert [e.type for e in stream] == ["message_start", "content_block_start", "content_block_delta"]

    found = events.wait_for(marked(marker), count=3)
    notes = sorted(n for e in found for n in e.record["capture_notes"])
    assert notes == [
        "stream truncated: choice 0 has no finish_reason",
        "stream truncated: no [DONE]",
        "stream truncated: no message_stop",
    ]
    assert all(e.record["error"] is None and e.record["response_status"] == 200 for e in found)


def test_client_connection_is_one_per_keep_alive_connection(
    proxy: EmbeddedProxy, events: TopicReader
) -> None:
    marker = uuid.uuid4().hex
    request = {"model": DEFAULT_MODEL, "messages": messages_for(marker)}
    first = openai.OpenAI(base_url=f"{proxy.reverse_url}/v1", api_key=SECRET)
    second = openai.OpenAI(base_url=f"{proxy.reverse_url}/v1", api_key=SECRET)
    for client in (first, first, second):
        client.chat.completions.create(**request)
    found = sorted(events.wait_for(marked(marker), count=3), key=lambda e: e.record["request_started_ms"])
    connections = [e.record["client_connection"] for e in found]
    assert connections[0] and connections[0] == connections[1] != connections[2]
