"""The capture proxy for the integration tests: real mitmproxy, real Kafka, a stand-in engine on the wire.

The proxy runs either embedded (``serve_proxy`` on its own event-loop thread, one at a time: mitmproxy
keeps its context in module globals) or as a separate process (``proxy_process``), like ``clawr1 proxy``.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import os
import signal
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from mitmproxy import ctx as mitmproxy_ctx

from clawr1.core.routing import partition_of
from clawr1.core.settings import Settings, env_names
from clawr1.demo.standin.server import StandinEngine
from clawr1.proxy.config import ca_cert_path
from clawr1.proxy.runner import serve_proxy
from tests.support.kafka import TopicFollower
from tests.support.waiting import wait_until

REPO_ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


class LoopThread:
    """An asyncio loop on a daemon thread, for servers the blocking test clients talk to."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 30.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@dataclass
class Standin:
    engine: StandinEngine
    url: str


def start_standin(
    loop: LoopThread, ssl_context: ssl.SSLContext | None = None, host: str = "127.0.0.1"
) -> Standin:
    engine = StandinEngine()
    port = loop.run(engine.start("127.0.0.1", 0, ssl_context))
    return Standin(engine, f"{'https' if ssl_context else 'http'}://{host}:{port}")


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A certificate for localhost/127.0.0.1 that is its own CA (the upstream's trust anchor in tests)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=7))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "standin-cert.pem", directory / "standin-key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    return cert_path, key_path


def server_context(cert: Path, key: Path) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


def client_context(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


_CTX_NAMES = ("master", "options", "log")


class EmbeddedProxy:
    """``serve_proxy`` on its own loop thread; a context manager that waits until every mode listens.

    mitmproxy serves every new connection with the master its module-global ``ctx`` names, which each
    master sets to itself when made: a proxy made while another runs in this process (a module's beside
    the package's) leaves the other's connections to its own addons, stopped or not. So leaving gives
    ``ctx`` back to what it named before: proxies that nest each serve their own."""

    def __init__(self, settings: Settings, topic: str) -> None:
        self.settings = settings
        self.topic = topic
        self._loop = LoopThread()
        self._stop: asyncio.Event | None = None
        self._future: Any = None
        self._ctx_before: dict[str, Any] = {}

    @property
    def reverse_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.reverse_port}"

    @property
    def explicit_url(self) -> str:
        return f"http://127.0.0.1:{self.settings.proxy_port}"

    @property
    def ca(self) -> Path:
        return ca_cert_path(self.settings)

    def __enter__(self) -> EmbeddedProxy:
        self._ctx_before = {n: vars(mitmproxy_ctx)[n] for n in _CTX_NAMES if n in vars(mitmproxy_ctx)}
        ready = threading.Event()

        async def make_stop() -> asyncio.Event:
            return asyncio.Event()

        self._stop = self._loop.run(make_stop())
        self._future = asyncio.run_coroutine_threadsafe(
            serve_proxy(self.settings, ready.set, stop=self._stop, topic=self.topic, drain_s=5.0),
            self._loop.loop,
        )

        def started() -> bool:
            if self._future.done():
                self._future.result()  # raises why it could not start
            return ready.is_set()

        wait_until(started, 30, message="the embedded proxy starting")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.loop.call_soon_threadsafe(self._stop.set)
        try:
            self._future.result(30)
        finally:
            self._loop.close()
            for name in _CTX_NAMES:
                if name in self._ctx_before:
                    setattr(mitmproxy_ctx, name, self._ctx_before[name])


def settings_env(settings: Settings) -> dict[str, str]:
    """The CLAWR1_* environment that makes ``load_settings`` return these settings."""
    env = {
        name: str(getattr(settings, field)).lower()
        if isinstance(getattr(settings, field), bool)
        else str(getattr(settings, field))
        for field, name in env_names().items()
    }
    return {**env, **settings.extra}


START_TIMEOUT_S = 120.0


class ProxyProcess:
    """The proxy as its own process (``tests.support.proxy_process``), like ``clawr1 proxy``."""

    def __init__(self, settings: Settings, topic: str, drain_s: float = 1.0) -> None:
        self.settings = settings
        self.topic = topic
        self.drain_s = drain_s
        self.process: subprocess.Popen[str] | None = None
        self.output: list[str] = []

    def __enter__(self) -> ProxyProcess:
        env = {**os.environ, **settings_env(self.settings), "PYTHONPATH": str(REPO_ROOT)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.proxy_process", self.topic, str(self.drain_s)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        assert self.process.stdout is not None
        self._ready = threading.Event()
        threading.Thread(target=self._read_output, daemon=True).start()
        process = self.process

        def ready() -> bool:
            if self._ready.is_set():
                return True
            assert process.poll() is None, f"proxy process exited: {''.join(self.output)}"
            return False

        try:
            wait_until(ready, START_TIMEOUT_S, interval=0.2,
                       message=lambda: f"proxy process ready: {''.join(self.output)}")
        except AssertionError as exc:
            if process.poll() is None:
                process.kill()
            raise AssertionError(f"proxy process not ready (exit {process.wait()}): {exc}") from None
        return self

    def _read_output(self) -> None:
        """Collects the process's output (a child holding the pipe may keep it open past its exit)."""
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line)
            if line.startswith("READY"):
                self._ready.set()

    def stop(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class Event:
    """A captured call as read from the topic: its Kafka key (an envelope's record: the key it was
    routed by), the whole message's bytes (the envelope that carried it) and the record."""

    key: str
    value: bytes
    record: dict[str, Any]


class TopicReader:
    """Reads every captured call of a topic in the background, from the beginning; a record of an envelope
    is checked to sit on the partition its own key hashes to."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        # A test's deliberate garbage is not a capture, and no reason to stop reading.
        self._follower = TopicFollower(bootstrap, [topic], skip_undecodable=True)
        self._events: list[Event] = []
        self._misplaced: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                events = []
                for read in self._follower.read(0.2):
                    if read.schema != "raw_llm_call":
                        continue
                    own = read.record["trajectory_id"] or read.record["conversation_key"]
                    key = read.key.decode() if read.key else own
                    if partition_of(key, read.partitions) != read.partition:
                        self._misplaced.append(f"{key!r} on partition {read.partition}")
                    events.append(Event(key, read.value, read.record))
                with self._lock:
                    self._events.extend(events)
        finally:
            self._follower.close()

    def events(self, predicate: Callable[[dict[str, Any]], bool] = lambda r: True) -> list[Event]:
        with self._lock:
            assert not self._misplaced, f"records off their key's partition: {self._misplaced}"
            return [e for e in self._events if predicate(e.record)]

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], count: int = 1, timeout: float = 30.0
    ) -> list[Event]:
        return wait_until(lambda: found if len(found := self.events(predicate)) >= count else [], timeout,
                          message=lambda: f"{count} matching events on the topic, found "
                                          f"{len(self.events(predicate))}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def marked(marker: str) -> Callable[[dict[str, Any]], bool]:
    """Events of calls whose request carries ``marker`` (each test marks its own calls)."""
    return lambda record: marker in record["request_body"]
