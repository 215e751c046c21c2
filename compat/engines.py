"""The serving engines behind ``/generate``: ``CLAWR1_UPSTREAM`` (one origin, or several comma-separated),
called round-robin; an engine that cannot be reached is skipped for the next one, once around."""

from __future__ import annotations

import itertools
from typing import Any
from urllib.parse import urlsplit

import httpx


class NoEngine(RuntimeError):
    """No engine is configured (HTTP 503)."""


class EngineFailed(RuntimeError):
    """No engine gave a usable answer: none reachable, or a body that is not JSON (HTTP 502)."""


class EngineRefused(RuntimeError):
    """The engine answered with an error status; the seed passes it through as it is."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"engine error {status}: {body}")
        self.status = status


def parse_engines(upstream: str) -> list[str]:
    """The engine origins in ``upstream`` (``ValueError`` names one that is not an http(s) origin)."""
    engines = []
    for item in (part.strip() for part in upstream.split(",")):
        if not item:
            continue
        parts = urlsplit(item if "://" in item else f"http://{item}")
        if parts.scheme not in {"http", "https"} or not parts.hostname or parts.path not in {"", "/"}:
            raise ValueError(f"CLAWR1_UPSTREAM: {item!r} is not an http(s)://host[:port] origin")
        engines.append(f"{parts.scheme}://{parts.netloc}")
    return engines


class Engines:
    def __init__(self, origins: list[str], client: httpx.AsyncClient) -> None:
        self.origins = origins
        self._next = itertools.cycle(origins) if origins else None
        self._client = client

    async def complete(self, payload: dict[str, Any]) -> Any:
        """POST ``/v1/completions`` to the next engine and return its JSON answer."""
        if self._next is None:
            raise NoEngine("no serving engine is configured: set CLAWR1_UPSTREAM "
                           "(comma-separated for several)")
        failures = []
        for _ in self.origins:
            origin = next(self._next)
            try:
                reply = await self._client.post(f"{origin}/v1/completions", json=payload)
            except httpx.TransportError as exc:
                failures.append(f"{origin}: {exc!r}")
                continue
            if reply.status_code >= 400:
                raise EngineRefused(reply.status_code, reply.text[:2000])
            try:
                return reply.json()
            except ValueError as exc:
                raise EngineFailed(f"{origin} answered with a body that is not JSON") from exc
        raise EngineFailed("no engine could be reached: " + "; ".join(failures))
