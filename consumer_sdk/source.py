"""Telling a Claw-R1 API URL from a ClickHouse DSN.

A consumer reads the pool one of two ways:

* ``api``: through the running stack's HTTP API (``http://host:port`` or ``https://``). This is the
  only way to reach the embedded chDB pool from another process, since chDB locks its data
  directory to the process that owns it.
* ``direct``: straight to ClickHouse with clickhouse-connect, for a ClickHouse server
  (``clickhouse://``, ``clickhouse+http://``, ``clickhouse+https://``) or an embedded pool this
  process owns (``chdb:///abs/path``).

A bare ``http(s)://`` URL means the API, because that is what a trainer is handed by ``clawr1 up``.
A ClickHouse server DSN spelled ``http(s)://`` (e.g. the stack's own ``CLAWR1_CLICKHOUSE_DSN``)
is read directly by passing ``transport="direct"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from clawr1.consumer_sdk.errors import InvalidSource

TransportKind = Literal["api", "direct"]

_API_SCHEMES = {"http", "https"}
_CLICKHOUSE_SCHEMES = {
    "clickhouse": "http",
    "clickhouse+http": "http",
    "clickhouse+https": "https",
    "clickhouses": "https",
}


@dataclass(frozen=True)
class Source:
    """Where a consumer reads: ``kind`` and the URL that kind's client takes."""

    kind: TransportKind
    url: str
    """API base URL without a trailing slash, or a DSN clickhouse-connect accepts."""


def parse_source(source: str, transport: TransportKind | None = None) -> Source:
    """Resolve ``source`` (and an optional explicit ``transport``) to a :class:`Source`."""
    if not isinstance(source, str) or not source.strip():
        raise InvalidSource(f"source must be a non-empty URL or DSN, got {source!r}")
    if transport not in (None, "api", "direct"):
        raise InvalidSource(f"transport must be 'api' or 'direct', got {transport!r}")
    parts = urlsplit(source.strip())
    scheme = parts.scheme.lower()
    if scheme == "chdb":
        if transport == "api":
            raise InvalidSource("a chdb:// DSN is read in-process; it has no API (use transport='direct')")
        return Source("direct", source.strip())
    if scheme in _CLICKHOUSE_SCHEMES:
        if transport == "api":
            raise InvalidSource(f"{scheme}:// names a ClickHouse server, not the Claw-R1 API")
        return Source("direct", urlunsplit(parts._replace(scheme=_CLICKHOUSE_SCHEMES[scheme])))
    if scheme in _API_SCHEMES:
        if not parts.hostname:
            raise InvalidSource(f"source {source!r} has no host")
        if transport == "direct":
            return Source("direct", source.strip())
        return Source("api", source.strip().rstrip("/"))
    raise InvalidSource(
        f"unsupported source scheme {parts.scheme!r} in {source!r}: use http(s):// for the Claw-R1 API, "
        "chdb:///abs/path or clickhouse[+http|+https]://host:port/db for direct ClickHouse reads"
    )
