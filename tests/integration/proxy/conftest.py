"""One stand-in engine (HTTP and HTTPS), one embedded proxy in both modes and one topic reader for
the whole package; the modules that need their own proxy or broker start proxy processes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from clawr1.core.kafka_io import ensure_topics
from clawr1.core.settings import Settings
from tests.support.ports import free_port
from tests.support.proxy import (
    EmbeddedProxy,
    LoopThread,
    Standin,
    TopicReader,
    self_signed_cert,
    server_context,
    start_standin,
)


@pytest.fixture(scope="package")
def servers_loop() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


@pytest.fixture(scope="package")
def standin(servers_loop: LoopThread) -> Iterator[Standin]:
    server = start_standin(servers_loop)
    yield server
    servers_loop.run(server.engine.stop())


@pytest.fixture(scope="package")
def refusing_standin(servers_loop: LoopThread) -> Iterator[Standin]:
    """Listed as accepting token ids, but its ``strict-*`` models refuse them: one test teaches the proxy
    that, and the proxy then stops asking this host."""
    server = start_standin(servers_loop)
    yield server
    servers_loop.run(server.engine.stop())


@pytest.fixture(scope="package")
def unlisted_standin(servers_loop: LoopThread) -> Iterator[Standin]:
    """An upstream not in ``CLAWR1_TOKEN_ID_HOSTS``: it never gets token-id fields."""
    server = start_standin(servers_loop)
    yield server
    servers_loop.run(server.engine.stop())


@pytest.fixture(scope="package")
def standin_cert(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed_cert(tmp_path_factory.mktemp("standin-tls"))


@pytest.fixture(scope="package")
def tls_standin(servers_loop: LoopThread, standin_cert: tuple[Path, Path]) -> Iterator[Standin]:
    server = start_standin(servers_loop, server_context(*standin_cert), host="localhost")
    yield server
    servers_loop.run(server.engine.stop())


@pytest.fixture(scope="package")
def capture_topic(kafka_bootstrap: str) -> str:
    topic = f"clawr1.test.raw.llm.{uuid.uuid4().hex[:10]}"
    ensure_topics(kafka_bootstrap, [topic], partitions=4)
    return topic


@pytest.fixture(scope="package")
def dead_port() -> int:
    """A port here that nothing listens on and the explicit proxy may try (an unreachable upstream)."""
    return free_port()


@pytest.fixture(scope="package")
def proxy(
    tmp_path_factory: pytest.TempPathFactory,
    kafka_bootstrap: str,
    standin: Standin,
    tls_standin: Standin,
    refusing_standin: Standin,
    unlisted_standin: Standin,
    standin_cert: tuple[Path, Path],
    capture_topic: str,
    dead_port: int,
) -> Iterator[EmbeddedProxy]:
    """Explicit proxy and base URL to the HTTP stand-in, token-id capture on toward every stand-in but
    the unlisted one; it trusts the TLS stand-in's certificate for intercepted HTTPS. The stand-ins run
    on this machine, so each is allowed by its host:port (any other port here is refused)."""
    listed = [server.url.split("://", 1)[1] for server in (standin, tls_standin, refusing_standin)]
    allowed = ["*", *listed, unlisted_standin.url.split("://", 1)[1], f"127.0.0.1:{dead_port}"]
    settings = Settings(
        data_dir=tmp_path_factory.mktemp("proxy-data"),
        kafka_bootstrap=kafka_bootstrap,
        proxy_port=free_port(),
        reverse_port=free_port(),
        upstream=standin.url,
        capture_token_ids=True,
        token_id_hosts=",".join(listed),
        extra={"CLAWR1_UPSTREAM_CA_FILE": str(standin_cert[0]), "CLAWR1_PROXY_ALLOW": ",".join(allowed)},
    )
    with EmbeddedProxy(settings, capture_topic) as running:
        yield running


@pytest.fixture(scope="package")
def events(kafka_bootstrap: str, capture_topic: str) -> Iterator[TopicReader]:
    reader = TopicReader(kafka_bootstrap, capture_topic)
    yield reader
    reader.close()
