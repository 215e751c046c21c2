"""Runs a single-node Apache Kafka 4.x broker (KRaft, combined broker+controller) from Maven jars.

The jars are resolved by ``broker/pom.xml`` into ``.cache/kafka/lib`` (``make install``). Storage is
formatted once per data directory; later starts reuse it, so acknowledged data survives restarts.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from clawr1.core.signals import stop_on_signals

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LIB_DIR = REPO_ROOT / ".cache" / "kafka" / "lib"
LIB_DIR_ENV = "CLAWR1_KAFKA_LIB_DIR"

_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="file" fileName="{log_file}"><PatternLayout pattern="[%d] %p %m (%c)%n"/></File>
    <Console name="console" target="SYSTEM_ERR"><PatternLayout pattern="[kafka] %p %m%n"/></Console>
  </Appenders>
  <Loggers>
    <Root level="INFO"><AppenderRef ref="file"/><AppenderRef ref="console" level="ERROR"/></Root>
  </Loggers>
</Configuration>
"""


class BrokerError(RuntimeError):
    """The broker could not be set up or started; the message says what is missing."""


def lib_dir() -> Path:
    return Path(os.environ.get(LIB_DIR_ENV, DEFAULT_LIB_DIR))


def classpath(jars: Path | None = None) -> str:
    folder = jars or lib_dir()
    found = sorted(folder.glob("*.jar")) if folder.is_dir() else []
    if not any(j.name.startswith("kafka_2.13-") for j in found):
        raise BrokerError(
            f"no Kafka jars in {folder}: run `make install` (it resolves org.apache.kafka:kafka_2.13 "
            "with Maven from broker/pom.xml)"
        )
    return os.pathsep.join(str(j) for j in found)


def server_properties(data_dir: Path, port: int, controller_port: int) -> str:
    """Single-node settings: every internal topic has replication factor 1, rebalances start at once."""
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "listeners": f"PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir / "logs"),
        "num.partitions": "1",
        "auto.create.topics.enable": "true",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "log.retention.hours": "168",
        "log.segment.bytes": str(256 * 1024 * 1024),
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())


def controller_port_beside(port: int) -> int:
    """``port + 1`` when nothing holds it, else a free port the system picks.

    A client's outgoing connection can sit on the port next to the broker's (seen in CI: the controller
    could not bind, and the broker exited before the stack came up).
    """
    for candidate in (port + 1, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", candidate))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise BrokerError("no free port for the broker's controller listener")


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class KafkaBroker:
    """A local broker process; use as a context manager or call start()/stop()."""

    data_dir: Path
    port: int = 9092
    controller_port: int | None = None
    heap: str = "512m"
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "kafka.log"

    def _java(self) -> str:
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
        if not java:
            raise BrokerError(
                "java not found: install a JDK 17+ (e.g. apt-get install openjdk-17-jre-headless)"
            )
        return java

    def prepare(self) -> Path:
        """Write the config and format KRaft storage on first use; returns the properties file."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cport = self.controller_port or controller_port_beside(self.port)
        config = self.data_dir / "server.properties"
        config.write_text(server_properties(self.data_dir.resolve(), self.port, cport))
        (self.data_dir / "log4j2.xml").write_text(_LOG4J2_XML.format(log_file=self.log_file.resolve()))
        if not (self.data_dir / "logs" / "meta.properties").exists():
            cluster_id_file = self.data_dir / "cluster.id"
            if not cluster_id_file.exists():
                cluster_id_file.write_text(_kafka_uuid())
            result = subprocess.run(
                self._command(
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id_file.read_text().strip(),
                    "-c",
                    str(config),
                    "--ignore-formatted",
                ),
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise BrokerError(f"formatting KRaft storage failed: {result.stderr or result.stdout}")
        return config

    def _command(self, main_class: str, *args: str) -> list[str]:
        return [
            self._java(),
            f"-Xms{self.heap}",
            f"-Xmx{self.heap}",
            "-XX:+UseG1GC",
            "-XX:MaxGCPauseMillis=20",
            "-Dlog4j2.shutdownHookEnabled=false",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={(self.data_dir / 'log4j2.xml').resolve()}",
            "-cp",
            classpath(),
            main_class,
            *args,
        ]

    def start(self, wait: float = 90.0) -> KafkaBroker:
        self.launch()
        self.wait_ready(wait)
        return self

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the broker process without waiting for it to serve (a supervisor restarting it keeps
        watching the other roles meanwhile)."""
        if port_open("127.0.0.1", self.port):
            raise BrokerError(f"port {self.port} is already in use: another broker or service is there")
        config = self.prepare()
        self.process = subprocess.Popen(self._command("kafka.Kafka", str(config)), start_new_session=True)
        return self.process

    def wait_ready(self, timeout: float) -> None:
        """Ready means the broker answers metadata requests, not merely that its port is open."""
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        admin = None
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise BrokerError(f"broker exited with {self.process.returncode}; see {self.log_file}")
            if port_open("127.0.0.1", self.port):
                admin = admin or AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
                try:
                    metadata = admin.list_topics(timeout=2)
                    if metadata.brokers:
                        return
                except Exception:  # noqa: BLE001 - librdkafka raises KafkaException while starting
                    pass
            time.sleep(0.2)
        raise BrokerError(f"broker not ready after {timeout:.0f}s; see {self.log_file}")

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM lets the broker flush and close its logs; SIGKILL only if it hangs."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _kafka_uuid() -> str:
    """Kafka's cluster ids are URL-safe base64 of 16 random bytes without padding. Like Kafka's own
    generator, never start with '-': the storage tool's argument parser would read it as an option."""
    import base64

    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def run_foreground(data_dir: Path, port: int, heap: str, controller_port: int | None = None) -> int:
    """``clawr1 kafka``: run until SIGINT/SIGTERM, then stop the broker cleanly."""
    broker = KafkaBroker(data_dir=data_dir, port=port, heap=heap, controller_port=controller_port)
    started = time.monotonic()
    broker.start()
    print(
        f"kafka ready on {broker.bootstrap} in {time.monotonic() - started:.1f}s (data: {data_dir})",
        flush=True,
    )
    stop = stop_on_signals()
    assert broker.process is not None
    while not stop.wait(0.2) and broker.process.poll() is None:
        pass
    broker.stop()
    return 0 if stop.is_set() else (broker.process.returncode or 1)
