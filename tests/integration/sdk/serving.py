"""Serve an ASGI app with hypercorn on a free loopback port in a background thread (tests, bench).

In-process on purpose: the embedded chDB pool belongs to one process, so the API that serves it
must run in the process that holds it, as ``clawr1 up`` runs it.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fastapi import FastAPI
from hypercorn.asyncio import serve
from hypercorn.config import Config

from bench.common import free_port


@contextmanager
def served(app: FastAPI) -> Iterator[str]:
    """Serve ``app`` with hypercorn on a free loopback port in a thread; yields its base URL."""
    port = free_port()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    server = serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]
    thread = threading.Thread(target=loop.run_until_complete, args=(server,), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"hypercorn did not start listening on port {port}") from None
            time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(timeout=15)
        loop.close()
