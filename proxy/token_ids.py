"""Asking a vLLM/SGLang-style engine for exact token ids, and taking back out only what the proxy asked for.

With ``--capture-token-ids`` the proxy adds ``return_token_ids`` (and logprobs) to chat and completions
requests that did not ask for them, and SGLang's ``x-sglext-return-*-ids`` headers, then removes what
those produced from the reply, so the agent receives what it would have received without the proxy.
Fields the agent asked for itself are left alone. Only upstreams listed as accepting the fields get
them (``TokenIdPolicy``): others (OpenAI's API, reasoning models) answer an unknown field with a 400.

Engines differ in how they serialize fields nobody asked for: vLLM writes them as ``null`` in plain
responses and leaves them out of stream chunks. Each JSON object says which style it uses: if it
carries any other ``null`` field, the injected fields are set back to ``null``; otherwise removed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from clawr1.core.json_depth import MAX_JSON_DEPTH, JsonTooDeep, check_depth
from clawr1.proxy.apis import openai_chat, openai_completions

Json = dict[str, Any]
TOKEN_ID_APIS = frozenset({openai_chat.NAME, openai_completions.NAME})
# vLLM's names, SGLang's per-choice name for chat.
ID_FIELDS = ("prompt_token_ids", "token_ids", "response_token_ids")
COMPLETIONS_LOGPROBS = 1
# SGLang returns ``sglext.input_ids`` / ``sglext.output_ids`` when asked by header (or body flag).
SGLEXT_HEADERS = ("x-sglext-return-input-ids", "x-sglext-return-output-ids")
SGLEXT_FLAGS = ("return_input_ids_in_sglext", "return_output_ids_in_sglext")
_SGLEXT_KEYS = tuple(f'"{flag}"'.encode() for flag in SGLEXT_FLAGS)
# Statuses an upstream answers an unknown or unsupported request field with (OpenAI 400, FastAPI 422).
REFUSAL_STATUSES = frozenset({400, 422})


@dataclass(frozen=True)
class Injection:
    """What the proxy added to one request."""

    token_ids: bool
    logprobs: bool
    sglext: bool = False

    def body_fields(self) -> tuple[str, ...]:
        """The request fields the proxy added to the body (an upstream's refusal names one of them)."""
        return (("return_token_ids",) if self.token_ids else ()) + (("logprobs",) if self.logprobs else ())


def inject(api_name: str, body: Json) -> Injection | None:
    """Add the token-id request fields the agent left out (mutates ``body``); None when nothing was added."""
    if api_name not in TOKEN_ID_APIS:
        return None
    token_ids = not body.get("return_token_ids")
    if token_ids:
        body["return_token_ids"] = True
    if api_name == openai_chat.NAME:
        logprobs = not body.get("logprobs")
        if logprobs:
            body["logprobs"] = True
    else:
        logprobs = body.get("logprobs") is None
        if logprobs:
            body["logprobs"] = COMPLETIONS_LOGPROBS
    return Injection(token_ids, logprobs) if token_ids or logprobs else None


def inject_body(api_name: str, body: bytes) -> tuple[bytes, Injection] | None:
    """``inject`` on a raw JSON body. When neither field name occurs anywhere in the body, the fields
    are spliced in after the opening brace, sparing a parse and re-serialization of a long prompt."""
    if api_name not in TOKEN_ID_APIS:
        return None
    stripped = body.lstrip()
    if not stripped.startswith(b"{"):
        return None
    if b'"return_token_ids"' not in body and b'"logprobs"' not in body:
        logprobs = b"true" if api_name == openai_chat.NAME else str(COMPLETIONS_LOGPROBS).encode()
        rest = stripped[1:].lstrip()
        separator = b"" if rest.startswith(b"}") else b","
        spliced = b'{"return_token_ids":true,"logprobs":' + logprobs + separator + rest
        return spliced, Injection(token_ids=True, logprobs=True)
    try:
        check_depth(body)
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    injection = inject(api_name, parsed)
    return (dump(parsed), injection) if injection is not None else None


def wants_sglext(asked: Collection[str], body: bytes) -> bool:
    """Whether the agent asked SGLang for its ``sglext`` ids itself (then the proxy leaves them be);
    ``asked``: the lower-case names of the headers it sent with a value."""
    return any(name in asked for name in SGLEXT_HEADERS) or any(flag in body for flag in _SGLEXT_KEYS)


def refused_field(status: int, body: bytes, injection: Injection) -> str | None:
    """The injected field an error answer names (``Unrecognized request argument supplied: logprobs``,
    ``logprobs is not supported with this model``), None when the error is about something else."""
    if status not in REFUSAL_STATUSES:
        return None
    text = body.decode("utf-8", "replace")
    return next((name for name in injection.body_fields() if name in text), None)


@dataclass
class TokenIdPolicy:
    """Which upstreams get token-id fields: those configured as accepting them (``host`` for any port,
    ``host:port``, or ``*`` for all), less those seen refusing them in this process."""

    hosts: frozenset[str]
    refused: set[str] = field(default_factory=set)

    @classmethod
    def parse(cls, text: str) -> TokenIdPolicy:
        return cls(frozenset(h.strip().lower() for h in text.split(",") if h.strip()))

    def skip_reason(self, host: str, port: int) -> str | None:
        """None when this upstream gets the fields, else why not (for the record's provenance)."""
        address = f"{host.lower()}:{port}"
        if address in self.refused:
            return f"token ids not requested: {address} refused injected fields earlier"
        if "*" in self.hosts or host.lower() in self.hosts or address in self.hosts:
            return None
        return f"token ids not requested: {address} is not in CLAWR1_TOKEN_ID_HOSTS"

    def remember_refusal(self, host: str, port: int) -> None:
        self.refused.add(f"{host.lower()}:{port}")


def _keeps_nulls(obj: Json) -> bool:
    return any(value is None for key, value in obj.items() if key not in ID_FIELDS)


def _remove(obj: Json, key: str, keep_null: bool) -> bool:
    if key not in obj or (keep_null and obj[key] is None):
        return False
    if keep_null:
        obj[key] = None
    else:
        del obj[key]
    return True


def choice_list(obj: Json) -> list[Json]:
    """The choices of a reply or chunk that are objects (none when ``choices`` is not a list)."""
    choices = obj.get("choices")
    return [c for c in choices if isinstance(c, dict)] if isinstance(choices, list) else []


def strip_json(obj: Json, injection: Injection) -> bool:
    """Remove injected fields from one response object or stream chunk in place; True if it changed."""
    keep_null = _keeps_nulls(obj)
    changed = False
    choices = choice_list(obj)
    if injection.token_ids:
        changed |= _remove(obj, "prompt_token_ids", keep_null)
        for choice in choices:
            for key in ID_FIELDS:
                changed |= _remove(choice, key, keep_null)
    if injection.logprobs:
        # OpenAI-compatible servers send ``logprobs`` on every choice, null when not asked for.
        for choice in choices:
            changed |= _remove(choice, "logprobs", keep_null=True)
    if injection.sglext:
        for holder in (obj, *choices):
            changed |= _remove(holder, "sglext", keep_null=False)
    return changed


def is_empty_chunk(obj: Json) -> bool:
    """A chunk with nothing the agent would have seen: no usage, and choices with nothing but an index
    (no delta, message, finish reason or logprobs)."""
    choices = obj.get("choices")
    if obj.get("usage") or obj.get("error") or (choices and not isinstance(choices, list)):
        return False
    return all(
        isinstance(c, dict) and not any(value for key, value in c.items() if key != "index")
        for c in choices or []
    )


def carries_sglext(obj: Json, injection: Injection) -> bool:
    """Whether a chunk carries the ``sglext`` the proxy asked SGLang for (before it is stripped)."""
    return bool(injection.sglext) and ("sglext" in obj or any("sglext" in c for c in choice_list(obj)))


def strip_chunk(obj: Json, injection: Injection) -> bool | None:
    """``strip_json`` for one stream chunk; None when the chunk existed only to carry what the proxy
    asked for (SGLang's final ``sglext`` chunk), so the agent must not get it at all."""
    carried_sglext = carries_sglext(obj, injection)
    changed = strip_json(obj, injection)
    return None if carried_sglext and is_empty_chunk(obj) else changed


def dump(obj: Any) -> bytes:
    """Compact JSON, as pydantic-based engines (vLLM, SGLang) write it; with every non-ASCII character
    escaped when the text holds a lone surrogate (a JavaScript server's ``\\ud83d``, passed on as it came),
    which UTF-8 cannot encode: otherwise the agent got the fields the proxy injected (token ids)."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:
        return json.dumps(obj, separators=(",", ":")).encode()


# Text with every digit as "0" and every other byte as a space: a run of 19 zeros there is a number
# orjson may not read exactly (an integer past 64 bits becomes a float).
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_NUMBER = b"0" * 19
# orjson writes at most 254 levels: wrapped in 54 lists, a value it read is written iff it nests at most
# MAX_JSON_DEPTH. One pass in Rust, ~5x cheaper than measuring the text (a coding agent's request holds
# hundreds of brackets in its strings); test_proxy_strip.py holds load to the limit.
_ORJSON_MAX_DEPTH = 254


def _within_limit(value: Any) -> bool:
    for _ in range(_ORJSON_MAX_DEPTH - MAX_JSON_DEPTH):
        value = [value]
    try:
        orjson.dumps(value)
    except orjson.JSONEncodeError:
        return False
    return True


def load(data: bytes) -> Any:
    """The values ``json.loads`` gives, read by orjson where it reads them exactly (a reply's thousands of
    token ids parse several times faster): text orjson refuses (NaN, lone surrogates, a byte-order mark)
    or may read as a float (a run of 19 or more digits: an integer past 64 bits) takes the standard
    library. Raises ValueError, also ``JsonTooDeep`` for JSON nested deeper than ``MAX_JSON_DEPTH``
    (which the standard library then never reads)."""
    if _LONG_NUMBER not in data.translate(_DIGITS_AS_ZEROS):
        try:
            value = orjson.loads(data)  # refuses past 1,024 levels, without recursion
        except orjson.JSONDecodeError:
            pass
        else:
            if not _within_limit(value):
                raise JsonTooDeep()
            return value
    check_depth(data)
    return json.loads(data)


class Dropped:
    """What ``rewrite_json`` answers for an object its transform drops."""


DROPPED: Final = Dropped()

# How compact JSON (vLLM's pydantic, SGLang's orjson) opens the id lists the proxy asks for: one search
# for what ends every ``ID_FIELDS`` opener, then what comes before it says which. Those lists are most of
# a reply's bytes (a prompt's ids) and of the values a parse makes: ``cut_id_lists`` replaces them with
# this one-item list before parsing, and a transform that removed them all leaves no trace of it.
_ID_LIST_END = b'token_ids":['
_ID_KEY_STARTS = (b'"', b'"prompt_', b'"response_')  # each followed by it: the keys of ID_FIELDS
CUT_MARK = b'"\\u0000clawr1: ids cut"'  # as the text holds it and as ``dump`` writes it back
_CUT_LIST = b"[" + CUT_MARK + b"]"
_DIGITS_AND_COMMAS = b"0123456789,"


def _integer_list(items: bytes) -> bool:
    """Whether ``items`` (between a list's brackets) is one or more compact JSON integers >= 0: digits
    and commas, no empty item, no number but 0 itself starting with 0. Searched backwards: ``rfind`` of
    a two-byte needle takes half the time of ``find`` in such text, and both beat a regular expression."""
    framed = b"," + items + b","
    if items.translate(None, _DIGITS_AND_COMMAS) or framed.rfind(b",,") >= 0:
        return False
    at = framed.rfind(b",0")
    while at >= 0:  # an item that starts with 0 must be 0
        if framed[at + 2] != 0x2C:
            return False
        at = framed.rfind(b",0", 0, at)
    return True


def cut_id_lists(data: bytes) -> bytes:
    """``data`` with every non-empty, compact list of integers that is the value of an ``ID_FIELDS`` key
    replaced by ``_CUT_LIST`` (the same nesting and truth), ``data`` itself when there is none.

    An opener counts only after ``{`` or ``,``: its quote then opens a key (in a string it would be
    escaped), or closes a string, which makes the text invalid either way. A list ends at its first
    ``]`` since it holds nothing but digits and commas. So the cut text reads as the original would,
    the cut lists aside, and fails to read where the original fails."""
    spans: list[tuple[int, int]] = []
    at = data.find(_ID_LIST_END)
    while at >= 0:
        start = at + len(_ID_LIST_END)
        end = data.find(b"]", start)
        if end < 0:
            break
        key = next((at - len(k) for k in _ID_KEY_STARTS
                    if at > len(k) and data.startswith(k, at - len(k))), 0)
        if key > 0 and data[key - 1] in b"{," and _integer_list(data[start:end]):
            spans.append((start - 1, end + 1))
        at = data.find(_ID_LIST_END, end)
    if not spans:
        return data
    pieces: list[bytes] = []
    copied = 0
    for start, end in spans:
        pieces += (data[copied:start], _CUT_LIST)
        copied = end
    pieces.append(data[copied:])
    return b"".join(pieces)


def _rewritten(data: bytes, transform: Callable[[Json], bool | None]) -> bytes | Dropped | None:
    obj = load(data)
    if not isinstance(obj, dict):
        return None
    changed = transform(obj)
    if changed is None:
        return DROPPED
    return dump(obj) if changed else None


def rewrite_json(data: bytes, transform: Callable[[Json], bool | None],
                 cut: bool = False) -> bytes | Dropped | None:
    """The JSON object in ``data`` after ``transform`` (which edits it in place and says whether it
    changed it, or None to drop it): its new text, ``DROPPED``, or None when unchanged or not an object.
    Raises ValueError when ``data`` cannot be read or written back.

    ``cut``: the transform removes every ``ID_FIELDS`` member wherever ``strip_json`` looks (token ids
    were injected). The id lists are then cut before parsing (``cut_id_lists``); a cut list the
    transform kept, or a cut text that does not read, sends the whole text through the same path, so
    the answer is always the one the whole text gives."""
    if cut and (shorter := cut_id_lists(data)) is not data:
        try:
            out = _rewritten(shorter, transform)
        except ValueError:
            pass  # the whole text gives its own error, or its answer
        else:
            if not (isinstance(out, bytes) and CUT_MARK in out):
                return out
    return _rewritten(data, transform)


def strip_body(body: bytes, injection: Injection) -> bytes | None:
    """The plain response body without the injected fields; None when there was nothing to remove, or
    when it cannot be read or written back (the agent then gets the engine's body)."""
    try:
        out = rewrite_json(body, lambda obj: strip_json(obj, injection), cut=injection.token_ids)
    except ValueError:  # not JSON, or text the encoder cannot write back (a lone surrogate)
        return None
    return out if isinstance(out, bytes) else None
