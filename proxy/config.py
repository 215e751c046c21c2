"""What the capture proxy reads from ``Settings``: its mitmproxy modes, checked for safety, and where
it sends what it captures.

Role-specific knobs (``CLAWR1_PROXY_*``, ``CLAWR1_UPSTREAM_*``) are declared, with their defaults and
checks, in ``clawr1/core/registry.py`` and read with ``Settings.role_setting`` (see docs/proxy.md).
It refuses to be an open proxy: a non-loopback address needs proxy auth.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from clawr1.core.registry import (
    MAX_LAG_S,
    PROXY_ALLOW,
    PROXY_BATCH_CALLS,
    PROXY_BATCH_MS,
    PROXY_INSTANCE,
    PROXY_PROCESSES,
    PROXY_THIN_BATCH_CALLS,
    PROXY_THIN_BATCH_MS,
    STREAMS_APP_ID,
    UPSTREAM_CA_FILE,
    UPSTREAM_INSECURE,
)
from clawr1.core.relay_source import relay_secret
from clawr1.core.settings import Settings
from clawr1.core.thin_batch import NEVER, ThinWait
from clawr1.gateway.auth import ApiKeyError, KeyRing, parse_api_keys
from clawr1.proxy import engine_files, mitm_compat
from clawr1.proxy.destinations import (
    DestinationError,
    Destinations,
    parse_allow,
    service_hosts,
    url_endpoint,
)

CA_BASENAME = "mitmproxy"
CA_KEY_SIZE = 2048
# The variables' names, for tests that set them in ``Settings.extra``.
UPSTREAM_CA_ENV = UPSTREAM_CA_FILE.name
UPSTREAM_INSECURE_ENV = UPSTREAM_INSECURE.name
INSTANCE_ENV = PROXY_INSTANCE.name
PROCESSES_ENV = PROXY_PROCESSES.name


class ProxyStartError(RuntimeError):
    """The proxy cannot start as configured; the message says what to change."""


@dataclass(frozen=True)
class ProxyConfig:
    modes: tuple[str, ...]
    confdir: Path
    spool_dir: Path
    proxyauth: str | None
    upstream_ca: str | None
    upstream_insecure: bool
    capture_token_ids: bool
    # Upstreams that get token-id fields (``TokenIdPolicy.parse``), when capture_token_ids is on.
    token_id_hosts: str
    bootstrap: str
    partitions: int
    registry_url: str
    instance: str
    # Where the explicit proxy may connect (never the stack's own machines but for its upstreams).
    destinations: Destinations = field(default_factory=Destinations)
    # Checks the compat port's seal on the calling key's name (clawr1.core.relay_source).
    relay_secret: bytes = field(default=b"", repr=False)
    # The proxy's Prometheus metrics, served by its emitter process; 0 = off.
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    # Proxy processes sharing the ports (SO_REUSEPORT), and how the emitter batches their calls.
    processes: int = 1
    batch_s: float = 0.0
    batch_calls: int = 1
    thin: ThinWait = NEVER
    # Backpressure: captures stay spooled while the worker's group is this far behind (0: never).
    max_lag_s: float = MAX_LAG_S.default
    streams_group: str = STREAMS_APP_ID.default
    # The reverse port's engines (``CLAWR1_UPSTREAM``), and the keys its engine routes check.
    engines: tuple[str, ...] = ()
    keys: KeyRing = field(default_factory=KeyRing, repr=False)
    # Where the proxy's processes share the engine table (``clawr1.proxy.engine_files``).
    engines_dir: Path | None = None


def confdir(settings: Settings) -> Path:
    return (settings.data_dir / "mitmproxy").resolve()


def ca_cert_path(settings: Settings) -> Path:
    """The CA agents must trust for HTTPS interception (created on first use, one per data dir)."""
    directory = confdir(settings)
    mitm_compat.ca_store(directory, CA_BASENAME, CA_KEY_SIZE)
    return directory / f"{CA_BASENAME}-ca-cert.pem"


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _upstream_origin(upstream: str) -> str:
    parts = urlsplit(upstream)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise ProxyStartError(f"upstream must be http(s)://host[:port], got {upstream!r}")
    if parts.path not in {"", "/"} or parts.query:
        raise ProxyStartError(
            f"upstream must be an origin without a path, got {upstream!r}: the agent's base URL carries "
            "the path (e.g. OPENAI_BASE_URL=http://127.0.0.1:8081/v1)"
        )
    return f"{parts.scheme}://{parts.netloc}"


def upstream_engines(settings: Settings) -> list[str]:
    """``CLAWR1_UPSTREAM``'s engines, comma-separated, each as written (checked by ``_upstream_origin``)."""
    return [part.strip().rstrip("/") for part in settings.upstream.split(",") if part.strip()]


def proxy_config(settings: Settings) -> ProxyConfig:
    """Validate the settings into mitmproxy modes; raises ProxyStartError with the fix."""
    host = settings.proxy_host
    modes: list[str] = []
    if settings.proxy_port:
        modes.append(f"regular@{host}:{settings.proxy_port}")
    # The reverse mode's origin is the first engine; with several, the engine router
    # (``clawr1.proxy.addons.engines``) sends each call to the engine it picks.
    engines = [_upstream_origin(e) for e in upstream_engines(settings)] if settings.reverse_port else []
    upstream = engines[0] if engines else ""
    if settings.reverse_port:
        if not upstream:
            raise ProxyStartError("reverse_port is set but upstream is not: set CLAWR1_UPSTREAM (--upstream)")
        modes.append(f"reverse:{upstream}@{host}:{settings.reverse_port}")
    if not modes:
        raise ProxyStartError("neither proxy_port nor reverse_port is set: nothing to listen on")
    auth = settings.proxy_auth or None
    if auth == "any":
        raise ProxyStartError("proxy_auth 'any' accepts every client: use user:pass or @htpasswd-file")
    if auth is not None and ":" not in auth and not auth.startswith("@"):
        raise ProxyStartError("proxy_auth must be user:pass (or @htpasswd-file)")
    if not is_loopback(host) and auth is None:
        raise ProxyStartError(
            f"refusing to listen on {host or 'all interfaces'} without proxy authentication (an open proxy): "
            "set CLAWR1_PROXY_AUTH=user:pass or bind to 127.0.0.1"
        )
    processes = settings.role_setting(PROXY_PROCESSES)
    if processes < 1:
        raise ProxyStartError(f"{PROCESSES_ENV} must be at least 1, got {processes}")
    return ProxyConfig(
        modes=tuple(modes),
        confdir=confdir(settings),
        spool_dir=(settings.data_dir / "proxy-spool").resolve(),
        proxyauth=auth,
        upstream_ca=settings.role_setting(UPSTREAM_CA_FILE) or None,
        upstream_insecure=settings.role_setting(UPSTREAM_INSECURE),
        capture_token_ids=settings.capture_token_ids,
        token_id_hosts=settings.token_id_hosts or ",".join(_upstream_address(e) for e in engines),
        bootstrap=settings.bootstrap_servers,
        partitions=settings.topic_partitions,
        registry_url=settings.schema_registry_url,
        instance=settings.role_setting(PROXY_INSTANCE) or _default_instance(settings),
        destinations=proxy_destinations(settings),
        relay_secret=relay_secret(settings),
        metrics_port=settings.proxy_metrics_port,
        metrics_host=settings.metrics_host,
        processes=processes,
        batch_s=settings.role_setting(PROXY_BATCH_MS) / 1000,
        batch_calls=settings.role_setting(PROXY_BATCH_CALLS),
        thin=ThinWait(settings.role_setting(PROXY_THIN_BATCH_MS) / 1000,
                      settings.role_setting(PROXY_THIN_BATCH_CALLS)),
        max_lag_s=settings.role_setting(MAX_LAG_S),
        streams_group=settings.role_setting(STREAMS_APP_ID),
        engines=tuple(engines),
        keys=_keys(settings),
        engines_dir=(settings.data_dir / engine_files.DIRECTORY).resolve(),
    )


def _keys(settings: Settings) -> KeyRing:
    """The stack's API keys: the engine routes take an ``operate`` key when there are keys."""
    try:
        return parse_api_keys(settings.api_keys)
    except ApiKeyError as exc:
        raise ProxyStartError(str(exc)) from exc


def proxy_destinations(settings: Settings) -> Destinations:
    """``CLAWR1_PROXY_ALLOW`` over the stack's service hosts, with ``CLAWR1_UPSTREAM``'s engines allowed."""
    try:
        entries = parse_allow(settings.role_setting(PROXY_ALLOW))
    except DestinationError as exc:
        raise ProxyStartError(str(exc)) from exc
    engines = [url_endpoint(part.strip()) for part in settings.upstream.split(",") if part.strip()]
    services = [*settings.bootstrap_servers.split(","), settings.clickhouse_dsn, settings.sql_dsn,
                settings.schema_registry_url]
    return Destinations(entries, tuple(e for e in engines if e is not None), service_hosts(services))


def _upstream_address(upstream: str) -> str:
    """``host:port`` of a reverse-mode engine (the default token-id hosts)."""
    parts = urlsplit(upstream)
    return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def _default_instance(settings: Settings) -> str:
    return f"{socket.gethostname()}:{settings.proxy_port or settings.reverse_port}"
