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
import json
import socket
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
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
from clawr1.demo.standin import chat, completions, messages, responses
from clawr1.demo.standin.toy import CREATED, DEFAULT_MODEL, EXTENSION_FIELDS, Answer, BadRequest, Json


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
            Route("/v1/chat/completions", self._endpoint(
                lambda body, model, options: chat.answer(body, model, options.sglext)), methods=["POST"]),
            Route("/v1/completions", self._endpoint(
                lambda body, model, _: completions.answer(body, model)), methods=["POST"]),
            Route("/v1/responses", self._endpoint(
                lambda body, model, _: responses.answer(body, model)), methods=["POST"]),
            Route("/v1/messages", self._endpoint(
                lambda body, model, _: messages.answer(body, model)), methods=["POST"]),
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

    def _endpoint(self, answer: Callable[[Json, str, _Options], Answer]
                  ) -> Callable[[Request], Awaitable[Response]]:
        """An API's route: the request read (test hooks, strict models), answered by ``answer``
        (body, model, options), as JSON or as an SSE stream."""

        async def endpoint(request: Request) -> Response:
            parsed = await self._read(request)
            if isinstance(parsed, Response):
                return parsed
            body, options = parsed
            try:
                out = answer(body, self._model(body), options)
            except BadRequest as error:
                return self._error(request.url.path, 400, str(error))
            return _json_response(out) if isinstance(out, str) else _EventStream(out, options)

        return endpoint

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
