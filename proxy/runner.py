"""Runs the capture proxy: an explicit HTTP(S) proxy and an OpenAI-compatible base URL in one mitmproxy.

- explicit proxy on ``proxy_host:proxy_port`` (agents set ``HTTPS_PROXY`` and trust the CA that
  ``ca_cert_path`` prints; HTTPS is intercepted with that per-data-dir CA);
- reverse proxy on ``proxy_host:reverse_port`` to ``upstream`` (agents set ``OPENAI_BASE_URL``).

mitmproxy runs embedded with only the addons these modes need, quiet, and its confdir (and CA)
under the data dir. What it reads from the settings, and the checks that keep it from being an open
proxy, are ``clawr1.proxy.config``; this module assembles mitmproxy, starts the processes and runs.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import ssl
import sys
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from mitmproxy import ctx, options
from mitmproxy.exceptions import OptionsError
from mitmproxy.master import Master

from clawr1.core.settings import Settings
from clawr1.core.signals import stop_loop_on_signals
from clawr1.core.topics import RAW_LLM
from clawr1.proxy import mitm_compat
from clawr1.proxy.addons import build_addons
from clawr1.proxy.addons.destinations import DestinationGuard
from clawr1.proxy.addons.engines import EngineRouter
from clawr1.proxy.config import ProxyConfig, ProxyStartError, ca_cert_path, proxy_config
from clawr1.proxy.emitter_process import SPAWN, CallSender, EmitterConfig, EmitterProcess, EmitterStartError
from clawr1.proxy.engine_files import EngineFiles
from clawr1.proxy.record import CapturedCall
from clawr1.proxy.token_ids import TokenIdPolicy

logger = logging.getLogger("clawr1.proxy")
DRAIN_S = 10.0
SWITCH_INTERVAL_S = 0.001


class ProxyFailedError(RuntimeError):
    """One of the proxy's processes died while serving: the whole proxy stops, to be restarted."""


def _upstream_verify(config: ProxyConfig) -> ssl.SSLContext | bool:
    """The upstream trust mitmproxy is given, for requests the proxy sends itself."""
    if config.upstream_insecure:
        return False
    return ssl.create_default_context(cafile=config.upstream_ca) if config.upstream_ca else True


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


def _engine_files(config: ProxyConfig, process: int) -> EngineFiles | None:
    return None if config.engines_dir is None else EngineFiles(config.engines_dir, process, config.processes)


def _make_master(config: ProxyConfig, submit: Callable[[CapturedCall], None],
                 readiness: asyncio.Future[list[str]], process: int) -> Master:
    opts = options.Options(
        mode=list(config.modes),
        confdir=str(config.confdir),
        ssl_insecure=config.upstream_insecure,
        ssl_verify_upstream_trusted_ca=config.upstream_ca,
    )
    token_ids = TokenIdPolicy.parse(config.token_id_hosts) if config.capture_token_ids else None
    router = EngineRouter(list(config.engines), config.keys, _engine_files(config, process)) \
        if config.engines else None
    ours = build_addons(submit, token_ids, _upstream_verify(config), config.relay_secret, router, config.keys)
    master = mitm_compat.capture_master(opts, [DestinationGuard(config.destinations)],
                                        [*ours, _Readiness(readiness)])
    # Addon options exist only once their addon is loaded. With several engines the reverse port opens
    # an engine connection only once a call has picked its engine, not eagerly to the first one.
    opts.update(proxyauth=config.proxyauth,
                connection_strategy="lazy" if len(config.engines) > 1 else "eager")
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
    processes = config.processes
    emitter = EmitterProcess(EmitterConfig(
        bootstrap=config.bootstrap, topic=topic, spool_dir=config.spool_dir, partitions=config.partitions,
        registry_url=config.registry_url, instance=config.instance, drain_s=drain_s,
        metrics_port=config.metrics_port, metrics_host=config.metrics_host,
        batch_s=config.batch_s, batch_calls=config.batch_calls, thin=config.thin, max_lag_s=config.max_lag_s,
        streams_group=config.streams_group), senders=processes)
    try:
        await asyncio.to_thread(emitter.start)
    except EmitterStartError as exc:
        raise ProxyStartError(f"{exc} (data dir {settings.data_dir})") from exc
    sender = CallSender(emitter.writers[0])
    fronts: list[BaseProcess] = []
    if config.engines and (files := _engine_files(config, 0)) is not None:
        await asyncio.to_thread(files.clear_processes)
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
            front = SPAWN.Process(target=_front_main, args=(settings, index, writer, status_writer, alive),
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


def _front_main(settings: Settings, index: int, writer: Connection, status: Connection,
                alive: Connection) -> None:
    """One more proxy process: the same modes on the same ports, its calls sent to the emitter; it
    stops with the first process (``alive`` ends)."""
    config = proxy_config(settings)
    _quiet_mitmproxy()
    mitm_compat.listen_with_reuse_port()
    sender = CallSender(writer)

    async def main() -> None:
        stop = stop_loop_on_signals()
        await _run_master(config, sender.submit, lambda: status.send(None), stop, [alive.fileno()], index)

    try:
        asyncio.run(main())
    except ProxyStartError as exc:
        status.send(str(exc))
    except ProxyFailedError:
        logger.error("the first proxy process is gone; this one stops too")
    finally:
        sender.close()


async def _run_master(config: ProxyConfig, submit: Callable[[CapturedCall], None],
                      ready: Callable[[], None] | None, stop: asyncio.Event, watch: list[int],
                      process: int = 0) -> None:
    """Serve until ``stop``; raises ProxyFailedError when a process in ``watch`` (sentinels) ends."""
    loop = asyncio.get_running_loop()
    readiness: asyncio.Future[list[str]] = loop.create_future()
    try:
        master = _make_master(config, submit, readiness, process)
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
