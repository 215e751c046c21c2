"""The one way the tests serve an ASGI app over real HTTP: hypercorn, as the stack's API serves it, on a
loopback port, on an event loop of its own in a thread.

In-process on purpose: the embedded chDB pool belongs to one process, so the API that serves it must run
in the process that holds it, as ``clawr1 up`` runs it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
from hypercorn.asyncio import serve
from hypercorn.config import Config

from tests.support.ports import free_port
from tests.support.waiting import wait_until

# As the API process (clawr1.gateway.server.serve): in-flight requests get this long on the way out.
GRACEFUL_TIMEOUT_S = 10.0


class AsgiServer:
    """``app`` on ``host:port`` (a free port by default) once started; ``stop`` shuts it down gracefully."""

    def __init__(self, app: Any, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.app, self.host, self.port = app, host, port or free_port()
        self.url = f"http://{host}:{self.port}"
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._shutdown: asyncio.Event | None = None
        self._running = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"asgi-{self.port}", daemon=True)

    def _run(self) -> None:
        config = Config()
        config.bind = [f"{self.host}:{self.port}"]
        config.accesslog = None
        config.graceful_timeout = GRACEFUL_TIMEOUT_S

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._shutdown = asyncio.Event()
            self._running.set()
            await serve(self.app, config, shutdown_trigger=self._shutdown.wait)  # type: ignore[arg-type]

        try:
            asyncio.run(main())
        except BaseException as exc:  # noqa: BLE001 - surfaced to the test by wait_listening()
            self.error = exc
            self._running.set()

    def start(self) -> AsgiServer:
        """Start serving in the background (returns once its event loop runs)."""
        self._thread.start()
        self._running.wait(10)
        return self

    def wait_listening(self, timeout: float = 20.0) -> AsgiServer:
        """Until the app answers HTTP (any status); raises the server's own error if it failed."""

        def answers() -> bool:
            if self.error is not None:
                raise RuntimeError(f"the server on port {self.port} failed: {self.error!r}") from self.error
            try:
                httpx.get(self.url, timeout=1.0)
            except httpx.TransportError:
                return False
            return True

        wait_until(answers, timeout, message=f"nothing answered HTTP on port {self.port}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._shutdown is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._shutdown.set)
        if self._thread.ident is not None:
            self._thread.join(30)
        assert not self._thread.is_alive(), f"the server on port {self.port} did not stop"


@contextmanager
def serve_asgi(app: Any, port: int | None = None) -> Iterator[AsgiServer]:
    """``app`` served on a free loopback port (or ``port``) while the block runs; ``.url`` is its base URL."""
    server = AsgiServer(app, port).start()
    try:
        yield server.wait_listening()
    finally:
        server.stop()
