"""Serve the API app with hypercorn (uvicorn saved a fifth of the CPU per request and no requests/s;
see docs/gateway.md).

Without API keys anyone who can reach the port could write training data, so an app without keys
is only served on a loopback address.
"""

from __future__ import annotations

import asyncio
import ipaddress

from fastapi import FastAPI
from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config


class InsecureBindError(RuntimeError):
    """Refusing to serve without API keys on an address other machines can reach."""


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, keys_enabled: bool) -> None:
    if not keys_enabled and not is_loopback(host):
        raise InsecureBindError(
            f"refusing to serve the API on {host!r} without API keys: set CLAWR1_API_KEYS "
            "(name:key entries) or bind to 127.0.0.1")


def bind_address(host: str, port: int) -> str:
    return f"[{host.strip('[]')}]:{port}" if ":" in host.strip("[]") else f"{host}:{port}"


async def serve(app: FastAPI, host: str, port: int, shutdown_event: asyncio.Event, *,
                access_log: bool = False, graceful_timeout_s: float = 10.0) -> None:
    """Run until ``shutdown_event`` is set; in-flight requests get ``graceful_timeout_s`` to finish."""
    check_bind(host, app.state.gateway.keys.enabled)
    config = Config()
    config.bind = [bind_address(host, port)]
    config.accesslog = "-" if access_log else None
    config.graceful_timeout = graceful_timeout_s
    await hypercorn_serve(app, config, shutdown_trigger=shutdown_event.wait)  # type: ignore[arg-type]
