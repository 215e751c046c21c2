"""Runs the capture proxy: an explicit HTTP(S) proxy and an OpenAI-compatible base URL in one mitmproxy.

- explicit proxy on ``proxy_host:proxy_port`` (agents set ``HTTPS_PROXY`` and trust the CA that
  ``ca_cert_path`` prints; HTTPS is intercepted with that per-data-dir CA);
- reverse proxy on ``proxy_host:reverse_port`` to ``upstream`` (agents set ``OPENAI_BASE_URL``).

mitmproxy runs embedded with only the addons these modes need, quiet, and its confdir (and CA)
under the data dir. It refuses to be an open proxy: a non-loopback address needs proxy auth.
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import socket
import ssl
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from mitmproxy import ctx, options
from mitmproxy.exceptions import OptionsError
from mitmproxy.master import Master

from clawr1.core.registry import (
    PROXY_ALLOW,
    PROXY_BATCH_CALLS,
    PROXY_BATCH_MS,
    PROXY_INSTANCE,
    PROXY_PROCESSES,
    UPSTREAM_CA_FILE,
    UPSTREAM_INSECURE,
)
from clawr1.core.relay_source import relay_secret
from clawr1.core.settings import Settings
from clawr1.core.signals import stop_loop_on_signals
from clawr1.core.topics import RAW_LLM
from clawr1.proxy import mitm_compat
from clawr1.proxy.addons import build_addons
from clawr1.proxy.addons.destinations import DestinationGuard
from clawr1.proxy.destinations import (
    DestinationError,
    Destinations,
    parse_allow,
    service_hosts,
    url_endpoint,
)
from clawr1.proxy.emitter_process import SPAWN, CallSender, EmitterConfig, EmitterProcess, EmitterStartError
from clawr1.proxy.record import CapturedCall
from clawr1.proxy.token_ids import TokenIdPolicy

logger = logging.getLogger("clawr1.proxy")
CA_BASENAME = "mitmproxy"
CA_KEY_SIZE = 2048
# Role-specific settings (clawr1/core/registry.py), read with Settings.role_setting (see docs/proxy.md).
UPSTREAM_CA_ENV = UPSTREAM_CA_FILE.name
UPSTREAM_INSECURE_ENV = UPSTREAM_INSECURE.name
INSTANCE_ENV = PROXY_INSTANCE.name
PROCESSES_ENV = PROXY_PROCESSES.name
DRAIN_S = 10.0
SWITCH_INTERVAL_S = 0.001


class ProxyStartError(RuntimeError):
    """The proxy cannot start as configured; the message says what to change."""


class ProxyFailedError(RuntimeError):
    """One of the proxy's processes died while serving: the whole proxy stops, to be restarted."""


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


def reverse_upstream(settings: Settings) -> str:
    """The reverse port's one origin: ``CLAWR1_UPSTREAM``'s first engine when it lists several (the
    compat port's ``/generate`` round-robins over all of them; agent calls go to the first)."""
    engines = [part.strip() for part in settings.upstream.split(",") if part.strip()]
    if len(engines) > 1:
        logger.info("CLAWR1_UPSTREAM lists %d engines: the reverse port relays to the first, %s",
                    len(engines), engines[0])
    return engines[0] if engines else ""


def proxy_config(settings: Settings) -> ProxyConfig:
    """Validate the settings into mitmproxy modes; raises ProxyStartError with the fix."""
    host = settings.proxy_host
    modes: list[str] = []
    if settings.proxy_port:
        modes.append(f"regular@{host}:{settings.proxy_port}")
    upstream = reverse_upstream(settings) if settings.reverse_port else ""
    if settings.reverse_port:
        if not upstream:
            raise ProxyStartError("reverse_port is set but upstream is not: set CLAWR1_UPSTREAM (--upstream)")
        modes.append(f"reverse:{_upstream_origin(upstream)}@{host}:{settings.reverse_port}")
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
    return ProxyConfig(
        modes=tuple(modes),
        confdir=confdir(settings),
        spool_dir=(settings.data_dir / "proxy-spool").resolve(),
        proxyauth=auth,
        upstream_ca=settings.role_setting(UPSTREAM_CA_FILE) or None,
        upstream_insecure=settings.role_setting(UPSTREAM_INSECURE),
        capture_token_ids=settings.capture_token_ids,
        token_id_hosts=settings.token_id_hosts or _upstream_address(upstream),
        bootstrap=settings.bootstrap_servers,
        partitions=settings.topic_partitions,
        registry_url=settings.schema_registry_url,
        instance=settings.role_setting(PROXY_INSTANCE) or _default_instance(settings),
        destinations=proxy_destinations(settings),
        relay_secret=relay_secret(settings),
        metrics_port=settings.proxy_metrics_port,
        metrics_host=settings.metrics_host,
    )


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
    """``host:port`` of the reverse-mode upstream (the default token-id host), empty without one."""
    if not upstream:
        return ""
    parts = urlsplit(upstream)
    return f"{parts.hostname}:{parts.port or (443 if parts.scheme == 'https' else 80)}"


def _upstream_verify(config: ProxyConfig) -> ssl.SSLContext | bool:
    """The upstream trust mitmproxy is given, for requests the proxy sends itself."""
    if config.upstream_insecure:
        return False
    return ssl.create_default_context(cafile=config.upstream_ca) if config.upstream_ca else True


def _default_instance(settings: Settings) -> str:
    return f"{socket.gethostname()}:{settings.proxy_port or settings.reverse_port}"


def _quiet_mitmproxy() -> None:
    logging.getLogger("mitmproxy").setLevel(logging.WARNING)


class _Readiness:
    """Resolves once mitmproxy has tried to bind every mode: with the failures, empty when all listen."""

    def __init__(self, result: asyncio.Future[list[str]]) -> None:
        self._result = result

    def running(self) -> None:
        failures = mitm_compat.listen_failures(ctx.master)
        if not self._result.done():
            self._result.set_result(failures)


def _make_master(config: ProxyConfig, submit: Callable[[CapturedCall], None],
                 readiness: asyncio.Future[list[str]]) -> Master:
    opts = options.Options(
        mode=list(config.modes),
        confdir=str(config.confdir),
        ssl_insecure=config.upstream_insecure,
        ssl_verify_upstream_trusted_ca=config.upstream_ca,
    )
    token_ids = TokenIdPolicy.parse(config.token_id_hosts) if config.capture_token_ids else None
    ours = build_addons(submit, token_ids, _upstream_verify(config), config.relay_secret)
    master = mitm_compat.capture_master(opts, [DestinationGuard(config.destinations)],
                                        [*ours, _Readiness(readiness)])
    # Addon options exist only once their addon is loaded.
    opts.update(proxyauth=config.proxyauth)
    return master


async def serve_proxy(settings: Settings, ready: Callable[[], None] | None = None, *,
                      stop: asyncio.Event | None = None, topic: str = RAW_LLM.name,
                      drain_s: float = DRAIN_S) -> None:
    """Run until ``stop`` is set (or the task is cancelled); ``ready`` is called once all modes listen.

    Records are built and delivered by an emitter process (``clawr1.proxy.emitter_process``). With
    ``CLAWR1_PROXY_PROCESSES`` > 1, more proxy processes serve the same ports (SO_REUSEPORT: the
    kernel spreads connections over them), all feeding that one emitter. On the way out, captured calls
    get ``drain_s`` to reach Kafka; the rest stay spooled for the next start. Raises ProxyStartError
    when the configuration is unsafe or a port cannot be bound, ProxyFailedError when one of its
    processes dies.
    """
    config = proxy_config(settings)
    _quiet_mitmproxy()
    config.confdir.mkdir(parents=True, exist_ok=True)
    processes = settings.role_setting(PROXY_PROCESSES)
    if processes < 1:
        raise ProxyStartError(f"{PROCESSES_ENV} must be at least 1, got {processes}")
    emitter = EmitterProcess(EmitterConfig(
        bootstrap=config.bootstrap, topic=topic, spool_dir=config.spool_dir, partitions=config.partitions,
        registry_url=config.registry_url, instance=config.instance, drain_s=drain_s,
        metrics_port=config.metrics_port, metrics_host=config.metrics_host,
        batch_s=settings.role_setting(PROXY_BATCH_MS) / 1000,
        batch_calls=settings.role_setting(PROXY_BATCH_CALLS)), senders=processes)
    try:
        await asyncio.to_thread(emitter.start)
    except EmitterStartError as exc:
        raise ProxyStartError(f"{exc} (data dir {settings.data_dir})") from exc
    sender = CallSender(emitter.writers[0])
    fronts: list[BaseProcess] = []
    alive_writer: Connection | None = None
    try:
        if processes > 1:
            ca_cert_path(settings)  # one CA, made before the processes that share it start
            mitm_compat.listen_with_reuse_port()
            # A front's end of this pipe reads end of file once this process is gone: it then stops too.
            alive, alive_writer = SPAWN.Pipe(duplex=False)
            fronts = await asyncio.to_thread(_start_fronts, settings, emitter.writers[1:], alive)
            alive.close()
        await _run_master(config, sender.submit, ready, stop or asyncio.Event(),
                          [emitter.sentinel, *(front.sentinel for front in fronts)])
    finally:
        await asyncio.to_thread(_stop_processes, sender, fronts, emitter, drain_s)
        if alive_writer is not None:
            alive_writer.close()


def _stop_processes(sender: CallSender, fronts: list[BaseProcess], emitter: EmitterProcess,
                    drain_s: float) -> None:
    for front in fronts:
        front.terminate()
    sender.close(stop_emitter=True)
    for front in fronts:
        front.join(10.0)
        if front.is_alive():
            front.kill()
    emitter.join(drain_s + 10.0)


def _start_fronts(settings: Settings, writers: list[Connection], alive: Connection) -> list[BaseProcess]:
    """Start one more proxy process per writer; returns once each listens, raises if one cannot."""
    fronts: list[BaseProcess] = []
    try:
        for index, writer in enumerate(writers, start=1):
            status, status_writer = SPAWN.Pipe(duplex=False)
            front = SPAWN.Process(target=_front_main, args=(settings, writer, status_writer, alive),
                                  name=f"clawr1-proxy-{index}")
            front.start()
            fronts.append(front)
            writer.close()
            status_writer.close()
            try:
                error = status.recv() if status.poll(120.0) else "did not listen in time"
            except EOFError:
                error = f"exited with {front.exitcode} while starting"
            if error is not None:
                raise ProxyStartError(f"proxy process {index}: {error}")
    except BaseException:
        for started in fronts:
            started.kill()
        raise
    return fronts


def _front_main(settings: Settings, writer: Connection, status: Connection, alive: Connection) -> None:
    """One more proxy process: the same modes on the same ports, its calls sent to the emitter; it
    stops with the first process (``alive`` ends)."""
    config = proxy_config(settings)
    _quiet_mitmproxy()
    mitm_compat.listen_with_reuse_port()
    sender = CallSender(writer)

    async def main() -> None:
        stop = stop_loop_on_signals()
        await _run_master(config, sender.submit, lambda: status.send(None), stop, [alive.fileno()])

    try:
        asyncio.run(main())
    except ProxyStartError as exc:
        status.send(str(exc))
    except ProxyFailedError:
        logger.error("the first proxy process is gone; this one stops too")
    finally:
        sender.close()


async def _run_master(config: ProxyConfig, submit: Callable[[CapturedCall], None],
                      ready: Callable[[], None] | None, stop: asyncio.Event, watch: list[int]) -> None:
    """Serve until ``stop``; raises ProxyFailedError when a process in ``watch`` (sentinels) ends."""
    loop = asyncio.get_running_loop()
    readiness: asyncio.Future[list[str]] = loop.create_future()
    try:
        master = _make_master(config, submit, readiness)
    except OptionsError as exc:
        raise ProxyStartError(f"mitmproxy refused the configuration: {exc}") from exc
    died = asyncio.Event()
    for sentinel in watch:
        loop.add_reader(sentinel, died.set)
    run = asyncio.create_task(master.run(), name="mitmproxy")
    stopped = asyncio.create_task(stop.wait())
    lost = asyncio.create_task(died.wait())
    try:
        starting: list[asyncio.Future[Any]] = [run, readiness, lost]
        await asyncio.wait(starting, return_when=asyncio.FIRST_COMPLETED)
        if not readiness.done():
            raise ProxyStartError("mitmproxy stopped while starting")
        if failures := readiness.result():
            raise ProxyStartError("could not listen: " + "; ".join(failures))
        logger.info("capture proxy listening: %s", ", ".join(config.modes))
        if ready is not None:
            ready()
        await asyncio.wait([run, stopped, lost], return_when=asyncio.FIRST_COMPLETED)
        if died.is_set() and not stop.is_set():
            raise ProxyFailedError("a proxy process (emitter or another proxy process) exited; stopping")
    finally:
        for sentinel in watch:
            loop.remove_reader(sentinel)
        stopped.cancel()
        lost.cancel()
        await mitm_compat.stop_listening(master)
        master.shutdown()
        await asyncio.gather(run, return_exceptions=True)
        # Stopping cancels the agents' idle keep-alive connections after mitmproxy has put its own
        # handler back: that is their intended end, not an error worth a traceback.
        asyncio.get_running_loop().set_exception_handler(_quiet_cancelled_connections)


def _quiet_cancelled_connections(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)


def run_proxy(settings: Settings, ready: Callable[[], None] | None = None, *, topic: str = RAW_LLM.name,
              drain_s: float = DRAIN_S) -> int:
    """``clawr1 proxy``: blocks until SIGINT/SIGTERM; 0 on a clean stop, 2 when it cannot start."""

    def started() -> None:
        # Everything loaded so far lives as long as the process: keep it out of the collector's scans.
        gc.freeze()
        if ready is not None:
            ready()

    async def main() -> None:
        stop = stop_loop_on_signals()
        await serve_proxy(settings, started, stop=stop, topic=topic, drain_s=drain_s)

    # The sender thread pickles calls for the emitter; a short switch interval lets the event loop,
    # which forwards agent traffic, take the GIL back within a millisecond instead of five.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    try:
        asyncio.run(main())
    except ProxyStartError as exc:
        print(f"clawr1 proxy: {exc}", file=sys.stderr)
        return 2
    except ProxyFailedError as exc:
        print(f"clawr1 proxy: {exc}", file=sys.stderr)
        return 1
    return 0
