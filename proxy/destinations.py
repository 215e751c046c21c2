"""Where the explicit proxy may connect: an allow-list, and never a machine of the stack itself.

An agent allowed to use the explicit proxy must not reach what stands behind it: Kafka's broker and
controller ports (forged calls, deleted topics), the API without its key checks' context, ClickHouse,
the proxy itself. A list of our own ports always misses one (the controller port did), so the rule
is the other way round (docs/security.md):

1. A destination's addresses are what counts, never its spelling: ``127.1``, ``0x7f000001``,
   ``2130706433``, ``[::ffff:127.0.0.1]``, ``localhost.`` and a name that resolves here all end as
   an address; an address of this machine (loopback, unspecified, any interface's) or of a host the
   stack's own services run on (the Kafka bootstrap servers, a ClickHouse server, a schema registry)
   is a *stack address*.
2. A stack address is refused unless the very ``(address, port)`` is a configured upstream
   (``CLAWR1_UPSTREAM``'s engines) or a ``host:port`` entry of ``CLAWR1_PROXY_ALLOW``.
3. Every destination must match an entry of ``CLAWR1_PROXY_ALLOW``: ``*`` (the default: any host
   that is no stack address, so agents calling public LLM APIs keep working), ``name``,
   ``*.domain`` (its subdomains) or ``host:port``; the upstreams always match.

``Destinations.refusal`` decides for a host name as the agent wrote it (for a 403 with the reason);
``Destinations.allowed_address`` decides for one resolved address, and is what the connection itself
is held to (``clawr1.proxy.addons.destinations``), so a name that resolves elsewhere a moment later
(DNS rebinding) gains nothing.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]
ANY = "*"
_LOOPBACK = ipaddress.IPv4Address("127.0.0.1")
# Service hosts and upstreams are resolved again after this long (their addresses may move).
RESOLVE_TTL_S = 30.0


class DestinationError(ValueError):
    """``CLAWR1_PROXY_ALLOW`` is malformed; the message names the entry."""


def normalize_host(host: str) -> str:
    """Lower case, without brackets or trailing dots (``[::1]`` is ``::1``, ``Localhost.`` ``localhost``)."""
    return host.strip().strip("[]").rstrip(".").lower()


def address_of(host: str) -> Address | None:
    """``host`` as an address when it is written as one in canonical form, else None."""
    try:
        address = ipaddress.ip_address(normalize_host(host).split("%", 1)[0])
    except ValueError:
        return None
    return _unmapped(address)


def _unmapped(address: Address) -> Address:
    """``::ffff:127.0.0.1`` reaches 127.0.0.1: an IPv4-mapped address counts as its IPv4 address."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to, the way the connection would resolve it (``127.1``,
    ``0x7f000001`` and decimal forms included); empty when it does not resolve."""
    try:
        infos = socket.getaddrinfo(normalize_host(host), port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_this_machine(address: Address) -> bool:
    """Loopback, unspecified (``0.0.0.0`` reaches this machine) or an address one of its interfaces
    holds: only then can a socket bind to it, which asks the kernel rather than a list of interfaces."""
    address = _unmapped(address)
    if address.is_loopback or address.is_unspecified:
        return True
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(address), 0))
    except OSError:
        return False
    return True


@dataclass(frozen=True)
class Entry:
    """One ``CLAWR1_PROXY_ALLOW`` entry: ``*``, ``name``, ``*.domain`` or any of them with ``:port``."""

    host: str
    port: int | None = None

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.host == ANY:
            return True
        if self.host.startswith("*."):
            return host.endswith(self.host[1:])
        wanted = address_of(self.host)
        return wanted == address_of(host) if wanted is not None else host == self.host


def parse_entry(text: str) -> Entry:
    """``api.openai.com``, ``*.openai.com``, ``10.0.0.5:8000``, ``[::1]:8000`` or ``*``."""
    raw = text.strip()
    host, port = raw, None
    if "/" in raw:
        raise DestinationError(f"CLAWR1_PROXY_ALLOW entry {raw!r}: expected host, *.domain, host:port or *")
    if raw.startswith("["):
        host, _, rest = raw[1:].partition("]")
        if rest:
            port = _port(raw, rest.removeprefix(":"))
    elif raw.count(":") == 1:
        host, _, number = raw.partition(":")
        port = _port(raw, number)
    host = normalize_host(host)
    if not host or (host != ANY and (any(c in host for c in "/@?#% ") or "*" in host.removeprefix("*."))):
        raise DestinationError(f"CLAWR1_PROXY_ALLOW entry {raw!r}: expected host, *.domain, host:port or *")
    address = address_of(host)
    if port is None and (host == "localhost" or host.endswith(".localhost")
                         or (address is not None and is_this_machine(address))):
        raise DestinationError(f"CLAWR1_PROXY_ALLOW entry {raw!r} names this machine without a port: name "
                               "the one port the proxy may reach there (host:port), never all of them")
    return Entry(host, port)


def _port(entry: str, number: str) -> int:
    if not number.isdigit() or not 0 < int(number) < 65536:
        raise DestinationError(f"CLAWR1_PROXY_ALLOW entry {entry!r}: the port must be 1 to 65535")
    return int(number)


def parse_allow(spec: str) -> tuple[Entry, ...]:
    """The entries of ``CLAWR1_PROXY_ALLOW`` (comma-separated); empty means ``*``."""
    entries = tuple(parse_entry(part) for part in spec.split(",") if part.strip())
    return entries or (Entry(ANY),)


def url_endpoint(url: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``http(s)://host[:port]`` (or ``host:port``), None for anything else."""
    try:
        parts = urlsplit(url if "://" in url else f"tcp://{url}")
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    default = {"https": 443, "http": 80}.get(parts.scheme)
    return (parts.hostname, port) if port is not None else (parts.hostname, default) if default else None


@dataclass
class _Resolved:
    """Addresses of a fixed set of endpoints, resolved when first needed and again after the TTL."""

    endpoints: tuple[tuple[str, int], ...]
    resolver: Resolver
    _pairs: frozenset[tuple[Address, int]] = frozenset()
    _at: float = -RESOLVE_TTL_S

    def pairs(self) -> frozenset[tuple[Address, int]]:
        if time.monotonic() - self._at >= RESOLVE_TTL_S:
            found: set[tuple[Address, int]] = set()
            for host, port in self.endpoints:
                literal = address_of(host)
                addresses = [literal] if literal is not None else \
                    [a for a in map(address_of, self.resolver(host, port)) if a is not None]
                found.update((address, port) for address in addresses)
            self._pairs, self._at = frozenset(found), time.monotonic()
        return self._pairs


@dataclass
class Destinations:
    """The rule above over ``entries`` (``CLAWR1_PROXY_ALLOW``), ``upstreams`` (always allowed, by
    address and port) and ``service_hosts`` (the stack's other machines, refused on every port)."""

    entries: tuple[Entry, ...] = (Entry(ANY),)
    upstreams: tuple[tuple[str, int], ...] = ()
    service_hosts: tuple[str, ...] = ()
    resolver: Resolver = resolve
    _exceptions: _Resolved = field(init=False)
    _services: _Resolved = field(init=False)

    def __post_init__(self) -> None:
        named = tuple((e.host, e.port) for e in self.entries
                      if e.port is not None and not e.host.startswith("*"))
        self._exceptions = _Resolved((*self.upstreams, *named), self.resolver)
        # Any port will do: only the addresses are used.
        self._services = _Resolved(tuple((host, 0) for host in self.service_hosts), self.resolver)

    def is_stack_address(self, address: Address) -> bool:
        address = _unmapped(address)
        return is_this_machine(address) or any(address == a for a, _ in self._services.pairs())

    def allowed_address(self, address: Address, port: int) -> bool:
        """Whether a connection to ``address:port`` may be opened: no stack address, or an exception."""
        address = _unmapped(address)
        return not self.is_stack_address(address) or (address, port) in self._exceptions.pairs()

    def _listed(self, host: str, port: int) -> bool:
        return any((host, port) == (normalize_host(h), p) for h, p in self.upstreams) or \
            any(entry.matches(host, port) for entry in self.entries)

    def refusal(self, host: str, port: int) -> str | None:
        """Why the proxy refuses to connect to ``host:port``, or None when it may (resolves ``host``)."""
        name = normalize_host(host)
        literal = address_of(name)
        addresses = [literal] if literal is not None else \
            [a for a in map(address_of, self.resolver(name, port)) if a is not None]
        if name == "localhost" or name.endswith(".localhost"):  # loopback by definition (RFC 6761)
            addresses += [_LOOPBACK]
        if addresses and not any(self.allowed_address(a, port) for a in addresses):
            shown = ", ".join(map(str, addresses[:4]))
            return (f"refusing to relay to {host}:{port}: {shown} is a machine of the Claw-R1 stack itself "
                    "(this host, Kafka, ClickHouse) and not a configured upstream (CLAWR1_UPSTREAM, or a "
                    "host:port entry of CLAWR1_PROXY_ALLOW)")
        if not self._listed(name, port) and not any((a, port) in self._exceptions.pairs() for a in addresses):
            return f"refusing to relay to {host}:{port}: not in CLAWR1_PROXY_ALLOW"
        return None


def service_hosts(endpoints: Iterable[str]) -> tuple[str, ...]:
    """The host names of the stack's service endpoints (``host:port`` or URLs), each once."""
    hosts = []
    for endpoint in endpoints:
        parsed = url_endpoint(endpoint.strip()) if endpoint.strip() else None
        if parsed is not None:
            hosts.append(normalize_host(parsed[0]))
    return tuple(dict.fromkeys(hosts))
