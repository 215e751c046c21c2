"""Asking a vLLM/SGLang-style engine for exact token ids, and taking back out only what the proxy asked for.

With ``--capture-token-ids`` the proxy adds ``return_token_ids`` (and logprobs) to chat and completions
requests that did not ask for them, then removes those fields from the reply, so the agent receives
what it would have received without the proxy. Fields the agent asked for itself are left alone.

Engines differ in how they serialize fields nobody asked for: vLLM writes them as ``null`` in plain
responses and leaves them out of stream chunks. Each JSON object says which style it uses: if it
carries any other ``null`` field, the injected fields are set back to ``null``; otherwise removed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from proxy.apis import openai_chat, openai_completions

Json = dict[str, Any]
TOKEN_ID_APIS = frozenset({openai_chat.NAME, openai_completions.NAME})
# vLLM's names, SGLang's per-choice name for chat.
ID_FIELDS = ("prompt_token_ids", "token_ids", "response_token_ids")
COMPLETIONS_LOGPROBS = 1


@dataclass(frozen=True)
class Injection:
    """What the proxy added to one request."""

    token_ids: bool
    logprobs: bool


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
        parsed = json.loads(body)
    except ValueError:
        return None
    if not isinstance(parsed, dict):
        return None
    injection = inject(api_name, parsed)
    return (dump(parsed), injection) if injection is not None else None


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


def strip_json(obj: Json, injection: Injection) -> bool:
    """Remove injected fields from one response object or stream chunk in place; True if it changed."""
    keep_null = _keeps_nulls(obj)
    changed = False
    choices = [c for c in obj.get("choices") or [] if isinstance(c, dict)]
    if injection.token_ids:
        changed |= _remove(obj, "prompt_token_ids", keep_null)
        for choice in choices:
            for key in ID_FIELDS:
                changed |= _remove(choice, key, keep_null)
    if injection.logprobs:
        # OpenAI-compatible servers send ``logprobs`` on every choice, null when not asked for.
        for choice in choices:
            changed |= _remove(choice, "logprobs", keep_null=True)
    return changed


def dump(obj: Any) -> bytes:
    """Compact JSON, as pydantic-based engines (vLLM, SGLang) write it."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def strip_body(body: bytes, injection: Injection) -> bytes | None:
    """The plain response body without the injected fields; None when there was nothing to remove."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not strip_json(obj, injection):
        return None
    return dump(obj)
