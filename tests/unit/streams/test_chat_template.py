"""The model's own chat template: rendered as Hugging Face renders it, and used by re-tokenization.

The fixtures under chat_templates/ follow the structure of the Qwen2.5, Llama 3.1 and Mistral v0.3
templates (tools, system prompt, tool results, multi-turn). Each rendering is checked against the text
derived by hand from the template, and against transformers' own rendering when transformers is
importable (it is not a dependency).
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from clawr1.streams.chat_template import ChatTemplate, ChatTemplateError, template_messages, template_tools
from clawr1.streams.tokenization import Retokenizer, render_turn

FIXTURES = Path(__file__).parent / "chat_templates"

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]
CALL = {"id": "call00001", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}
# As captured from an OpenAI-style request: arguments are a JSON string, an assistant's content may be None.
CONVERSATION: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call00001", "content": '{"temp": 21, "sky": "<clear> & dry"}'},
    {"role": "assistant", "content": "21 degrees, clear."},
    {"role": "user", "content": "And in Genève?"},
]
TOOL_JSON = ('{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", '
             '"parameters": {"type": "object", "properties": {"city": {"type": "string"}}, '
             '"required": ["city"]}}}')

QWEN_PROMPT = (
    "<|im_start|>system\nYou are terse.\n\n# Tools\n\nYou may call one or more functions to assist with the "
    "user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    + TOOL_JSON
    + "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n"
    "<|im_start|>user\nWeather in Zürich?<|im_end|>\n"
    '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n'
    "</tool_call><|im_end|>\n"
    '<|im_start|>user\n<tool_response>\n{"temp": 21, "sky": "<clear> & dry"}\n</tool_response><|im_end|>\n'
    "<|im_start|>assistant\n21 degrees, clear.<|im_end|>\n"
    "<|im_start|>user\nAnd in Genève?<|im_end|>\n"
    "<|im_start|>assistant\n"
)
LLAMA_TOOL_JSON = """{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather of a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {
                    "type": "string"
                }
            },
            "required": [
                "city"
            ]
        }
    }
}"""
LLAMA_PROMPT = (
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
    "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\nYou are terse.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please respond with a JSON "
    "for a function call with its proper arguments that best answers the given prompt.\n\n"
    'Respond in the format {"name": function name, "parameters": dictionary of argument name and its '
    'value}.Do not use variables.\n\n'
    + LLAMA_TOOL_JSON
    + "\n\nWeather in Zürich?<|eot_id|>"
    '<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": '
    '{"city": "Zürich"}}<|eot_id|>'
    # Llama 3.1 JSON-encodes a tool result even when it is a string (a string is iterable).
    '<|start_header_id|>ipython<|end_header_id|>\n\n"{\\"temp\\": 21, \\"sky\\": \\"<clear> & dry\\"}"'
    "<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n21 degrees, clear.<|eot_id|>"
    "<|start_header_id|>user<|end_header_id|>\n\nAnd in Genève?<|eot_id|>"
    "<|start_header_id|>assistant<|end_header_id|>\n\n"
)
MISTRAL_PROMPT = (
    "<s>[INST] Weather in Zürich?[/INST]"
    '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Zürich"}, "id": "call00001"}]</s>'
    '[TOOL_RESULTS] {"content": {"temp": 21, "sky": "<clear> & dry"}, "call_id": "call00001"}[/TOOL_RESULTS]'
    " 21 degrees, clear.</s>"
    '[AVAILABLE_TOOLS] [{"type": "function", "function": {"name": "get_weather", "description": "Weather '
    'of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": '
    '["city"]}}}][/AVAILABLE_TOOLS]'
    "[INST] You are terse.\n\nAnd in Genève?[/INST]"
)

MODELS: dict[str, dict[str, Any]] = {
    "qwen2_5": {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None},
    "llama3_1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    # Written the way older configs store special tokens: AddedToken objects.
    "mistral_v3": {"bos_token": {"__type": "AddedToken", "content": "<s>", "lstrip": False},
                   "eos_token": {"__type": "AddedToken", "content": "</s>", "lstrip": False}},
}
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>", "<s>", "</s>", "[INST]", "[/INST]", "[TOOL_CALLS]",
            "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]


def tokenizer_dir(root: Path, model: str) -> Path:
    """A model folder as the hub lays it out: tokenizer.json (a byte-level BPE trained here on the
    expected renderings, with the models' special tokens) and tokenizer_config.json with the template."""
    folder = root / model
    folder.mkdir()
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator([QWEN_PROMPT, LLAMA_PROMPT, MISTRAL_PROMPT], trainer=trainer)
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast",
              "chat_template": (FIXTURES / f"{model}.jinja").read_text(), **MODELS[model]}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def transformers_render(template: ChatTemplate, messages: list[dict[str, Any]], tools: Any,
                        add_generation_prompt: bool) -> str | None:
    """transformers' apply_chat_template rendering, or None when transformers is not importable."""
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        return None
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel({"x": 0}, unk_token="x")),
                                        **{k: v for k, v in template.special_tokens.items()
                                           if k != "additional_special_tokens"})
    return str(tokenizer.apply_chat_template(messages, tools=tools, chat_template=template.source,
                                             add_generation_prompt=add_generation_prompt, tokenize=False))


def load(tmp_path: Path, model: str) -> ChatTemplate:
    template = ChatTemplate.from_directory(tokenizer_dir(tmp_path, model))
    assert template is not None
    return template


@pytest.mark.parametrize(("model", "expected", "add_generation_prompt"), [
    ("qwen2_5", QWEN_PROMPT, True),
    ("llama3_1", LLAMA_PROMPT, True),
    ("mistral_v3", MISTRAL_PROMPT, False),
])
def test_renders_tools_system_and_multi_turn_as_hugging_face(tmp_path: Path, model: str, expected: str,
                                                            add_generation_prompt: bool) -> None:
    template = load(tmp_path, model)
    messages, tools = template_messages(CONVERSATION), template_tools(TOOLS)
    rendered = template.render(messages, tools, add_generation_prompt=add_generation_prompt,
                               prefer_transformers=False)
    assert rendered == expected
    hf = transformers_render(template, messages, tools, add_generation_prompt)
    assert hf is None or hf == rendered
    assert template.render(messages, tools, add_generation_prompt=add_generation_prompt) == expected


def test_without_tools_the_templates_default_system_and_no_tool_block(tmp_path: Path) -> None:
    template = load(tmp_path, "qwen2_5")
    rendered = template.render(template_messages([{"role": "user", "content": "hi"}]), None,
                               add_generation_prompt=True)
    assert rendered == ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
                        "assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_retokenizes_with_the_models_template_and_records_its_hash(tmp_path: Path) -> None:
    folder = tokenizer_dir(tmp_path, "qwen2_5")
    retokenizer = Retokenizer.load(str(folder))
    # The existing form, a tokenizer.json path, finds the template beside it.
    assert Retokenizer.load(str(folder / "tokenizer.json")).identity == retokenizer.identity
    tokenizer_hash = hashlib.sha256((folder / "tokenizer.json").read_bytes()).hexdigest()[:16]
    template_hash = hashlib.sha256((FIXTURES / "qwen2_5.jinja").read_bytes()).hexdigest()[:16]
    assert retokenizer.identity == f"qwen2_5@sha256:{tokenizer_hash}+chat_template@sha256:{template_hash}"

    reply_call = {"id": "call00002", "type": "function",
                  "function": {"name": "get_weather", "arguments": '{"city": "Genève"}'}}
    prompt, response = retokenizer.encode_turn(CONVERSATION, None, "", [reply_call], TOOLS)
    tokenizer = retokenizer.tokenizer
    assert tokenizer.decode(prompt, skip_special_tokens=False) == QWEN_PROMPT
    # The reply in the model's own tool-call syntax, ending at its end-of-turn token (no newline after).
    assert tokenizer.decode(response, skip_special_tokens=False) == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Genève"}}\n</tool_call><|im_end|>')
    assert response[-1] == tokenizer.token_to_id("<|im_end|>")
    assert prompt.count(tokenizer.token_to_id("<|im_start|>")) == QWEN_PROMPT.count("<|im_start|>")


@pytest.mark.parametrize(("model", "reply"), [("llama3_1", "Sunny.<|eot_id|>"), ("mistral_v3", "Sunny.</s>")])
def test_reply_ends_with_the_models_end_of_turn(tmp_path: Path, model: str, reply: str) -> None:
    # Mistral's template moves the system prompt to the last user message, so the history renders
    # differently once the reply follows: the reply is then the text and eos_token.
    prompt, response = render_turn(load(tmp_path, model), CONVERSATION, "Sunny.", [], TOOLS)
    assert (prompt, response) == ({"llama3_1": LLAMA_PROMPT, "mistral_v3": MISTRAL_PROMPT}[model], reply)


def test_a_tokenizer_without_a_template_keeps_chatml_and_its_identity(tmp_path: Path) -> None:
    folder = tokenizer_dir(tmp_path, "qwen2_5")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    retokenizer = Retokenizer.load(str(folder))
    assert retokenizer.template is None and "+chat_template" not in retokenizer.identity
    prompt, _ = retokenizer.encode_turn([{"role": "user", "content": "hi"}], None, "ok", [])
    assert retokenizer.tokenizer.decode(prompt, skip_special_tokens=False) == (
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_template_file_and_named_templates_as_transformers_picks_them(tmp_path: Path) -> None:
    folder = tokenizer_dir(tmp_path, "qwen2_5")
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<b>", "chat_template": [
        {"name": "default", "template": "plain{{ messages | length }}"},
        {"name": "tool_use", "template": "tools{{ tools | length }}"},
    ]}))
    template = ChatTemplate.from_directory(folder)
    assert template is not None
    assert template.render([{"role": "user", "content": "a"}]) == "plain1"
    assert template.render([{"role": "user", "content": "a"}], template_tools(TOOLS)) == "tools1"
    (folder / "chat_template.jinja").write_text("file{{ bos_token }}\n")
    from_file = ChatTemplate.from_directory(folder)
    assert from_file is not None and from_file.render([]) == "file<b>"


def test_helpers_and_tags_of_the_hugging_face_environment() -> None:
    template = ChatTemplate(
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.content }}{% endfor %}|"
        "{% generation %}{{ eos_token }}{% endgeneration %}|{{ strftime_now('%Y') }}|"
        "{{ {'b': 1, 'a': '<é>'} | tojson }}",
        special_tokens={"eos_token": "</s>"},
    )
    rendered = template.render([{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
                               prefer_transformers=False)
    assert rendered == f'one|</s>|{datetime.now():%Y}|{{"b": 1, "a": "<é>"}}'


def test_tool_schemas_of_other_apis_are_rewritten_to_the_chat_form() -> None:
    parameters = TOOLS[0]["function"]["parameters"]
    anthropic = {"name": "get_weather", "description": "Weather of a city", "input_schema": parameters}
    responses = {"type": "function", "name": "get_weather", "description": "Weather of a city",
                 "parameters": parameters}
    assert template_tools([anthropic]) == template_tools([responses]) == template_tools(TOOLS) == TOOLS
    assert template_tools([]) is None and template_tools(None) is None


def test_refusals_and_broken_templates_fail_with_the_reason(tmp_path: Path) -> None:
    mistral = load(tmp_path, "mistral_v3")
    two_users = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(ChatTemplateError, match="roles must alternate"):
        mistral.render(template_messages(two_users))
    # Sandboxed: a template cannot reach Python internals or change its inputs.
    messages: list[dict[str, Any]] = []
    with pytest.raises(ChatTemplateError, match="unsafe"):
        ChatTemplate("{{ messages.append(1) }}").render(messages)
    assert messages == []
    broken = tokenizer_dir(tmp_path, "llama3_1")
    (broken / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% for m in messages %}"}))
    with pytest.raises(ValueError, match="does not compile"):
        Retokenizer.load(str(broken))


def test_tool_call_arguments_nested_too_deep_stay_the_string_they_came_as() -> None:
    """A backstop behind every way in: no arguments string makes the template's parse recurse."""
    deep = "[" * 50_000 + "]" * 50_000
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": deep}}
    [rendered] = template_messages([{"role": "assistant", "content": "", "tool_calls": [call]}])
    assert rendered["tool_calls"][0]["function"]["arguments"] == deep
