"""Re-tokenization of turns whose serving engine returned no token ids.

Used only when ``settings.tokenizer`` names a Hugging Face ``tokenizers`` tokenizer: a local
``tokenizer.json`` (or a folder holding one), or a hub name found in the local Hugging Face cache
(there is no network). Steps tokenized here are marked ``retokenized`` with the tokenizer's
identity ``<name>@sha256:<first 16 hex of the tokenizer.json>``, so a trainer can tell them from
engine ids. The chat template is a fixed ChatML rendering (documented in docs/streams.md); it is
an approximation of the engine's own template, which is why such steps never pass for ``engine``.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

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

    @classmethod
    def load(cls, spec: str) -> Retokenizer:
        """Fails fast (at worker start) with the reason when ``spec`` cannot be loaded offline."""
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
        return cls(tokenizer, f"{name}@sha256:{hashlib.sha256(data).hexdigest()[:16]}")

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_turn(self, messages: list[dict[str, Any]], raw_prompt: str | None, text: str,
                    tool_calls: list[Any]) -> tuple[list[int], list[int]]:
        """(prompt ids, response ids); the completions API's raw prompt and reply go untemplated."""
        if raw_prompt is not None:
            return self._encode(raw_prompt), self._encode(text)
        return self._encode(render_prompt(messages)), self._encode(render_response(text, tool_calls))
