"""A model's own chat template (the Jinja ``chat_template`` of its tokenizer), rendered as Hugging Face does.

Re-tokenization must spell a prompt the way the serving engine did, and engines (vLLM, SGLang, TGI) render
with ``transformers``' ``apply_chat_template``. That is used when ``transformers`` is installed; otherwise
the same Jinja environment is built here (sandboxed, ``trim_blocks``/``lstrip_blocks``, loop controls, the
``{% generation %}`` tag, a ``tojson`` that neither escapes HTML nor sorts keys, ``raise_exception`` and
``strftime_now``) and rendered with the same variables: ``messages``, ``tools``, ``documents``,
``add_generation_prompt`` and the tokenizer's special tokens (``bos_token``, ``eos_token``, ...).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from clawr1.core.json_depth import check_depth

# The special tokens Hugging Face passes to a template (its ``special_tokens_map``).
SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                      "mask_token")
_TEXT_PARTS = {"text", "input_text", "output_text"}


class ChatTemplateError(ValueError):
    """The template is missing or broken, or refused the conversation (its ``raise_exception``)."""


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an ``AddedToken`` object."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _raise_exception(message: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _compile(source: str) -> Any:
    """Hugging Face's template environment (``transformers.utils.chat_template_utils``)."""
    try:
        import jinja2
        from jinja2.ext import Extension, loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:
        raise ChatTemplateError("rendering a chat template needs jinja2 (or transformers): "
                                "pip install 'claw-r1[tokenizer]'") from exc

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` marks assistant text for masks; it renders as is."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the chat template does not compile: {exc}") from exc


def _content(content: Any) -> Any:
    """Text parts joined by newlines, as vLLM hands string-content templates a multi-part message."""
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") in _TEXT_PARTS
                                         for p in content):
        return "\n".join(str(p.get("text", "")) for p in content)
    return content


def _tool_call(call: Any) -> Any:
    """Arguments as an object, as templates expect and vLLM passes them (the wire has a JSON string)."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("arguments"), str):
        return call
    try:
        check_depth(function["arguments"], "tool call arguments")  # every way in bounds them; a backstop
        arguments = json.loads(function["arguments"])
    except ValueError:  # JsonTooDeep included: kept as the string the wire had
        return call
    return {**call, "function": {**function, "arguments": arguments}}


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as templates read it: no empty ``tool_calls`` key (``'tool_calls' in message``
    selects the tool-call branch of e.g. Llama 3's template), argument objects, flat text content."""
    out = []
    for message in messages:
        rendered = {k: v for k, v in message.items() if k != "tool_calls"}
        if "content" in message:
            rendered["content"] = _content(message["content"])
        if message.get("tool_calls"):
            rendered["tool_calls"] = [_tool_call(c) for c in message["tool_calls"]]
        out.append(rendered)
    return out


def template_tools(tools: Any) -> list[dict[str, Any]] | None:
    """OpenAI chat-style tool schemas (``{"type": "function", "function": {...}}``), which model templates
    read; the Responses API's flat form and Anthropic's ``input_schema`` form are rewritten to it."""
    if not tools:
        return None
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or isinstance(tool.get("function"), dict) or "name" not in tool:
            out.append(tool)
            continue
        function = {"name": tool["name"]}
        if "description" in tool:
            function["description"] = tool["description"]
        parameters = tool.get("parameters", tool.get("input_schema"))
        if parameters is not None:
            function["parameters"] = parameters
        out.append({"type": "function", "function": function})
    return out


@dataclass(frozen=True)
class ChatTemplate:
    """A tokenizer's chat template(s) with the special tokens they are rendered with."""

    source: str
    """The default template."""
    tool_use: str | None = None
    """A separate template for conversations with tools, when the config names one (``tool_use``)."""
    special_tokens: Mapping[str, Any] = field(default_factory=dict)
    """bos_token, eos_token, ... (strings) and additional_special_tokens (a list), as in the config."""

    @classmethod
    def from_directory(cls, directory: Path) -> ChatTemplate | None:
        """The template of a tokenizer folder (``chat_template.jinja`` first, as transformers saves it,
        else ``tokenizer_config.json``'s ``chat_template``); None when it has neither."""
        config_path = directory / "tokenizer_config.json"
        try:
            config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        except ValueError as exc:
            raise ChatTemplateError(f"{config_path} is not JSON: {exc}") from exc
        jinja_path = directory / "chat_template.jinja"
        source = jinja_path.read_text() if jinja_path.is_file() else config.get("chat_template")
        if source is None:
            return None
        tokens = special_tokens_of(config)
        if isinstance(source, str):
            return cls(source, None, tokens)
        # A named list, as transformers picks from it: ``tool_use`` with tools, else ``default``.
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)} \
            if isinstance(source, list) else {}
        default = named.get("default")
        if not isinstance(default, str):
            raise ChatTemplateError(f"{config_path}: chat_template is neither a string nor a list with a "
                                    "'default' template")
        return cls(default, named.get("tool_use"), tokens)

    @property
    def digest(self) -> str:
        """``sha256:<first 16 hex>`` of the template source(s): which template rendered a step."""
        text = self.source if self.tool_use is None else json.dumps([self.source, self.tool_use])
        return f"sha256:{hashlib.sha256(text.encode()).hexdigest()[:16]}"

    @property
    def eos_token(self) -> str:
        return str(self.special_tokens.get("eos_token") or "")

    def _source_for(self, tools: list[dict[str, Any]] | None) -> str:
        return self.tool_use if tools is not None and self.tool_use is not None else self.source

    @cached_property
    def _compiled(self) -> dict[str, Any]:
        return {source: _compile(source) for source in {self.source, self.tool_use} if source is not None}

    def validate(self) -> None:
        """Compiles the template(s) now, so a broken one fails at worker start, not on a turn."""
        if not self._compiled:
            raise ChatTemplateError("no chat template to compile")

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
               add_generation_prompt: bool = False, prefer_transformers: bool = True) -> str:
        """The template's text for ``messages`` (already in template form: see ``template_messages``):
        transformers' own rendering when it is installed (and preferred), else the same in jinja2."""
        source = self._source_for(tools)
        hf_render = _transformers_renderer() if prefer_transformers else None
        import jinja2

        try:
            if hf_render is not None:
                rendered, _ = hf_render(conversations=[messages], tools=tools, chat_template=source,
                                        add_generation_prompt=add_generation_prompt, **self.special_tokens)
                return str(rendered[0])
            return str(self._compiled[source].render(messages=messages, tools=tools, documents=None,
                                                     add_generation_prompt=add_generation_prompt,
                                                     **self.special_tokens))
        except jinja2.TemplateError as exc:
            raise ChatTemplateError(f"the chat template refused the conversation: {exc}") from exc


@cache
def _transformers_renderer() -> Any:
    """``transformers.utils.chat_template_utils.render_jinja_template`` (what ``apply_chat_template``
    renders with), or None when transformers is not installed."""
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        return None
    return render_jinja_template


def special_tokens_of(config: Mapping[str, Any]) -> dict[str, Any]:
    """The special tokens tokenizer_config.json declares, as strings (what a template sees)."""
    tokens: dict[str, Any] = {}
    for key in SPECIAL_TOKEN_KEYS:
        text = _token_text(config.get(key))
        if text is not None:
            tokens[key] = text
    extra = [t for t in (_token_text(v) for v in config.get("additional_special_tokens") or []) if t]
    if extra:
        tokens["additional_special_tokens"] = extra
    return tokens

