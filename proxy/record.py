"""From a captured call (raw bytes and timings) to a ``raw_llm_call`` record and its Kafka key, and
the record as the spool keeps it and Kafka gets it (envelopes).

Runs on the emitter's thread, never on the proxy's event loop: the hooks only snapshot bytes, so
parsing, reassembly and encoding add nothing to the agent's latency.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from clawr1.core.conversation import conversation_key
from clawr1.core.json_depth import MAX_JSON_DEPTH, too_deep
from clawr1.core.redaction import redact_headers, redact_id, redact_record, redact_url
from clawr1.core.routing import routable_id
from clawr1.core.topics import RAW_LLM
from clawr1.proxy.apis import BY_NAME, Assembled
from clawr1.proxy.apis.base import error_text, whole
from clawr1.proxy.apis.openai_responses import NAME as RESPONSES_API
from clawr1.proxy.chains import ResponseChains
from clawr1.proxy.hints import Hints
from clawr1.proxy.mitm_compat import decode_content
from clawr1.proxy.sse import parse_stream
from clawr1.proxy.token_ids import Injection, dump, load, strip_json
from clawr1.schemas.batch import batch_name
from clawr1.schemas.codec import AvroCodec, pack_record

Headers = tuple[tuple[str, str], ...]
# Opens the note of a stream that ended without its finish (the steps' ``truncated`` status reads it).
TRUNCATED_NOTE = "stream truncated"
# mitmproxy's error text when the agent's side of the connection closes first.
CLIENT_DISCONNECTED = "Client disconnected."
# Tool-call arguments nested past the one limit are kept cut, so that the step lands (_cut).
ARGUMENTS_CUT = f"\u2026 [cut: nested deeper than {MAX_JSON_DEPTH} levels]"
DEEP_ARGUMENTS_NOTE = (f"tool call arguments nested deeper than {MAX_JSON_DEPTH} levels: kept as their first "
                       f"{MAX_JSON_DEPTH} characters")


@dataclass(frozen=True)
class CapturedCall:
    """Everything the hooks saw of one recognised call, as immutable snapshots."""

    flow_id: str
    api: str
    method: str
    url: str
    upstream: str
    request_headers: Headers
    request_body: bytes
    hints: Hints
    streamed: bool
    status: int | None
    response_headers: Headers
    # As the agent received it, still content-encoded.
    response_body: bytes
    response_encoding: str
    # As the engine sent it (decoded), only when the proxy rewrote the agent's copy.
    engine_body: bytes | None
    injection: Injection | None
    started: float
    first_byte: float | None
    finished: float | None
    captured_at: float
    error: str | None = None
    # mitmproxy's id of the agent's connection: calls on one keep-alive connection share it.
    client_connection: str = ""
    # What the hooks noticed (token-id provenance, a refused injection and its retry).
    notes: tuple[str, ...] = ()
    # The engine that served the call (the reverse port's router) and the policy version it serves.
    engine: str | None = None
    engine_version: int | None = None


def event_id(proxy_instance: str, flow_id: str, home: str) -> str:
    """Fixed when the call is captured and stored with it, so spool replays never mint a new id; routable
    (``clawr1.core.routing.routable_id``) to ``home``, the record's Kafka key, so feedback naming the
    call reaches its partition without an index entry."""
    return routable_id(home, f"{proxy_instance}\x00{flow_id}".encode())


def _ms(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * 1000)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _decoded(call: CapturedCall, notes: list[str]) -> bytes:
    if not call.response_encoding or call.response_encoding == "identity":
        return call.response_body
    try:
        return decode_content(call.response_body, call.response_encoding)
    except ValueError:
        notes.append(f"response body not decodable as {call.response_encoding}")
        return call.response_body


def _json_object(data: bytes) -> dict[str, Any] | None:
    try:
        value = whole(load(data), data)
    except ValueError:  # also JSON nested past MAX_JSON_DEPTH: never parsed
        return None
    return value if isinstance(value, dict) else None


def _unread(what: str, data: bytes) -> str:
    """The capture note for a body ``_json_object`` did not read."""
    return f"{what} nests deeper than {MAX_JSON_DEPTH} levels: not read" if too_deep(data) else \
        f"{what} is not a JSON object"


def _cut(arguments: str) -> str:
    """Tool-call arguments nested past ``MAX_JSON_DEPTH``, as the record keeps them: their first
    characters (that many cannot nest deeper) and a mark, so that no reader parses them deep."""
    return arguments[:MAX_JSON_DEPTH] + ARGUMENTS_CUT


def _bounded_call(call: Any) -> Any:
    """An OpenAI-shaped tool call with arguments nested past the limit cut; any other as it is."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        return call
    arguments = function.get("arguments")
    if not isinstance(arguments, str) or not too_deep(arguments):
        return call
    return {**call, "function": {**function, "arguments": _cut(arguments)}}


def _bounded_calls(calls: list[Any], notes: list[str]) -> list[Any]:
    """``calls`` with ``_bounded_call`` applied (the same list when none changed); noted once."""
    bounded = [_bounded_call(call) for call in calls]
    if all(new is old for new, old in zip(bounded, calls, strict=True)):
        return calls
    if DEEP_ARGUMENTS_NOTE not in notes:
        notes.append(DEEP_ARGUMENTS_NOTE)
    return bounded


def _bounded_messages(messages: list[dict[str, Any]], notes: list[str]) -> list[dict[str, Any]]:
    """``messages`` with the arguments of their tool calls bounded (``_bounded_calls``)."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if isinstance(calls, list) and (bounded := _bounded_calls(calls, notes)) is not calls:
            message = {**message, "tool_calls": bounded}
        out.append(message)
    return out


def _request_text(data: bytes) -> tuple[str, bool]:
    """The request body as the text ``json.loads`` reads from it: UTF-8 (a byte-order mark kept), or
    UTF-16 or UTF-32 as its first bytes tell. A body sent in UTF-16 is stored as the text it is, where
    a secret is found like any other (decoded as UTF-8 it read ``s\0k\0-\0...``, which no pattern
    matches). True when nothing was replaced: the value ``json.loads`` gave is then this text's value,
    and redaction need not read the text again."""
    encoding = json.detect_encoding(data)
    if encoding == "utf-8-sig":
        encoding = "utf-8"
    try:
        return data.decode(encoding), True
    except UnicodeDecodeError:
        return data.decode(encoding, "replace"), False


def _assemble(call: CapturedCall, agent_body: bytes, notes: list[str]) -> tuple[Assembled, str]:
    """The reassembled reply (from what the engine sent) and the final response as the agent saw it."""
    api = BY_NAME[call.api]
    engine_body = call.engine_body if call.engine_body is not None else agent_body
    if call.streamed:
        assembled = api.assemble_stream(parse_stream(engine_body))
        if call.injection is not None:
            strip_json(assembled.response, call.injection)  # the agent never saw what the proxy asked for
        return assembled, _text(dump(assembled.response))
    parsed = _json_object(engine_body)
    if parsed is None:
        if engine_body:
            notes.append(_unread("response body", engine_body))
        return Assembled(response={}), ""
    failed = call.status is None or call.status >= 400
    # A plain body is its own final response; one the proxy rewrote is valid JSON by construction.
    return (Assembled(response={}) if failed else api.assemble(parsed)), _text(agent_body)


def _token_notes(assembled: Assembled, injection: Injection | None) -> list[str]:
    """Engines have known token-id bugs: compare ids with usage and logprobs, and say where they disagree."""
    notes: list[str] = []
    output_ids = sum(len(c.token_ids) for c in assembled.choices)
    has_ids = bool(assembled.prompt_token_ids) or output_ids > 0
    if injection is not None and injection.token_ids and not has_ids:
        notes.append("token ids were requested from the engine but none came back")
    if assembled.prompt_token_ids and assembled.prompt_tokens is not None \
            and len(assembled.prompt_token_ids) != assembled.prompt_tokens:
        notes.append(f"prompt_token_ids has {len(assembled.prompt_token_ids)} ids, "
                     f"usage says {assembled.prompt_tokens}")
    if output_ids and assembled.completion_tokens is not None and output_ids != assembled.completion_tokens:
        notes.append(f"response token ids total {output_ids}, usage says {assembled.completion_tokens}")
    for choice in assembled.choices:
        if choice.token_ids and choice.logprobs is not None and len(choice.logprobs) != len(choice.token_ids):
            notes.append(f"choice {choice.index}: {len(choice.token_ids)} token ids "
                         f"but {len(choice.logprobs)} logprobs")
    return notes


def _call_error(call: CapturedCall, agent_body: bytes, assembled: Assembled) -> str | None:
    if call.error:
        return call.error
    if call.status is not None and call.status >= 400:
        parsed = _json_object(agent_body)
        reason = error_text(parsed) if parsed is not None else _text(agent_body[:200])
        return f"HTTP {call.status}: {reason}"
    return assembled.error


def _left_after_the_end(call: CapturedCall, assembled: Assembled) -> bool:
    """An agent that read a stream's last event may hang up before the upstream ends its body;
    mitmproxy then reports the flow as a client disconnect, yet the agent saw the whole answer."""
    return (call.streamed and call.error == CLIENT_DISCONNECTED and call.status is not None
            and call.status < 400 and assembled.error is None and assembled.truncated is None
            and bool(assembled.choices))


def _policy_version(call: CapturedCall, assembled: Assembled) -> int | None:
    """The version the engine reported in its response (SGLang's ``metadata.weight_version``, when it is
    an integer: SGLang's own default is ``"default"``), else the one it was resumed at after a weight
    update (``clawr1.proxy.engines``), else the agent's ``X-Claw-Policy-Version``."""
    metadata = assembled.response.get("metadata")
    reported = metadata.get("weight_version") if isinstance(metadata, dict) else None
    if isinstance(reported, str) and reported.isascii() and reported.isdigit():
        reported = int(reported)
    if isinstance(reported, int) and not isinstance(reported, bool) and 0 <= reported < 2**63:
        return reported
    return call.hints.policy_version if call.engine_version is None else call.engine_version


def _hint_id(value: str | None) -> str | None:
    return None if value is None else redact_id(value)


def build_record(call: CapturedCall, proxy_instance: str,
                 chains: ResponseChains | None = None) -> tuple[str, dict[str, Any]]:
    """The Kafka key (trajectory hint, else conversation root) and the record, secrets removed.
    ``chains``: Responses calls continued by ``previous_response_id`` get their full prompt."""
    notes: list[str] = list(call.notes)
    request = _json_object(call.request_body)
    request_text, text_exact = _request_text(call.request_body)
    if request is None:
        notes.append(_unread("request body", call.request_body))
    chains = chains if call.api == RESPONSES_API else None
    messages = _bounded_messages(BY_NAME[call.api].request_messages(request or {}) if chains is None
                                 else chains.prompt(request or {}, notes), notes)
    agent_body = _decoded(call, notes)
    assembled, final_response = _assemble(call, agent_body, notes)
    for choice in assembled.choices:  # the step lands with deep arguments cut, never dead-lettered
        choice.tool_calls = _bounded_calls(choice.tool_calls, notes)
        choice.reply_messages = _bounded_messages(choice.reply_messages, notes)
    if chains is not None and assembled.response_id and assembled.choices:
        chains.record(request or {}, assembled.response_id, assembled.choices[0].reply_messages)
    notes.extend(assembled.notes)
    notes.extend(_token_notes(assembled, call.injection))
    error = _call_error(call, agent_body, assembled)
    if error is not None and _left_after_the_end(call, assembled):
        notes.append(f"the client closed the connection after the complete response ({error})")
        error = None
    if call.streamed and assembled.truncated and error is None:
        notes.append(f"{TRUNCATED_NOTE}: {assembled.truncated}")
    conv_key = conversation_key(messages)
    # The Kafka key (where the call's link state lives, and what its routable event id is tagged with)
    # is the redacted trajectory hint: a secret sent as an id never becomes a key.
    hint = _hint_id(call.hints.trajectory_id)
    key = hint or conv_key
    has_ids = bool(assembled.prompt_token_ids) or any(c.token_ids for c in assembled.choices)
    record: dict[str, Any] = {
        "event_id": event_id(proxy_instance, call.flow_id, key),
        "captured_at_ms": _ms(call.captured_at),
        "proxy_instance": proxy_instance,
        "api": call.api,
        "method": call.method,
        "url": redact_url(call.url),
        "upstream": call.upstream,
        "request_headers": redact_headers(call.request_headers),
        "request_body": request_text,
        "streamed": call.streamed,
        "response_status": call.status,
        "response_headers": redact_headers(call.response_headers),
        "response_body": _text(agent_body),
        "assembled_response": final_response,
        "error": error,
        "request_started_ms": _ms(call.started),
        "first_byte_ms": _ms(call.first_byte),
        "finished_ms": _ms(call.finished),
        "model": assembled.model or (request or {}).get("model"),
        "prompt_tokens": assembled.prompt_tokens,
        "completion_tokens": assembled.completion_tokens,
        "prompt_token_ids": assembled.prompt_token_ids,
        "choices": [
            {
                "index": c.index,
                "text": c.text,
                "tool_calls_json": _text(dump(c.tool_calls)),
                "finish_reason": c.finish_reason,
                "token_ids": c.token_ids,
                "logprobs": c.logprobs,
                "reply_messages_json": _text(dump(c.reply_messages)),
            }
            for c in assembled.choices
        ],
        "token_source": "engine" if has_ids else "none",
        "trajectory_id": hint,
        "prompt_group_id": _hint_id(call.hints.prompt_group_id),
        "prompt_group_size": call.hints.prompt_group_size,
        "policy_version": _policy_version(call, assembled),
        "agent": _hint_id(call.hints.agent),
        "terminal": call.hints.terminal,
        "channel": call.hints.channel,
        "conversation_key": conv_key,
        "messages_json": _text(dump(messages)),
        "response_id": assembled.response_id,
        "capture_notes": notes,
        "client_connection": call.client_connection,
        "source_name": call.hints.source_name,
        "engine": call.engine,
    }
    # What was read as JSON already is not read again to be redacted: a request is the conversation so far.
    parsed: dict[str, dict[str, Any] | list[Any]] = {}
    if request is not None and text_exact:
        parsed["request_body"] = request
    parsed["messages_json"] = messages
    return key, redact_record(record, parsed)


def spooled(codec: AvroCodec, record: dict[str, Any]) -> bytes:
    """A record as the spool keeps it: an envelope of one (``raw_llm_call_batch``), a message readable
    alone, that ``envelope_of`` combines with others bound for its partition."""
    return codec.encode_batch(RAW_LLM.schema, [pack_record(RAW_LLM.schema, record)])


def envelope_of(codec: AvroCodec, values: list[bytes]) -> bytes:
    """One envelope of spooled values: ``spooled`` ones (joined as they are), or single records an
    earlier release spooled (decoded and encoded again)."""
    joined = codec.join_batches(RAW_LLM.schema, values)
    if joined is not None:
        return joined
    records: list[dict[str, Any]] = []
    for value in values:
        name, decoded = codec.decode(value)
        records += decoded["records"] if name == batch_name(RAW_LLM.schema) else \
            [pack_record(RAW_LLM.schema, decoded)]
    return codec.encode_batch(RAW_LLM.schema, records)
