"""The explicit proxy never relays to the stack's own services on this host.

Any agent allowed to use the explicit proxy could otherwise ``CONNECT 127.0.0.1:9092`` and speak
Kafka's protocol to the broker (produce forged calls, read every topic), reach the loopback API
without its key checks' context, or loop the proxy into itself. Requests (``CONNECT`` or plain
``GET http://...``) to a port of the stack (``stack_ports``) on a local address get a 403 saying why.
A name is resolved only when its port is one of those, so other traffic pays nothing.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from urllib.parse import urlsplit

from mitmproxy import http
from mitmproxy.proxy.mode_specs import RegularMode

from clawr1.core.settings import Settings


def stack_ports(settings: Settings) -> frozenset[int]:
    """Kafka (the bootstrap's ports, or the local broker's), the API, the proxy's own ports and a
    ClickHouse server's port when the pool is one."""
    ports = {settings.kafka_port, settings.api_port, settings.proxy_port, settings.reverse_port}
    for server in settings.bootstrap_servers.split(","):
        if server.rpartition(":")[2].isdigit():
            ports.add(int(server.rpartition(":")[2]))
    if not settings.is_embedded_pool:
        ports.add(urlsplit(settings.pool_dsn).port or 8123)
    return frozenset(p for p in ports if p)


def _binds_here(address: str) -> bool:
    """True when ``address`` belongs to this host (loopback, unspecified or one of its interfaces):
    only then can a socket bind to it."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((address, 0))
    except OSError:
        return False
    return True


def _is_this_host(host: str) -> bool:
    name = host.strip("[]").rstrip(".").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        addresses = [str(ipaddress.ip_address(name))]
    except ValueError:
        try:
            # An IP family's address is a str (the stubs allow an int for other families).
            addresses = list({str(info[4][0])
                              for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)})
        except OSError:
            return False  # unresolvable: the connection fails on its own
    return any(_binds_here(address) for address in addresses)


class StackPortsGuard:
    def __init__(self, ports: frozenset[int]) -> None:
        self.ports = ports

    async def _refuse_own(self, flow: http.HTTPFlow) -> None:
        if flow.response is not None or not isinstance(flow.client_conn.proxy_mode, RegularMode):
            return
        host, port = flow.request.host, flow.request.port
        if port in self.ports and await asyncio.to_thread(_is_this_host, host):
            flow.response = http.Response.make(
                403,
                f"clawr1 proxy: refusing to relay to {host}:{port}, a port of the Claw-R1 stack itself "
                "(Kafka, the API or this proxy) on this host\n",
                {"Content-Type": "text/plain; charset=utf-8"},
            )

    async def http_connect(self, flow: http.HTTPFlow) -> None:
        await self._refuse_own(flow)

    async def request(self, flow: http.HTTPFlow) -> None:
        await self._refuse_own(flow)
