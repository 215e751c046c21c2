"""The re-tokenization template and how a tokenizer is found and identified."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from clawr1.streams.tokenization import Retokenizer, render_prompt, render_response
from tests.support.events import build_tokenizer


def test_chatml_template() -> None:
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": "{}"}}],
        },
    ]
    assert render_prompt(messages) == (
        "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
        '<tool_call>{"function": {"arguments": "{}", "name": "f"}, "id": "c1"}</tool_call><|im_end|>\n'
        "<|im_start|>assistant\n"
    )
    assert render_response("ok", []) == "ok<|im_end|>"


def test_loads_a_file_or_its_folder_and_names_it_by_content(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    path = build_tokenizer(str(folder / "tokenizer.json"))
    digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    assert (
        Retokenizer.load(path).identity
        == Retokenizer.load(str(folder)).identity
        == f"my-model@sha256:{digest}"
    )
    prompt, response = Retokenizer.load(path).encode_turn(
        [{"role": "user", "content": "hi"}], None, "hello", []
    )
    # <|im_start|> user hi <|im_end|> <|im_start|> assistant: the markers are single special tokens.
    assert (prompt, response) == ([22, 1, 4, 23, 22, 2], [5, 23])


def test_completions_prompt_is_not_templated(tmp_path: Path) -> None:
    tokenizer = Retokenizer.load(build_tokenizer(str(tmp_path / "tokenizer.json")))
    prompt, response = tokenizer.encode_turn(
        [{"role": "user", "content": "hi there"}], "hi there", "hello", []
    )
    assert len(prompt) == 2 and len(response) == 1


def test_missing_tokenizer_fails_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no network"):
        Retokenizer.load("some-org/some-model")
    broken = tmp_path / "tokenizer.json"
    broken.write_text("{}")
    with pytest.raises(ValueError, match="cannot load"):
        Retokenizer.load(str(broken))
