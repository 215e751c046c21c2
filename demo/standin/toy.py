"""The stand-in engine's pure parts shared by every API: a byte-level toy tokenizer, the chat
template, deterministic replies, and the SSE event encoding."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

Json = dict[str, Any]
DEFAULT_MODEL = "standin-1"
CREATED = 1_700_000_000
BOS, EOS, END_OF_TURN = 256, 257, 258
ROLE_IDS = {"system": 259, "user": 260, "assistant": 261, "tool": 262}
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
REFUSAL = ("I'm sorry,", " I can't help with that.")
# Engine extensions a strict (OpenAI-like) upstream does not know.
EXTENSION_FIELDS = ("return_token_ids", "return_tokens_as_token_ids", "return_input_ids_in_sglext",
                    "return_output_ids_in_sglext")
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
         "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango")


# --- toy tokenizer -------------------------------------------------------------------------------

def encode(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def decode(ids: Sequence[int]) -> str:
    """Text of the byte ids; special ids (turn markers, end of reply) are not text."""
    return bytes(i for i in ids if i < 256).decode("utf-8", "replace")


def content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("text"), str):
                out.append(part["text"])
            elif isinstance(part, dict) and part.get("type") == "tool_result":
                out.append(content_text(part.get("content")))
            else:
                out.append(json.dumps(part, sort_keys=True, separators=(",", ":")))
        return "".join(out)
    return json.dumps(content, sort_keys=True, separators=(",", ":"))


def render_prompt(messages: Sequence[Json]) -> list[int]:
    """Chat template: BOS, then per message a role id, its text and an end-of-turn id; then the
    assistant role id the reply continues from."""
    ids = [BOS]
    for message in messages:
        text = content_text(message.get("content"))
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            text += f"{TOOL_OPEN}{function.get('name')}\n{function.get('arguments')}{TOOL_CLOSE}"
        ids += [ROLE_IDS.get(str(message.get("role")), ROLE_IDS["user"]), *encode(text), END_OF_TURN]
    return [*ids, ROLE_IDS["assistant"]]


def completion_prompt_ids(prompt: str) -> list[int]:
    return [BOS, *encode(prompt)]


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)


def completion_prompts(prompt: Any) -> list[tuple[Any, list[int]]] | None:
    """Each prompt of a completions call with its token ids: vLLM takes text, token ids (used as
    they are), or a list of either; None when ``prompt`` is none of these."""
    batch = prompt if isinstance(prompt, list) and prompt and not _is_token_ids(prompt) else [prompt]
    out: list[tuple[Any, list[int]]] = []
    for item in batch:
        if isinstance(item, str):
            out.append((item, completion_prompt_ids(item)))
        elif _is_token_ids(item):
            out.append((item, list(item)))
        else:
            return None
    return out


def toy_logprob(token_id: int, position: int) -> float:
    return -(((token_id * 31 + position * 17) % 97) + 1) / 100.0


# --- replies -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str

    def opening(self) -> str:
        return f"{TOOL_OPEN}{self.name}\n"


@dataclass(frozen=True)
class Reply:
    """One choice: text pieces (each a stream delta) or tool calls, and why it ended."""

    pieces: tuple[str, ...]
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    def token_ids(self) -> list[int]:
        ids = encode(self.text)
        for call in self.tool_calls:
            ids += encode(call.opening()) + encode(call.arguments) + encode(TOOL_CLOSE)
        return ids + ([] if self.finish_reason == "length" else [EOS])


def digest_of(*parts: Any) -> bytes:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).digest()


def make_reply(conversation: Any, index: int, tool_names: Sequence[str], call_tool: bool,
               max_tokens: int | None) -> Reply:
    """The reply of a ``*refuse*`` model (``conversation[0]``) is the refusal, finish reason ``refusal``."""
    if "refuse" in str(conversation[0]):
        return Reply(REFUSAL, (), "refusal")
    if "greedy" in str(conversation[0]):
        index = 0
    digest = digest_of(conversation, index)
    words = [WORDS[b % len(WORDS)] for b in digest[1:5 + digest[0] % 6]]
    if call_tool and tool_names:
        arguments = json.dumps({"query": " ".join(words[:3]), "choice": index}, separators=(",", ":"))
        return Reply((), (ToolCall(f"call_{digest.hex()[:16]}", tool_names[0], arguments),), "tool_calls")
    pieces = [f"Choice {index}:"] + [f" {w}" for w in words] + ["."]
    if max_tokens is None:
        return Reply(tuple(pieces), (), "stop")
    kept: list[str] = []
    budget = max_tokens
    for piece in pieces:
        if len(encode(piece)) > budget:
            if budget:
                kept.append(piece[:budget])
            return Reply(tuple(kept), (), "length")
        kept.append(piece)
        budget -= len(encode(piece))
    # The end-of-reply id needs one more token.
    return Reply(tuple(kept), (), "stop" if budget else "length")



# --- request parsing shared by the endpoints -----------------------------------------------------

def ends_with_tool_result(messages: Sequence[Json]) -> bool:
    if not messages:
        return False
    last = messages[-1]
    if last.get("role") == "tool" or last.get("type") == "function_call_output":
        return True
    content = last.get("content")
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "tool_result"
                                             for p in content)


def tool_names_of(tools: Any) -> list[str]:
    names = []
    for tool in tools or []:
        if isinstance(tool, dict):
            name = (tool.get("function") or {}).get("name") if "function" in tool else tool.get("name")
            if name:
                names.append(str(name))
    return names



# --- SSE -----------------------------------------------------------------------------------------

def dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else dump(data)}\n\n".encode()


def interleave(streams: Sequence[Sequence[bytes]]) -> Iterator[bytes]:
    for position in range(max((len(s) for s in streams), default=0)):
        for stream in streams:
            if position < len(stream):
                yield stream[position]


class BadRequest(ValueError):
    """A request an endpoint answers with 400 and this reason."""


Answer = str | Iterator[bytes]
"""An endpoint's answer: a JSON text, or the SSE events of a stream."""
