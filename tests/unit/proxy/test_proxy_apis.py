"""Per-API parsers: plain bodies and SSE streams reassemble into the same reply, ids and usage."""

from __future__ import annotations

import json
from array import array
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clawr1.proxy.apis import (
    anthropic_messages,
    detect_api,
    openai_chat,
    openai_completions,
    openai_responses,
)
from clawr1.proxy.apis.base import token_list
from clawr1.proxy.sse import SseEvent, parse_stream


def sse(*chunks: Any, event: str | None = None) -> list[SseEvent]:
    raw = b"".join(
        (f"event: {event or c.get('type')}\n" if event is not None or "type" in c else "").encode()
        + f"data: {json.dumps(c)}\n\n".encode()
        for c in chunks
    )
    return parse_stream(raw + b"data: [DONE]\n\n")


@pytest.mark.parametrize(
    ("method", "path", "name"),
    [
        ("POST", "/v1/chat/completions", "openai.chat"),
        ("POST", "/openai/v1/chat/completions?api-version=1", "openai.chat"),
        ("POST", "/v1/completions", "openai.completions"),
        ("POST", "/v1/responses", "openai.responses"),
        ("POST", "/v1/messages", "anthropic.messages"),
        ("GET", "/v1/chat/completions", None),
        ("POST", "/v1/messages/count_tokens", None),
        ("POST", "/v1/embeddings", None),
    ],
)
def test_only_llm_calls_are_recognised(method: str, path: str, name: str | None) -> None:
    api = detect_api(method, path)
    assert (api.name if api else None) == name


def test_chat_plain_with_vllm_ids_and_tool_calls() -> None:
    body = {
        "id": "chatcmpl-1",
        "model": "m",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi"},
                "finish_reason": "stop",
                "token_ids": [7, 8],
                "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.25}]},
            },
            {
                "index": 1,
                "message": {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                    ],
                },
                "finish_reason": "tool_calls",
                "response_token_ids": [9],
            },
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 3},
    }
    out = openai_chat.assemble(body)
    assert (out.model, out.response_id, out.prompt_token_ids) == ("m", "chatcmpl-1", [1, 2, 3])
    assert (out.prompt_tokens, out.completion_tokens) == (3, 3)
    first, second = out.choices
    assert (first.text, first.token_ids, first.logprobs) == ("hi", [7, 8], [-0.5, -0.25])
    assert second.tool_calls == [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]
    assert second.token_ids == [9] and second.logprobs is None
    assert second.reply_messages == [body["choices"][1]["message"]]


def test_chat_stream_interleaved_choices_tool_deltas_and_ids() -> None:
    events = sse(
        {
            "id": "c",
            "model": "m",
            "prompt_token_ids": [1, 2],
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}],
        },
        {
            "id": "c",
            "model": "m",
            "prompt_token_ids": [1, 2],
            "choices": [{"index": 1, "delta": {"role": "assistant", "content": ""}}],
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "Hel"},
                    "token_ids": [10],
                    "logprobs": {"content": [{"logprob": -1.0}]},
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 1,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "look", "arguments": ""},
                            }
                        ]
                    },
                    "token_ids": [20],
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"content": "lo"},
                    "token_ids": [11],
                    "logprobs": {"content": [{"logprob": -2.0}]},
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 1,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": '{"q"'}}]},
                    "token_ids": [21],
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 1,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": ":1}"}}]},
                    "token_ids": [22],
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {},
                    "finish_reason": "stop",
                    "token_ids": [99],
                    "logprobs": {"content": [{"logprob": -3.0}]},
                }
            ]
        },
        {"choices": [{"index": 1, "delta": {}, "finish_reason": "tool_calls", "token_ids": [99]}]},
        {"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 7}},
    )
    out = openai_chat.assemble_stream(events)
    assert out.prompt_token_ids == [1, 2] and out.completion_tokens == 7 and out.response_id == "c"
    text, tool = out.choices
    assert (text.text, text.token_ids, text.logprobs, text.finish_reason) == (
        "Hello",
        [10, 11, 99],
        [-1.0, -2.0, -3.0],
        "stop",
    )
    assert tool.tool_calls == [
        {"id": "call_1", "type": "function", "function": {"name": "look", "arguments": '{"q":1}'}}
    ]
    assert tool.token_ids == [20, 21, 22, 99] and tool.logprobs is None
    assert out.response["choices"][0]["message"] == {"role": "assistant", "content": "Hello"}
    assert out.response["usage"] == {"prompt_tokens": 2, "completion_tokens": 7}


def test_chat_stream_error_chunk_and_sglang_ids() -> None:
    out = openai_chat.assemble_stream(
        sse(
            {"choices": [{"index": 0, "delta": {"content": "a"}}]},
            {"sglext": {"input_ids": [5], "output_ids": [6, 7]}, "choices": []},
            {"error": {"message": "engine overloaded"}},
        )
    )
    assert out.error == "engine overloaded"
    assert out.prompt_token_ids == [5] and out.choices[0].token_ids == [6, 7]


def test_completions_plain_and_stream_agree() -> None:
    plain = openai_completions.assemble(
        {
            "id": "x",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "text": "ab",
                    "finish_reason": "stop",
                    "prompt_token_ids": [1],
                    "token_ids": [2, 3],
                    "logprobs": {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2]},
                }
            ],
        }
    )
    streamed = openai_completions.assemble_stream(
        sse(
            {
                "id": "x",
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "text": "a",
                        "prompt_token_ids": [1],
                        "token_ids": [2],
                        "logprobs": {"tokens": ["a"], "token_logprobs": [-0.1]},
                    }
                ],
            },
            {
                "id": "x",
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "text": "b",
                        "token_ids": [3],
                        "finish_reason": "stop",
                        "logprobs": {"tokens": ["b"], "token_logprobs": [-0.2]},
                    }
                ],
            },
        )
    )
    for out in (plain, streamed):
        choice = out.choices[0]
        assert (choice.text, choice.token_ids, choice.logprobs, choice.finish_reason) == (
            "ab",
            [2, 3],
            [-0.1, -0.2],
            "stop",
        )
        assert out.prompt_token_ids == [1]
    assert openai_completions.request_messages({"prompt": "hi"}) == [{"role": "user", "content": "hi"}]


RESPONSE = {
    "id": "resp_1",
    "model": "m",
    "status": "completed",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "message",
            "id": "msg_1",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hi"}, {"type": "output_text", "text": "!"}],
        },
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "f", "arguments": "{}"},
    ],
    "usage": {"input_tokens": 4, "output_tokens": 2},
}


def test_responses_plain_reply_normalizes_like_its_echo() -> None:
    out = openai_responses.assemble(RESPONSE)
    choice = out.choices[0]
    assert (choice.text, choice.finish_reason, out.prompt_tokens, out.completion_tokens) == (
        "Hi!",
        "completed",
        4,
        2,
    )
    assert choice.tool_calls == [
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    ]
    echoed = openai_responses.request_messages(
        {
            "instructions": "sys",
            "input": [
                {"role": "user", "content": "q"},
                *RESPONSE["output"],
                {"type": "function_call_output", "call_id": "call_1", "output": "42"},
            ],
        }
    )
    assert echoed[0] == {"role": "system", "content": "sys"}
    assert echoed[2:5] == choice.reply_messages
    assert echoed[5] == {"role": "tool", "tool_call_id": "call_1", "content": "42"}


def test_responses_stream_uses_the_final_event_or_rebuilds_a_cut_stream() -> None:
    complete = openai_responses.assemble_stream(
        sse(
            {"type": "response.created", "response": {"id": "resp_1"}},
            {"type": "response.completed", "response": RESPONSE},
        )
    )
    assert complete.choices[0].text == "Hi!"
    cut = openai_responses.assemble_stream(
        sse(
            {"type": "response.created", "response": {"id": "resp_2", "model": "m"}},
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {"type": "message", "role": "assistant", "content": []},
            },
            {"type": "response.output_text.delta", "output_index": 0, "delta": "Hal"},
            {"type": "response.output_text.delta", "output_index": 0, "delta": "f"},
            {"type": "error", "message": "upstream went away"},
        )
    )
    assert (cut.choices[0].text, cut.response_id, cut.choices[0].finish_reason) == (
        "Half",
        "resp_2",
        "incomplete",
    )
    assert cut.error == "upstream went away"


def test_anthropic_plain_and_stream_agree() -> None:
    message = {
        "id": "msg_1",
        "model": "claude",
        "role": "assistant",
        "stop_reason": "tool_use",
        "content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "look", "input": {"q": "x"}},
        ],
        "usage": {"input_tokens": 5, "cache_read_input_tokens": 10, "output_tokens": 3},
    }
    plain = anthropic_messages.assemble(message)
    streamed = anthropic_messages.assemble_stream(
        sse(
            {
                "type": "message_start",
                "message": {
                    **message,
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": 5, "cache_read_input_tokens": 10},
                },
            },
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
            {"type": "ping"},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Let me "}},
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "look."}},
            {"type": "content_block_stop", "index": 0},
            {
                "type": "content_block_start",
                "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "look", "input": {}},
            },
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": '{"q"'},
            },
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": ': "x"}'},
            },
            {"type": "content_block_stop", "index": 1},
            {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 3}},
            {"type": "message_stop"},
        )
    )
    for out in (plain, streamed):
        choice = out.choices[0]
        assert (choice.text, choice.finish_reason, out.prompt_tokens, out.completion_tokens) == (
            "Let me look.",
            "tool_use",
            15,
            3,
        )
        assert choice.tool_calls == [
            {"id": "toolu_1", "type": "function", "function": {"name": "look", "arguments": '{"q": "x"}'}}
        ]
        assert choice.reply_messages == [{"role": "assistant", "content": message["content"]}]
    assert anthropic_messages.request_messages(
        {"system": "s", "messages": [{"role": "user", "content": "u"}]}
    ) == [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


def test_chat_refusal_is_the_text_plain_and_streamed() -> None:
    plain = openai_chat.assemble({"choices": [{"index": 0, "finish_reason": "stop", "message": {
        "role": "assistant", "content": None, "refusal": "I can't."}}]})
    streamed = openai_chat.assemble_stream(sse(
        {"choices": [{"index": 0, "delta": {"role": "assistant", "refusal": None}}]},
        {"choices": [{"index": 0, "delta": {"refusal": "I "}}]},
        {"choices": [{"index": 0, "delta": {"refusal": "can't."}, "finish_reason": "stop"}]},
    ))
    for out in (plain, streamed):
        (choice,) = out.choices
        assert (choice.text, choice.finish_reason) == ("I can't.", "refusal")
    assert streamed.response["choices"][0]["message"]["refusal"] == "I can't."
    assert streamed.response["choices"][0]["finish_reason"] == "stop"  # what the agent saw
    assert streamed.truncated is None


def test_responses_and_anthropic_refusals() -> None:
    responses = openai_responses.assemble({**RESPONSE, "output": [{"type": "message", "role": "assistant",
                                                                   "content": [{"type": "refusal",
                                                                                "refusal": "No."}]}]})
    assert (responses.choices[0].text, responses.choices[0].finish_reason) == ("No.", "refusal")
    claude = anthropic_messages.assemble({"content": [{"type": "text", "text": "I won't"}],
                                          "stop_reason": "refusal"})
    assert (claude.choices[0].text, claude.choices[0].finish_reason) == ("I won't", "refusal")


def test_sglang_ids_per_choice_plain_and_streamed() -> None:
    plain = openai_chat.assemble({"sglext": {"input_ids": [1, 2]}, "choices": [
        {"index": 0, "message": {"content": "a"}, "sglext": {"output_ids": [3]}},
        {"index": 1, "message": {"content": "b"}, "meta_info": {"output_ids": [4]}},
    ]})
    streamed = openai_chat.assemble_stream(sse(
        {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}]},
        {"choices": [{"index": 1, "delta": {"content": "b"}, "finish_reason": "stop"}]},
        {"choices": [{"index": 1, "delta": {}}], "sglext": {"input_ids": [1, 2], "output_ids": [4]}},
        {"choices": [{"index": 0, "delta": {}}], "sglext": {"input_ids": [1, 2], "output_ids": [3]}},
    ))
    for out in (plain, streamed):
        assert out.prompt_token_ids == [1, 2]
        assert [(c.index, c.token_ids) for c in out.choices] == [(0, [3]), (1, [4])]


def _cut(*chunks: Any) -> list[SseEvent]:
    return [e for e in sse(*chunks) if e.data != "[DONE]"]


def test_streams_without_their_end_say_why() -> None:
    finished = {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": "stop"}]}
    unfinished = {"choices": [{"index": 0, "delta": {"content": "a"}}]}
    assert openai_chat.assemble_stream(sse(finished)).truncated is None
    assert openai_chat.assemble_stream(_cut(finished)).truncated == "no [DONE]"
    assert openai_chat.assemble_stream(sse(unfinished)).truncated == "choice 0 has no finish_reason"
    text = {"choices": [{"index": 0, "text": "a"}]}
    assert openai_completions.assemble_stream(sse(text)).truncated == "choice 0 has no finish_reason"
    start = {"type": "message_start", "message": {"id": "msg_1"}}
    assert anthropic_messages.assemble_stream(sse(start)).truncated == "no message_stop"
    assert anthropic_messages.assemble_stream(sse(start, {"type": "message_stop"})).truncated is None
    created = {"type": "response.created", "response": {"id": "resp_1"}}
    assert openai_responses.assemble_stream(sse(created)).truncated is not None
    assert openai_responses.assemble_stream(
        sse(created, {"type": "response.completed", "response": RESPONSE})).truncated is None


def test_a_lone_surrogate_in_a_stream_reads_as_a_replacement_character() -> None:
    """JavaScript servers escape a lone surrogate (text cut inside a pair) as ``\\ud83d``; the reply a
    record keeps must encode as UTF-8, in text and in a tool's input assembled from pieces."""
    streamed = anthropic_messages.assemble_stream(sse(
        {"type": "message_start", "message": {"id": "m1", "model": "c", "usage": {"input_tokens": 1}}},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "cut \ud83d"}},
        {"type": "content_block_start", "index": 1,
         "content_block": {"type": "tool_use", "id": "t", "name": "look", "input": {}}},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "input_json_delta", "partial_json": '{"q": "\\ud83d'}},
        {"type": "content_block_delta", "index": 1,
         "delta": {"type": "input_json_delta", "partial_json": '"}'}},
        {"type": "message_stop"},
    ))
    (choice,) = streamed.choices
    assert choice.text == "cut \ufffd"
    assert json.loads(choice.tool_calls[0]["function"]["arguments"]) == {"q": "\ufffd"}
    json.dumps(streamed.response, ensure_ascii=False).encode()  # would raise on a lone surrogate


def _array_ids(value: Any) -> list[int]:
    """What ``token_list`` gave when it read the list through ``array`` alone."""
    try:
        return array("i", value).tolist()
    except (TypeError, OverflowError):
        return []


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(-2**31, 2**31 - 1), st.integers(), st.booleans(), st.floats(),
                          st.none(), st.text(max_size=2)), max_size=8)
       | st.lists(st.integers(0, 2**31 - 1), min_size=200, max_size=260))
def test_token_list_reads_what_array_reads(value: list[Any]) -> None:
    ids = token_list(value)
    assert ids == _array_ids(value)
    assert all(type(i) is int for i in ids)  # noqa: E721 - a bool sent as an id is read as the int it is
    assert token_list(tuple(value)) == token_list("x") == []
