"""Record building and delivery in a process of their own, so they never share a GIL with the event
loop that forwards the agent's traffic.

The proxy's hooks hand each ``CapturedCall`` to a ``CallSender``, whose thread pickles it onto a pipe
(raw bytes, headers, timings, hints: cheap copies). The emitter process reads the pipes of every
proxy process, builds, redacts and encodes each record and hands it to an ``Emitter`` (spool, then
Kafka). A record is spooled as an envelope of one (``raw_llm_call_batch``), a message readable alone;
the emitter combines those bound for one partition into one envelope per window.

Durability: a pipe's end of file comes after every call written to it, so when a proxy process
dies (SIGKILL included) the emitter still reads, spools and sends what that process had written,
then exits once no proxy process is left; a restarted proxy's emitter waits for the spool's lock
until then. Only calls still in the sender's in-memory queue (written within microseconds) die
with the proxy, as calls in the emitter thread's queue did before.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from multiprocessing.connection import Connection, wait
from pathlib import Path

from clawr1.core.thin_batch import NEVER, ThinWait

logger = logging.getLogger("clawr1.proxy.emitter")
# spawn: the proxy process runs threads and an event loop, which a forked child must not inherit.
SPAWN = multiprocessing.get_context("spawn")
# How long a new emitter waits for an older one (left by a killed proxy) to release the spool.
LOCK_WAIT_S = 5.0
# A proxy that died is restarted: its orphaned emitter delivers briefly, the rest stays spooled.
ORPHAN_DRAIN_S = 1.0


@dataclass(frozen=True)
class EmitterConfig:
    bootstrap: str
    topic: str
    spool_dir: Path
    partitions: int
    registry_url: str
    instance: str
    drain_s: float
    # Captured calls bound for one partition share a message (an envelope) within this window or count.
    batch_s: float = 0.0
    batch_calls: int = 1
    # A thin envelope waits longer (``clawr1.core.thin_batch``).
    thin: ThinWait = NEVER
    # Where the emitter serves the proxy's metrics (``clawr1.core.metrics``); port 0 = off.
    metrics_port: int = 0
    metrics_host: str = "127.0.0.1"
    # Backpressure (clawr1.core.backpressure): while ``streams_group`` is this far behind on ``topic``,
    # captures stay in the spool (the agent's traffic is forwarded all along); 0: never.
    max_lag_s: float = 0.0
    streams_group: str = ""


class EmitterStartError(RuntimeError):
    """The emitter process could not open its spool (another proxy owns it) or failed to start."""


class CallSender:
    """Hands captured calls to the emitter process from a writer thread: ``submit`` never blocks,
    even while the pipe is full."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection
        self._queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="clawr1-proxy-sender", daemon=True)
        self._thread.start()

    def submit(self, call: object) -> None:
        self._queue.put(call)

    def close(self, stop_emitter: bool = False) -> None:
        """Flush what was submitted; ``stop_emitter`` asks the emitter to drain and exit after it."""
        self._queue.put(_STOP if stop_emitter else _CLOSE)
        self._thread.join()

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not _CLOSE:
                self._connection.send(item)
                if item is _STOP:
                    break
        except OSError:
            logger.exception("the emitter process is gone; captured calls are no longer recorded")
        finally:
            self._connection.close()


# Queue markers: the sender closes its pipe (the emitter sees its end of file), or asks the emitter to
# drain with the configured budget and exit (a clean stop).
_CLOSE = object()
_STOP = "stop"


class EmitterProcess:
    """The emitter process and one pipe per proxy process feeding it (``senders``)."""

    def __init__(self, config: EmitterConfig, senders: int = 1) -> None:
        self.config = config
        pipes = [SPAWN.Pipe(duplex=False) for _ in range(senders)]
        self._readers = [reader for reader, _ in pipes]
        self.writers = [writer for _, writer in pipes]
        status_reader, self._status_writer = SPAWN.Pipe(duplex=False)
        self._status = status_reader
        self._process = SPAWN.Process(
            target=_emitter_main, args=(config, self._readers, self._status_writer),
            name="clawr1-proxy-emitter", daemon=False)

    @property
    def sentinel(self) -> int:
        return self._process.sentinel

    def start(self) -> None:
        """Spawn it and wait until its spool is open; raises EmitterStartError with the reason."""
        self._process.start()
        # Only the child reads these: our copies would hide a pipe's end of file from it.
        for connection in (*self._readers, self._status_writer):
            connection.close()
        try:
            error = self._status.recv() if self._status.poll(LOCK_WAIT_S + 60.0) else "did not start in time"
        except EOFError:
            error = f"exited with {self._process.exitcode} while starting"
        if error is not None:
            self._process.join(5.0)
            raise EmitterStartError(f"proxy emitter: {error}")

    def join(self, timeout: float) -> None:
        """Wait for it after every sender closed (it drains first); killed past ``timeout``."""
        self._process.join(timeout)
        if self._process.is_alive():
            logger.error("the emitter did not stop in %.0f s; killing it (its spool is kept)", timeout)
            self._process.kill()
            self._process.join()


def _emitter_main(config: EmitterConfig, readers: list[Connection], status: Connection) -> None:
    # Imported here: the parent only needs the pipes, the child the whole record pipeline.
    from clawr1.core.backpressure import PipelineLag
    from clawr1.core.metrics import (
        PROXY_CALLS_CAPTURED,
        PROXY_CALLS_FAILED,
        PROXY_ENGINE_CALLS,
        PROXY_ENGINE_POLICY_VERSION,
        PROXY_HINTS_IGNORED,
        PROXY_SPOOL_DEPTH,
        MetricsPortError,
        serve_metrics,
    )
    from clawr1.proxy.chains import ResponseChains
    from clawr1.proxy.emitter import Emitter
    from clawr1.proxy.hints import HINTS_IGNORED
    from clawr1.proxy.record import CapturedCall, build_record, envelope_of, spooled
    from clawr1.proxy.spool import SpoolBusyError
    from clawr1.schemas.codec import codec_for

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("clawr1").setLevel(logging.INFO)
    codec = codec_for(config.registry_url)
    chains = ResponseChains()  # every proxy process's calls meet here, in one thread

    def prepare(call: CapturedCall) -> tuple[str, bytes]:
        try:
            key, record = build_record(call, config.instance, chains)
            return key, spooled(codec, record)
        except Exception:
            PROXY_CALLS_FAILED.labels(api=call.api, reason="record_error").inc()
            raise

    def count(call: CapturedCall) -> None:
        PROXY_CALLS_CAPTURED.labels(api=call.api).inc()
        if HINTS_IGNORED in call.notes:
            PROXY_HINTS_IGNORED.inc()
        if call.engine is not None:
            PROXY_ENGINE_CALLS.labels(engine=call.engine).inc()
            if call.engine_version is not None:
                PROXY_ENGINE_POLICY_VERSION.labels(engine=call.engine).set(call.engine_version)
        if call.error is not None:
            PROXY_CALLS_FAILED.labels(api=call.api, reason="upstream_error").inc()
        elif call.status is not None and call.status >= 400:
            PROXY_CALLS_FAILED.labels(api=call.api, reason="http_error").inc()

    lag = PipelineLag(config.bootstrap, {config.streams_group: [config.topic]}, config.max_lag_s) \
        if config.max_lag_s > 0 and config.streams_group else None
    emitter: Emitter[CapturedCall] = Emitter(
        bootstrap=config.bootstrap, topic=config.topic, spool_dir=config.spool_dir, prepare=prepare,
        partitions=config.partitions, combine=partial(envelope_of, codec), batch_s=config.batch_s,
        batch_records=config.batch_calls, thin=config.thin,
        paused=None if lag is None else lambda: lag.verdict().closed)
    PROXY_SPOOL_DEPTH.set_function(lambda: emitter.pending)
    serving = False

    def start() -> None:
        # Every proxy process hands its calls to this one process: its counters are the proxy's.
        nonlocal serving
        if not serving:
            serving = serve_metrics(config.metrics_port, config.metrics_host, "CLAWR1_PROXY_METRICS_PORT")
        emitter.start()
        if lag is not None:
            lag.start()

    # An orphaned emitter (its proxy was killed) holds the spool and the metrics port for a moment.
    _start_waiting_for_lock(start, (SpoolBusyError, MetricsPortError), status)
    drain_s = ORPHAN_DRAIN_S
    open_readers = list(readers)
    while open_readers:
        for reader in wait(open_readers):
            assert isinstance(reader, Connection)
            try:
                item = reader.recv()
            except EOFError:  # that proxy process is gone (stopped or killed)
                open_readers.remove(reader)
                continue
            if item == _STOP:
                drain_s = config.drain_s
                open_readers.remove(reader)
            else:
                count(item)
                emitter.submit(item)
    emitter.close(drain_s)
    if lag is not None:
        lag.stop()


def _start_waiting_for_lock(start: Callable[[], None], busy: tuple[type[Exception], ...],
                            status: Connection) -> None:
    """Open the spool, waiting up to LOCK_WAIT_S for an orphaned emitter to let it go; report on
    ``status`` (None: started) and exit on failure."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            start()
        except busy as exc:
            if time.monotonic() < deadline:
                time.sleep(0.1)
                continue
            status.send(str(exc))
            os._exit(2)
        except Exception as exc:  # noqa: BLE001 - the parent reports it and refuses to start
            status.send(f"{type(exc).__name__}: {exc}")
            os._exit(2)
        status.send(None)
        status.close()
        return
