"""A stand-in LLM serving engine: the real HTTP/SSE wire protocols, deterministic toy replies.

Speaks OpenAI chat completions (plain, SSE, tools, n>1), completions, the Responses API and
Anthropic messages, plus ``/v1/models``, and returns vLLM's token-id fields when asked
(``return_token_ids``: top-level ``prompt_token_ids`` and per-choice ``token_ids``; streamed, the
first chunk of a choice carries the prompt ids and each later chunk the ids of its delta).

Token ids come from a byte-level toy tokenizer, so they always decode to exactly the text returned
(special ids >= 256 mark turns and the end of a reply). Replies depend only on the conversation, the
model and the choice index, so the same request always gets the same answer, whoever forwards it.
Plain responses write unrequested vLLM fields as ``null``; stream chunks leave them out, as vLLM does.

Test hooks, as request headers: ``x-standin-chunk-delay`` (seconds between stream events),
``x-standin-status`` (answer with that error status), ``x-standin-abort-after`` (drop the connection
after that many stream events), ``x-standin-end-after`` (end the stream cleanly after that many
events: no finish reason, no ``[DONE]``/``message_stop``). Behaviours chosen by model name:

- ``strict-*``: refuses engine extension fields (``return_token_ids``, SGLang's ``sglext`` flags)
  with OpenAI's 400 "Unrecognized request argument supplied: <field>";
- ``sglang-*``: ignores ``return_token_ids`` and returns SGLang's ``sglext`` ids when asked by flag
  (``return_input_ids_in_sglext`` / ``return_output_ids_in_sglext``) or ``x-sglext-return-*-ids``
  header: plain, top-level ``input_ids`` and per-choice ``output_ids``; streamed, one final chunk per
  choice (before ``[DONE]``) naming the choice, with both;
- ``*refuse*``: declines (OpenAI ``message.refusal`` / ``delta.refusal``, Anthropic
  ``stop_reason: "refusal"``);
- ``*greedy*``: every choice of an ``n > 1`` request is the same reply (greedy decoding).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from clawr1.core.signals import stop_loop_on_signals

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


def _digest(*parts: Any) -> bytes:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).digest()


def make_reply(conversation: Any, index: int, tool_names: Sequence[str], call_tool: bool,
               max_tokens: int | None) -> Reply:
    """The reply of a ``*refuse*`` model (``conversation[0]``) is the refusal, finish reason ``refusal``."""
    if "refuse" in str(conversation[0]):
        return Reply(REFUSAL, (), "refusal")
    if "greedy" in str(conversation[0]):
        index = 0
    digest = _digest(conversation, index)
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

def _ends_with_tool_result(messages: Sequence[Json]) -> bool:
    if not messages:
        return False
    last = messages[-1]
    if last.get("role") == "tool" or last.get("type") == "function_call_output":
        return True
    content = last.get("content")
    return isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "tool_result"
                                             for p in content)


def _tool_names(tools: Any) -> list[str]:
    names = []
    for tool in tools or []:
        if isinstance(tool, dict):
            name = (tool.get("function") or {}).get("name") if "function" in tool else tool.get("name")
            if name:
                names.append(str(name))
    return names


def _responses_messages(body: Json) -> list[Json]:
    messages: list[Json] = []
    if body.get("instructions"):
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items or []:
        if item.get("type") == "function_call_output":
            messages.append({"role": "tool", "content": item.get("output"), "type": "function_call_output"})
        elif item.get("type") == "function_call":
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": item.get("name"), "arguments": item.get("arguments")}}]})
        else:
            messages.append({"role": item.get("role", "user"), "content": item.get("content")})
    return messages


def _anthropic_messages(body: Json) -> list[Json]:
    system = [{"role": "system", "content": body["system"]}] if body.get("system") else []
    return system + list(body.get("messages") or [])


@dataclass(frozen=True)
class Received:
    """A request as the engine got it (header names lower-cased), for tests to inspect."""

    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class _Options:
    delay: float
    abort_after: int | None
    end_after: int | None = None
    # SGLang's sglext ids asked for: (input ids, output ids).
    sglext: tuple[bool, bool] = (False, False)


def _sglext_asked(body: Json, headers: Any) -> tuple[bool, bool]:
    return (bool(body.get("return_input_ids_in_sglext") or headers.get("x-sglext-return-input-ids")),
            bool(body.get("return_output_ids_in_sglext") or headers.get("x-sglext-return-output-ids")))


def _dump(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


def _sse(data: Any, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {data if isinstance(data, str) else _dump(data)}\n\n".encode()


def _sglext(input_ids: list[int] | None, output_ids: list[int] | None) -> Json:
    return {k: v for k, v in (("input_ids", input_ids), ("output_ids", output_ids)) if v is not None}


def _openai_finish(reply: Reply) -> str:
    """OpenAI ends a refusal with ``stop``; the refusal itself is in ``refusal``."""
    return "stop" if reply.finish_reason == "refusal" else reply.finish_reason


def _interleave(streams: Sequence[Sequence[bytes]]) -> Iterator[bytes]:
    for position in range(max((len(s) for s in streams), default=0)):
        for stream in streams:
            if position < len(stream):
                yield stream[position]


def _json_response(text: str, status: int = 200) -> Response:
    """A JSON answer, with the content type the engine has always sent."""
    return Response(text, status, media_type="application/json; charset=utf-8")


async def _http_error(request: Request, exc: Exception) -> Response:
    """Unknown routes and methods: a plain ``404: Not Found`` / ``405: Method Not Allowed``."""
    assert isinstance(exc, HTTPException)
    return PlainTextResponse(f"{exc.status_code}: {exc.detail}", exc.status_code, exc.headers)


class _EventStream(Response):
    """An SSE answer sent event by event, with the stream test hooks (``_Options``) applied."""

    def __init__(self, events: Iterator[bytes], options: _Options) -> None:
        super().__init__(media_type="text/event-stream; charset=utf-8", headers={"cache-control": "no-cache"})
        # No length: the server sends the events as chunks, each the moment it is written.
        self.raw_headers = [(k, v) for k, v in self.raw_headers if k != b"content-length"]
        self._events = events
        self._options = options

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        sending = asyncio.create_task(self._send(send))
        watching = asyncio.create_task(_disconnected(receive))
        done, _ = await asyncio.wait([sending, watching], return_when=asyncio.FIRST_COMPLETED)
        for task in (sending, watching):
            task.cancel()
        await asyncio.gather(sending, watching, return_exceptions=True)
        if sending in done:
            sending.result()

    async def _send(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        options = self._options
        for sent, event in enumerate(self._events):
            if options.abort_after is not None and sent >= options.abort_after:
                return  # the body is left unfinished: the server drops the connection mid-stream
            if options.end_after is not None and sent >= options.end_after:
                break
            if sent and options.delay:
                await asyncio.sleep(options.delay)
            await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _disconnected(receive: Receive) -> None:
    """Returns when the client has gone: the stream stops there, as a write to a closed socket would."""
    while (await receive())["type"] != "http.disconnect":
        pass


class _OneWayClose(ssl.SSLObject):
    """A TLS connection that closes once its own ``close_notify`` is sent, without waiting for the
    client's (as HTTP servers do): otherwise every idle keep-alive client holds the server's shutdown
    for asyncio's 30 s TLS shutdown timeout."""

    def unwrap(self) -> None:
        with contextlib.suppress(ssl.SSLWantReadError):
            super().unwrap()


class _Config(Config):
    """hypercorn's settings with the caller's own TLS context (HTTP/1.1 only, as before: no ALPN h2)."""

    def __init__(self, ssl_context: ssl.SSLContext | None) -> None:
        super().__init__()
        self._ssl_context = ssl_context

    @property
    def ssl_enabled(self) -> bool:
        return self._ssl_context is not None

    def create_ssl_context(self) -> ssl.SSLContext | None:
        return self._ssl_context


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host.strip("[]"), port), family=family)


@dataclass
class StandinEngine:
    """The ASGI application (Starlette), served by hypercorn as the product's API is; ``start``/``stop``
    run it on the current event loop."""

    model: str = DEFAULT_MODEL
    chunk_delay: float = 0.0
    received: deque[Received] = field(default_factory=lambda: deque(maxlen=256))
    _server: asyncio.Task[None] | None = None
    _shutdown: asyncio.Event | None = None

    def app(self, started: asyncio.Event | None = None) -> Starlette:
        """The routes; ``started`` is set once the server runs the app."""

        @contextlib.asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            if started is not None:
                started.set()
            yield

        app = Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/responses", self._responses, methods=["POST"]),
            Route("/v1/messages", self._messages, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
            # What vLLM and SGLang answer for liveness, and routers (sglang-router) check workers with.
            Route("/health", self._health, methods=["GET"]),
        ], exception_handlers={HTTPException: _http_error}, lifespan=lifespan)
        app.router.redirect_slashes = False  # a path with a trailing slash is unknown, not redirected
        return app

    async def start(self, host: str = "127.0.0.1", port: int = 0,
                    ssl_context: ssl.SSLContext | None = None) -> int:
        """Listen and return the bound port (connections queue from here on, served once hypercorn runs).
        A given TLS context is set to close connections without waiting for the client (``_OneWayClose``)."""
        listener = _listen(host, port)
        bound = int(listener.getsockname()[1])
        if ssl_context is not None:
            ssl_context.sslobject_class = _OneWayClose
        config = _Config(ssl_context)
        config.bind = [f"fd://{listener.detach()}"]
        config.keep_alive_timeout = 75.0  # idle agent and proxy connections stay open as they did before
        config.graceful_timeout = 5.0
        config.loglevel = "WARNING"
        started = asyncio.Event()
        self._shutdown = asyncio.Event()
        self._server = asyncio.create_task(hypercorn_serve(
            self.app(started), config, shutdown_trigger=self._shutdown.wait))  # type: ignore[arg-type]
        waiting = asyncio.create_task(started.wait())
        await asyncio.wait([self._server, waiting], return_when=asyncio.FIRST_COMPLETED)
        waiting.cancel()
        if self._server.done():
            self._server.result()  # raises why it could not start
        return bound

    async def stop(self) -> None:
        if self._server is not None and self._shutdown is not None:
            self._shutdown.set()
            await self._server
            self._server = self._shutdown = None

    # -- endpoint plumbing --

    def _receive(self, request: Request, body: bytes) -> str:
        """Keep the request for tests to inspect; its path."""
        path = request.url.path
        self.received.append(Received(path, {k.lower(): v for k, v in request.headers.items()}, body))
        return path

    async def _read(self, request: Request) -> tuple[Json, _Options] | Response:
        raw = await request.body()
        path = self._receive(request, raw)
        status = request.headers.get("x-standin-status")
        if status:
            return self._error(path, int(status), "stand-in failure on request")
        try:
            body = json.loads(raw)
        except ValueError:
            return self._error(path, 400, "request body is not JSON")
        if not isinstance(body, dict):
            return self._error(path, 400, "request body must be a JSON object")
        unknown = [f for f in EXTENSION_FIELDS if f in body]
        if str(body.get("model", "")).startswith("strict") and unknown:
            return _json_response(json.dumps({"error": {
                "message": f"Unrecognized request argument supplied: {unknown[0]}",
                "type": "invalid_request_error", "param": None, "code": None}}), 400)
        abort_after = request.headers.get("x-standin-abort-after")
        end_after = request.headers.get("x-standin-end-after")
        delay = float(request.headers.get("x-standin-chunk-delay", self.chunk_delay))
        return body, _Options(delay, int(abort_after) if abort_after else None,
                              int(end_after) if end_after else None, _sglext_asked(body, request.headers))

    @staticmethod
    def _error(path: str, status: int, message: str) -> Response:
        if path.endswith("/messages"):
            body: Json = {"type": "error", "error": {"type": "api_error", "message": message}}
        else:
            body = {"error": {"message": message, "type": "server_error", "code": status}}
        return _json_response(json.dumps(body), status)

    def _model(self, body: Json) -> str:
        return str(body.get("model") or self.model)

    # -- OpenAI chat completions --

    async def _chat(self, request: Request) -> Response:
        parsed = await self._read(request)
        if isinstance(parsed, Response):
            return parsed
        body, options = parsed
        messages = [m for m in body.get("messages") or [] if isinstance(m, dict)]
        if not messages:
            return self._error(request.url.path, 400, "messages must be a non-empty list")
        model = self._model(body)
        # A request's `seed` varies the reply as sampling would, so GRPO rollouts of one prompt differ.
        conversation = [model, messages, *([body["seed"]] if body.get("seed") is not None else [])]
        replies = [make_reply(conversation, i, _tool_names(body.get("tools")),
                              not _ends_with_tool_result(messages),
                              body.get("max_completion_tokens") or body.get("max_tokens"))
                   for i in range(int(body.get("n") or 1))]
        prompt_ids = render_prompt(messages)
        sglang = model.startswith("sglang")
        want_ids = bool(body.get("return_token_ids")) and not sglang
        want_logprobs = bool(body.get("logprobs"))
        sglext_in, sglext_out = options.sglext if sglang else (False, False)
        response_id = f"chatcmpl-{_digest(conversation).hex()[:24]}"
        usage = {"prompt_tokens": len(prompt_ids),
                 "total_tokens": len(prompt_ids) + sum(len(r.token_ids()) for r in replies),
                 "completion_tokens": sum(len(r.token_ids()) for r in replies)}
        if body.get("stream"):
            head = {"id": response_id, "object": "chat.completion.chunk", "created": CREATED, "model": model}
            streams = [self._chat_chunks(head, i, r, prompt_ids, want_ids, want_logprobs)
                       for i, r in enumerate(replies)]
            events = list(_interleave(streams))
            if sglext_in or sglext_out:
                events += [_sse({**head, "choices": [{"index": i, "delta": {}, "finish_reason": None}],
                                 "sglext": _sglext(prompt_ids if sglext_in else None,
                                                   r.token_ids() if sglext_out else None)})
                           for i, r in enumerate(replies)]
            if (body.get("stream_options") or {}).get("include_usage"):
                events.append(_sse({**head, "choices": [], "usage": usage}))
            events.append(_sse("[DONE]"))
            return _EventStream(iter(events), options)
        choices = []
        for i, reply in enumerate(replies):
            ids = reply.token_ids()
            calls = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                     for c in reply.tool_calls]
            refused = reply.finish_reason == "refusal"
            choice: Json = {
                "index": i,
                "message": {"role": "assistant", "content": None if calls or refused else reply.text,
                            "refusal": reply.text if refused else None, "annotations": None, "audio": None,
                            "function_call": None, "tool_calls": calls, "reasoning_content": None},
                "logprobs": {"content": self._chat_logprobs(ids, 0)} if want_logprobs else None,
                "finish_reason": _openai_finish(reply),
                "stop_reason": None,
                "token_ids": ids if want_ids else None,
            }
            if sglext_out:
                choice["sglext"] = _sglext(None, ids)
            choices.append(choice)
        plain: Json = {
            "id": response_id, "object": "chat.completion", "created": CREATED, "model": model,
            "choices": choices, "service_tier": None, "system_fingerprint": None,
            "usage": {**usage, "prompt_tokens_details": None}, "prompt_logprobs": None,
            "prompt_token_ids": prompt_ids if want_ids else None, "kv_transfer_params": None,
        }
        if sglext_in:
            plain["sglext"] = _sglext(prompt_ids, None)
        return _json_response(_dump(plain))

    @staticmethod
    def _chat_logprobs(ids: Sequence[int], start: int) -> list[Json]:
        return [{"token": f"token_id:{t}", "logprob": toy_logprob(t, start + k),
                 "bytes": [t] if t < 256 else [], "top_logprobs": []} for k, t in enumerate(ids)]

    def _chat_chunks(self, head: Json, index: int, reply: Reply, prompt_ids: list[int],
                     want_ids: bool, want_logprobs: bool) -> list[bytes]:
        position = 0

        def chunk(delta: Json, ids: list[int], finish: str | None = None) -> bytes:
            nonlocal position
            choice: Json = {"index": index, "delta": delta,
                            "logprobs": {"content": self._chat_logprobs(ids, position)}
                            if want_logprobs and ids else None,
                            "finish_reason": finish}
            if finish is not None:
                choice["stop_reason"] = None
            if want_ids:
                choice["token_ids"] = ids
            position += len(ids)
            return _sse({**head, "choices": [choice]})

        first: Json = {**head, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                            "logprobs": None, "finish_reason": None}]}
        if want_ids:
            first["prompt_token_ids"] = prompt_ids
        events = [_sse(first)]
        text_key = "refusal" if reply.finish_reason == "refusal" else "content"
        events += [chunk({text_key: piece}, encode(piece)) for piece in reply.pieces]
        for k, call in enumerate(reply.tool_calls):
            half = len(call.arguments) // 2
            events.append(chunk({"tool_calls": [{"index": k, "id": call.id, "type": "function",
                                                 "function": {"name": call.name, "arguments": ""}}]},
                                encode(call.opening())))
            for part in (call.arguments[:half], call.arguments[half:]):
                events.append(chunk({"tool_calls": [{"index": k, "function": {"arguments": part}}]},
                                    encode(part)))
            events.append(chunk({}, encode(TOOL_CLOSE)))
        events.append(chunk({}, [] if reply.finish_reason == "length" else [EOS], _openai_finish(reply)))
        return events

    # -- OpenAI completions --

    async def _completions(self, request: Request) -> Response:
        parsed = await self._read(request)
        if isinstance(parsed, Response):
            return parsed
        body, options = parsed
        prompts = completion_prompts(body.get("prompt"))
        if prompts is None:
            return self._error(request.url.path, 400,
                               "prompt must be a string, token ids, or a list of either")
        model = self._model(body)
        n = int(body.get("n") or 1)
        want_ids = bool(body.get("return_token_ids"))
        logprobs = body.get("logprobs")
        response_id = f"cmpl-{_digest(model, [p for p, _ in prompts]).hex()[:24]}"
        choices = []
        for p_index, (prompt, prompt_ids) in enumerate(prompts):
            for k in range(n):
                reply = make_reply([model, prompt], k, (), False, body.get("max_tokens"))
                choices.append((p_index * n + k, prompt_ids, reply))
        prompt_tokens = sum(len(c[1]) for c in choices[::n])
        completion_tokens = sum(len(c[2].token_ids()) for c in choices)
        usage = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                 "completion_tokens": completion_tokens}
        if body.get("stream"):
            head = {"id": response_id, "object": "text_completion", "created": CREATED, "model": model}
            streams = [self._completion_chunks(head, i, ids, r, want_ids, logprobs is not None)
                       for i, ids, r in choices]
            events = list(_interleave(streams))
            if (body.get("stream_options") or {}).get("include_usage"):
                events.append(_sse({**head, "choices": [], "usage": usage}))
            events.append(_sse("[DONE]"))
            return _EventStream(iter(events), options)
        out = []
        for index, prompt_ids, reply in choices:
            ids = reply.token_ids()
            out.append({"index": index, "text": reply.text,
                        "logprobs": self._completion_logprobs(ids, 0) if logprobs is not None else None,
                        "finish_reason": reply.finish_reason, "stop_reason": None, "prompt_logprobs": None,
                        "prompt_token_ids": prompt_ids if want_ids else None,
                        "token_ids": ids if want_ids else None})
        return _json_response(_dump({
            "id": response_id, "object": "text_completion", "created": CREATED, "model": model,
            "choices": out, "service_tier": None, "system_fingerprint": None, "usage": usage,
            "kv_transfer_params": None,
        }))

    @staticmethod
    def _completion_logprobs(ids: Sequence[int], start: int) -> Json:
        return {"text_offset": list(range(start, start + len(ids))),
                "token_logprobs": [toy_logprob(t, start + k) for k, t in enumerate(ids)],
                "tokens": [f"token_id:{t}" for t in ids],
                "top_logprobs": [{} for _ in ids]}

    def _completion_chunks(self, head: Json, index: int, prompt_ids: list[int], reply: Reply, want_ids: bool,
                           want_logprobs: bool) -> list[bytes]:
        events = []
        position = 0
        pieces: list[tuple[str, list[int], str | None]] = [
            (piece, encode(piece), None) for piece in reply.pieces]
        pieces.append(("", [] if reply.finish_reason == "length" else [EOS], reply.finish_reason))
        for n, (text, ids, finish) in enumerate(pieces):
            choice: Json = {"index": index, "text": text,
                            "logprobs": self._completion_logprobs(ids, position) if want_logprobs else None,
                            "finish_reason": finish}
            if want_ids:
                if n == 0:
                    choice["prompt_token_ids"] = prompt_ids
                choice["token_ids"] = ids
            position += len(ids)
            events.append(_sse({**head, "choices": [choice]}))
        return events

    # -- OpenAI Responses API --

    async def _responses(self, request: Request) -> Response:
        parsed = await self._read(request)
        if isinstance(parsed, Response):
            return parsed
        body, options = parsed
        messages = _responses_messages(body)
        if not messages:
            return self._error(request.url.path, 400, "input must not be empty")
        model = self._model(body)
        conversation = [model, messages]
        if body.get("previous_response_id"):  # a continuation answers (and is named) apart from a new input
            conversation.append(body["previous_response_id"])
        reply = make_reply(conversation, 0, _tool_names(body.get("tools")),
                           not _ends_with_tool_result(messages), body.get("max_output_tokens"))
        tag = _digest(conversation).hex()[:24]
        items: list[Json] = [{"id": f"fc_{tag}", "type": "function_call", "status": "completed",
                              "call_id": c.id, "name": c.name, "arguments": c.arguments}
                             for c in reply.tool_calls]
        if not reply.tool_calls:
            items = [{"id": f"msg_{tag}", "type": "message", "status": "completed", "role": "assistant",
                      "content": [{"type": "output_text", "text": reply.text, "annotations": []}]}]
        prompt_len = len(render_prompt(messages))
        truncated = reply.finish_reason == "length"
        final = {"id": f"resp_{tag}", "object": "response", "created_at": CREATED,
                 "status": "incomplete" if truncated else "completed",
                 "error": None,
                 "incomplete_details": {"reason": "max_output_tokens"} if truncated else None,
                 "instructions": body.get("instructions"), "model": model, "output": items,
                 "parallel_tool_calls": True, "tool_choice": "auto", "tools": body.get("tools") or [],
                 "text": {"format": {"type": "text"}}, "temperature": 1.0, "top_p": 1.0, "metadata": {},
                 "usage": {"input_tokens": prompt_len, "input_tokens_details": {"cached_tokens": 0},
                           "output_tokens": len(reply.token_ids()),
                           "output_tokens_details": {"reasoning_tokens": 0},
                           "total_tokens": prompt_len + len(reply.token_ids())}}
        if not body.get("stream"):
            return _json_response(_dump(final))
        return _EventStream(self._response_events(final, reply), options)

    @staticmethod
    def _response_events(final: Json, reply: Reply) -> Iterator[bytes]:
        sequence = 0

        def event(kind: str, **data: Any) -> bytes:
            nonlocal sequence
            sequence += 1
            return _sse({"type": kind, "sequence_number": sequence - 1, **data}, kind)

        started = {**final, "status": "in_progress", "output": [], "usage": None}
        yield event("response.created", response=started)
        yield event("response.in_progress", response=started)
        for index, item in enumerate(final["output"]):
            if item["type"] == "function_call":
                yield event("response.output_item.added", output_index=index,
                            item={**item, "arguments": "", "status": "in_progress"})
                half = len(item["arguments"]) // 2
                for part in (item["arguments"][:half], item["arguments"][half:]):
                    yield event("response.function_call_arguments.delta", item_id=item["id"],
                                output_index=index, delta=part)
                yield event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                            arguments=item["arguments"])
            else:
                yield event("response.output_item.added", output_index=index,
                            item={**item, "status": "in_progress", "content": []})
                part = {"type": "output_text", "text": "", "annotations": []}
                yield event("response.content_part.added", item_id=item["id"], output_index=index,
                            content_index=0, part=part)
                for piece in reply.pieces:
                    yield event("response.output_text.delta", item_id=item["id"], output_index=index,
                                content_index=0, delta=piece, logprobs=[])
                yield event("response.output_text.done", item_id=item["id"], output_index=index,
                            content_index=0, text=reply.text, logprobs=[])
                yield event("response.content_part.done", item_id=item["id"], output_index=index,
                            content_index=0, part={**part, "text": reply.text})
            yield event("response.output_item.done", output_index=index, item=item)
        yield event("response.completed" if final["status"] == "completed" else "response.incomplete",
                    response=final)

    # -- Anthropic messages --

    async def _messages(self, request: Request) -> Response:
        parsed = await self._read(request)
        if isinstance(parsed, Response):
            return parsed
        body, options = parsed
        messages = _anthropic_messages(body)
        if not body.get("messages"):
            return self._error(request.url.path, 400, "messages: field required")
        if not isinstance(body.get("max_tokens"), int):
            return self._error(request.url.path, 400, "max_tokens: field required")
        model = self._model(body)
        conversation = [model, messages]
        reply = make_reply(conversation, 0, _tool_names(body.get("tools")),
                           not _ends_with_tool_result(messages), body["max_tokens"])
        tag = _digest(conversation).hex()[:24]
        content: list[Json] = [{"type": "tool_use", "id": f"toolu_{c.id[5:]}", "name": c.name,
                                "input": json.loads(c.arguments)} for c in reply.tool_calls]
        if not reply.tool_calls:
            content = [{"type": "text", "text": reply.text}]
        stop = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens",
                "refusal": "refusal"}[reply.finish_reason]
        usage = {"input_tokens": len(render_prompt(messages)), "output_tokens": len(reply.token_ids())}
        final = {"id": f"msg_{tag}", "type": "message", "role": "assistant", "model": model,
                 "content": content, "stop_reason": stop, "stop_sequence": None, "usage": usage}
        if not body.get("stream"):
            return _json_response(_dump(final))
        return _EventStream(self._message_events(final, reply), options)

    @staticmethod
    def _message_events(final: Json, reply: Reply) -> Iterator[bytes]:
        usage = final["usage"]
        start = {**final, "content": [], "stop_reason": None,
                 "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1}}
        yield _sse({"type": "message_start", "message": start}, "message_start")
        for index, block in enumerate(final["content"]):
            if block["type"] == "tool_use":
                yield _sse({"type": "content_block_start", "index": index,
                            "content_block": {**block, "input": {}}}, "content_block_start")
                arguments = _dump(block["input"])
                half = len(arguments) // 2
                for part in (arguments[:half], arguments[half:]):
                    delta = {"type": "input_json_delta", "partial_json": part}
                    yield _sse({"type": "content_block_delta", "index": index, "delta": delta},
                               "content_block_delta")
            else:
                yield _sse({"type": "content_block_start", "index": index,
                            "content_block": {"type": "text", "text": ""}}, "content_block_start")
                yield _sse({"type": "ping"}, "ping")
                for piece in reply.pieces:
                    yield _sse({"type": "content_block_delta", "index": index,
                                "delta": {"type": "text_delta", "text": piece}}, "content_block_delta")
            yield _sse({"type": "content_block_stop", "index": index}, "content_block_stop")
        stop = {"stop_reason": final["stop_reason"], "stop_sequence": None}
        output = {"output_tokens": usage["output_tokens"]}
        yield _sse({"type": "message_delta", "delta": stop, "usage": output}, "message_delta")
        yield _sse({"type": "message_stop"}, "message_stop")

    async def _models(self, request: Request) -> Response:
        self._receive(request, b"")
        return _json_response(json.dumps({"object": "list", "data": [
            {"id": self.model, "object": "model", "created": CREATED, "owned_by": "clawr1-standin"}]}))

    async def _health(self, _request: Request) -> Response:
        return Response(status_code=200)


def _ssl_context(certfile: str | None, keyfile: str | None) -> ssl.SSLContext | None:
    if not certfile:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(certfile, keyfile)
    return context


async def serve_async(host: str, port: int, *, chunk_delay: float = 0.0, model: str = DEFAULT_MODEL,
                      certfile: str | None = None, keyfile: str | None = None,
                      ready: Callable[[int], None] | None = None, stop: asyncio.Event | None = None) -> None:
    engine = StandinEngine(model=model, chunk_delay=chunk_delay)
    bound = await engine.start(host, port, _ssl_context(certfile, keyfile))
    if ready is not None:
        ready(bound)
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await engine.stop()


def serve(host: str = "127.0.0.1", port: int = 8000, *, chunk_delay: float = 0.0, model: str = DEFAULT_MODEL,
          certfile: str | None = None, keyfile: str | None = None) -> None:
    """Blocking; stops cleanly on SIGINT/SIGTERM. Prints the URL once listening."""

    async def main() -> None:
        stop = stop_loop_on_signals()
        scheme = "https" if certfile else "http"
        await serve_async(host, port, chunk_delay=chunk_delay, model=model, certfile=certfile,
                          keyfile=keyfile, stop=stop,
                          ready=lambda p: print(f"stand-in engine on {scheme}://{host}:{p}/v1", flush=True))

    asyncio.run(main())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Stand-in LLM engine (OpenAI, vLLM token ids, Anthropic).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--chunk-delay", type=float, default=0.0, help="seconds between stream events")
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--certfile", help="serve HTTPS with this certificate (PEM)")
    parser.add_argument("--keyfile", help="private key of --certfile")
    args = parser.parse_args(argv)
    serve(args.host, args.port, chunk_delay=args.chunk_delay, model=args.model, certfile=args.certfile,
          keyfile=args.keyfile)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
