"""Re-tokenization of turns whose serving engine returned no token ids.

Used only when ``settings.tokenizer`` names a Hugging Face ``tokenizers`` tokenizer: a local
``tokenizer.json`` (or a folder holding one), or a hub name found in the local Hugging Face cache
(there is no network). When the tokenizer's folder has the model's chat template
(``tokenizer_config.json``'s ``chat_template`` or ``chat_template.jinja``), prompts and replies are
rendered with it as the engine would (clawr1.streams.chat_template); otherwise with a fixed ChatML rendering
(documented in docs/streams.md). Steps tokenized here are marked ``retokenized`` with the identity
``<name>@sha256:<first 16 hex of the tokenizer.json>``, followed by ``+chat_template@sha256:<16 hex>``
when the model's template rendered them, so a trainer can tell them from engine ids and from each other.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from clawr1.streams.chat_template import ChatTemplate, ChatTemplateError, template_messages, template_tools

_TEXT_PARTS = {"text", "input_text", "output_text"}


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") if isinstance(p, dict) and p.get("type") in _TEXT_PARTS
            else p if isinstance(p, str) else json.dumps(p, sort_keys=True, ensure_ascii=False)
            for p in content
        )
    return json.dumps(content, sort_keys=True, ensure_ascii=False)


def _tool_calls_text(tool_calls: list[Any]) -> str:
    return "".join(f"<tool_call>{json.dumps(c, sort_keys=True, ensure_ascii=False)}</tool_call>"
                   for c in tool_calls)


def render_prompt(messages: list[dict[str, Any]]) -> str:
    """ChatML: ``<|im_start|>{role}\\n{content}{tool calls}<|im_end|>\\n`` per message, then the
    generation prompt ``<|im_start|>assistant\\n``."""
    turns = [
        f"<|im_start|>{m.get('role', '')}\n{_content_text(m.get('content'))}"
        f"{_tool_calls_text(m.get('tool_calls') or [])}<|im_end|>\n"
        for m in messages
    ]
    return "".join(turns) + "<|im_start|>assistant\n"


def render_response(text: str, tool_calls: list[Any]) -> str:
    return f"{text}{_tool_calls_text(tool_calls)}<|im_end|>"


def _cached_hub_file(name: str) -> Path | None:
    home = Path(os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface"))
    snapshots = home / "hub" / f"models--{name.replace('/', '--')}" / "snapshots"
    found = sorted(snapshots.glob("*/tokenizer.json")) if snapshots.is_dir() else []
    return found[-1] if found else None


@dataclass(frozen=True)
class Retokenizer:
    tokenizer: Tokenizer
    identity: str
    template: ChatTemplate | None = None
    """The model's own chat template; None renders the fixed ChatML."""

    @classmethod
    def load(cls, spec: str) -> Retokenizer:
        """Fails fast (at worker start) with the reason when ``spec`` cannot be loaded offline (or its
        chat template does not compile)."""
        path = Path(spec)
        if path.is_dir():
            path = path / "tokenizer.json"
        name = path.parent.name if path.name == "tokenizer.json" else path.stem
        if not path.is_file():
            cached = _cached_hub_file(spec)
            if cached is None:
                raise ValueError(f"tokenizer {spec!r}: no such tokenizer.json, and not in the local "
                                 "Hugging Face cache (there is no network access to download it)")
            path, name = cached, spec
        data = path.read_bytes()
        try:
            tokenizer = Tokenizer.from_str(data.decode())
        except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception on bad files
            raise ValueError(f"tokenizer {spec!r}: cannot load {path}: {exc}") from exc
        identity = f"{name}@sha256:{hashlib.sha256(data).hexdigest()[:16]}"
        try:
            # A model folder (as the hub lays it out) holds the template beside its tokenizer.json.
            template = ChatTemplate.from_directory(path.parent) if path.name == "tokenizer.json" else None
            if template is not None:
                template.validate()
        except ChatTemplateError as exc:
            raise ValueError(f"tokenizer {spec!r}: {exc}") from exc
        if template is None:
            return cls(tokenizer, identity)
        return cls(tokenizer, f"{identity}+chat_template@{template.digest}", template)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_turn(self, messages: list[dict[str, Any]], raw_prompt: str | None, text: str,
                    tool_calls: list[Any], tools: list[Any] | None = None) -> tuple[list[int], list[int]]:
        """(prompt ids, response ids); the completions API's raw prompt and reply go untemplated.

        Raises ValueError when the model's template refuses the conversation (its raise_exception)."""
        if raw_prompt is not None:
            return self._encode(raw_prompt), self._encode(text)
        if self.template is None:
            return self._encode(render_prompt(messages)), self._encode(render_response(text, tool_calls))
        prompt, response = render_turn(self.template, messages, text, tool_calls, tools)
        return self._encode(prompt), self._encode(response)


def render_turn(template: ChatTemplate, messages: list[dict[str, Any]], text: str, tool_calls: list[Any],
                tools: list[Any] | None = None) -> tuple[str, str]:
    """(prompt, response) text in the model's template. The prompt ends with the generation prompt; the
    response is what the template appends for the assistant's reply (text, tool calls in the model's
    own syntax, end-of-turn token), without the newlines after it that the model never generates.
    When the template renders the history differently once the reply follows (some drop earlier
    reasoning), the response is the text and ``eos_token``."""
    history = template_messages(messages)
    schemas = template_tools(tools)
    reply: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        reply["tool_calls"] = tool_calls
    prompt = template.render(history, schemas, add_generation_prompt=True)
    whole = template.render(history + template_messages([reply]), schemas, add_generation_prompt=False)
    if whole.startswith(prompt):
        return prompt, whole[len(prompt):].rstrip("\n")
    return prompt, text + template.eos_token
