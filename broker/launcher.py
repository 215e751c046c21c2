"""Runs Apache Kafka 4.x (KRaft) from Maven jars: one combined broker+controller, or a local cluster.

The jars are resolved by ``broker/pom.xml`` into ``.cache/kafka/lib`` (``make install``). Storage is
formatted once per data directory; later starts reuse it, so acknowledged data survives restarts.

A cluster of N nodes (``KafkaCluster``) runs N processes on ports ``port .. port + N - 1``, each with its
own data directory. With three or more nodes every node is also a controller (a quorum of N, so one node
may be lost); with two, the first node alone is. The broker defaults make every topic the stack creates
(and Kafka's own offsets and transaction-state topics) keep ``replication_for(N)`` copies.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from clawr1.core.settings import local_kafka_ports
from clawr1.core.signals import stop_on_signals

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_LIB_DIR = REPO_ROOT / ".cache" / "kafka" / "lib"
LIB_DIR_ENV = "CLAWR1_KAFKA_LIB_DIR"

_LOG4J2_XML = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="WARN">
  <Appenders>
    <File name="file" fileName="{log_file}"><PatternLayout pattern="[%d] %p %m (%c)%n"/></File>
    <Console name="console" target="SYSTEM_ERR"><PatternLayout pattern="[kafka] %p %m%n"/></Console>
{appenders}  </Appenders>
  <Loggers>{loggers}
    <Root level="INFO"><AppenderRef ref="file"/><AppenderRef ref="console" level="ERROR"/></Root>
  </Loggers>
</Configuration>
"""
# Kafka's request logger at DEBUG writes one JSON line per request served ("Completed request:{...}").
_REQUEST_APPENDER = """\
    <File name="requests" fileName="{requests_file}"><PatternLayout pattern="%m%n"/></File>
"""
_REQUEST_LOGGER = """
    <Logger name="kafka.request.logger" level="DEBUG" additivity="false">
      <AppenderRef ref="requests"/>
    </Logger>"""


def log4j2_xml(log_file: Path, requests_file: Path | None = None) -> str:
    """The broker's logging: INFO to ``log_file``, errors to stderr; with ``requests_file``, every
    request it serves there too (``CLAWR1_KAFKA_REQUEST_LOG``, for ``bench/broker_requests.py``)."""
    appenders = _REQUEST_APPENDER.format(requests_file=requests_file) if requests_file else ""
    return _LOG4J2_XML.format(log_file=log_file, appenders=appenders,
                              loggers=_REQUEST_LOGGER if requests_file else "")


# How long the controllers wait for a node's heartbeat before they fence it (Kafka's default is 9 s).
# In a cluster a killed node's partitions get new leaders then: 6 s (9 s held writes to them ~11 s here,
# close to the gateway's 15 s delivery timeout). A lone node has no one to hand its partitions to, and
# fencing itself after a pause (a stopped process, a long GC, a suspended VM) only leaves every partition
# leaderless for a moment, the moment in which Kafka drops transaction markers (see
# ``KafkaBroker._fence_crashed_run``): it waits 30 s. The controller fencing a crashed run waits 2 s.
CLUSTER_SESSION_TIMEOUT_MS = 6000
LONE_SESSION_TIMEOUT_MS = 30_000
FENCING_SESSION_TIMEOUT_MS = 2000
# How often the broker looks for open transactions past their timeout to abort them (Kafka: 10 s).
TIMED_OUT_TRANSACTION_CHECK_MS = 1000
# How long past that session the fencing controller's line may take before the crashed run is taken to
# have been fenced already: generous, since a broker started too early is refused as a duplicate and leads
# its partitions meanwhile, while waiting only costs a run that crashed before it was unfenced (rare).
FENCED_LINE_MARGIN_S = 10.0
FENCED_LINE = "Fencing broker {node_id} at epoch"
ACTIVE_LINE = "Becoming the active controller"


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


@dataclass(frozen=True)
class Replication:
    """Copies of each partition, and how many must hold a write before it is acknowledged (acks=all)."""

    factor: int
    min_insync: int


def replication_for(nodes: int) -> Replication:
    """min(3, N) copies; two of them in sync once there are three, so losing one broker neither loses an
    acknowledged write nor refuses new ones (with fewer nodes, every copy is all there is)."""
    factor = min(3, nodes)
    return Replication(factor, 2 if factor >= 3 else 1)


@dataclass(frozen=True)
class Node:
    node_id: int
    port: int
    controller_port: int | None  # None: a broker only


@dataclass(frozen=True)
class ClusterLayout:
    """Where each node of a local cluster listens. Fixed for a run: every node's config names every
    controller, so a node restarted by the supervisor must come back on the same ports."""

    nodes: tuple[Node, ...]

    @property
    def lone(self) -> bool:
        return len(self.nodes) == 1

    @classmethod
    def plan(cls, port: int, count: int) -> ClusterLayout:
        """Brokers on ``port .. port + count - 1``; controllers (every node from three on, else the first)
        on the ports after them when free."""
        if count < 1:
            raise BrokerError(f"a Kafka cluster needs at least one node, not {count}")
        ports = local_kafka_ports(port, count)
        controllers = count if count >= 3 else 1
        return cls(tuple(
            Node(i + 1, broker_port, free_port_at(port + count + i) if i < controllers else None)
            for i, broker_port in enumerate(ports)))

    @property
    def voters(self) -> str:
        return ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes if n.controller_port)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    @property
    def replication(self) -> Replication:
        return replication_for(len(self.nodes))


def server_properties(data_dir: Path, node: Node, layout: ClusterLayout) -> str:
    return _properties_text(node_settings(data_dir, node, layout))


def fencing_properties(data_dir: Path, node: Node, layout: ClusterLayout) -> str:
    """The node's settings as a controller alone: it serves no clients and leads no partition, so it
    only moves the metadata on (see ``KafkaBroker._fence_crashed_run``)."""
    settings = node_settings(data_dir, node, layout)
    for broker_only in ("advertised.listeners", "inter.broker.listener.name"):
        del settings[broker_only]
    settings["process.roles"] = "controller"
    settings["listeners"] = f"CONTROLLER://127.0.0.1:{node.controller_port}"
    settings["broker.session.timeout.ms"] = str(FENCING_SESSION_TIMEOUT_MS)
    return _properties_text(settings)


def _properties_text(settings: dict[str, str]) -> str:
    return "".join(f"{k}={v}\n" for k, v in settings.items())


def node_settings(data_dir: Path, node: Node, layout: ClusterLayout) -> dict[str, str]:
    """One node's settings. Internal topics and the defaults of created topics get the layout's
    replication; the transaction state log too (the stream layer's exactly-once writes need it)."""
    copies = layout.replication
    listeners = [f"PLAINTEXT://127.0.0.1:{node.port}"]
    if node.controller_port:
        listeners.append(f"CONTROLLER://127.0.0.1:{node.controller_port}")
    props = {
        "process.roles": "broker,controller" if node.controller_port else "broker",
        "node.id": str(node.node_id),
        "controller.quorum.voters": layout.voters,
        "listeners": ",".join(listeners),
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir / "logs"),
        "num.partitions": "1",
        "auto.create.topics.enable": "true",
        "default.replication.factor": str(copies.factor),
        "min.insync.replicas": str(copies.min_insync),
        "offsets.topic.replication.factor": str(copies.factor),
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": str(copies.factor),
        "transaction.state.log.min.isr": str(copies.min_insync),
        "transaction.state.log.num.partitions": "4",
        "share.coordinator.state.topic.replication.factor": str(copies.factor),
        "share.coordinator.state.topic.min.isr": str(copies.min_insync),
        "group.initial.rebalance.delay.ms": "0",
        # A dead or frozen worker's open transaction holds back every reader of the partitions it wrote
        # (read_committed) until the broker aborts it: checked every 10 s by default, so up to 10 s past
        # the transaction timeout; a healthy worker taking over its partitions waited meanwhile to rebuild
        # their state and was judged stuck too.
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": str(TIMED_OUT_TRANSACTION_CHECK_MS),
        "broker.session.timeout.ms": str(
            LONE_SESSION_TIMEOUT_MS if layout.lone else CLUSTER_SESSION_TIMEOUT_MS),
        "broker.heartbeat.interval.ms": "1000",
        "log.retention.hours": "168",
        "log.segment.bytes": str(256 * 1024 * 1024),
    }
    return props


def free_port_at(candidate: int) -> int:
    """``candidate`` when nothing holds it, else a free port the system picks.

    A client's outgoing connection can sit on a port next to the broker's (seen in CI: the controller
    could not bind, and the broker exited before the stack came up).
    """
    for port in (candidate, 0):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise BrokerError("no free port for a controller listener")


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@dataclass
class KafkaBroker:
    """A local broker process; use as a context manager or call start()/stop().

    Alone (no ``layout``) it is a single combined broker+controller whose controller port is chosen at
    each launch. As node ``node_id`` of a ``KafkaCluster`` it takes its ports from the layout and its
    cluster id from ``cluster_id_file``, shared by every node."""

    data_dir: Path
    port: int = 9092
    controller_port: int | None = None
    heap: str = "512m"
    process: subprocess.Popen[bytes] | None = None
    node_id: int = 1
    layout: ClusterLayout | None = None
    cluster_id_file: Path | None = None
    log_offset: int = 0  # where the current process's lines start in ``log_file``
    request_log: bool = False  # every request served, to ``requests_file``

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.data_dir / "kafka.log"

    @property
    def requests_file(self) -> Path:
        return self.data_dir / "kafka.log.requests"

    def _java(self) -> str:
        java_home = os.environ.get("JAVA_HOME")
        java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
        if not java:
            raise BrokerError(
                "java not found: install a JDK 17+ (e.g. apt-get install openjdk-17-jre-headless)"
            )
        return java

    def _layout(self) -> tuple[Node, ClusterLayout]:
        if self.layout is not None:
            return self.layout.nodes[self.node_id - 1], self.layout
        node = Node(1, self.port, self.controller_port or free_port_at(self.port + 1))
        return node, ClusterLayout((node,))

    def prepare(self, node: Node, layout: ClusterLayout) -> Path:
        """Write the config and format KRaft storage on first use; returns the properties file."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "server.properties"
        config.write_text(server_properties(self.data_dir.resolve(), node, layout))
        (self.data_dir / "log4j2.xml").write_text(
            log4j2_xml(self.log_file.resolve(), self.requests_file.resolve() if self.request_log else None))
        if not (self.data_dir / "logs" / "meta.properties").exists():
            cluster_id_file = self.cluster_id_file or self.data_dir / "cluster.id"
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
        watching the other roles meanwhile). After a crash of a lone node it waits first, about 3 s,
        for the crashed run to be fenced (``_fence_crashed_run``)."""
        if port_open("127.0.0.1", self.port):
            raise BrokerError(f"port {self.port} is already in use: another broker or service is there")
        logs = self.data_dir / "logs"
        crashed = (logs / "meta.properties").exists() and not (logs / ".kafka_cleanshutdown").exists()
        node, layout = self._layout()  # a lone node's controller port is picked here, once per launch
        config = self.prepare(node, layout)
        if crashed and layout.lone:
            self._fence_crashed_run(node, layout)
        self.log_offset = self.log_file.stat().st_size if self.log_file.exists() else 0
        self.process = subprocess.Popen(self._command("kafka.Kafka", str(config)), start_new_session=True)
        return self.process

    def _fence_crashed_run(self, node: Node, layout: ClusterLayout, timeout: float = 60.0) -> None:
        """Run the lone node as a controller alone until it has fenced the node's crashed run.

        A combined node restarted after a crash finds its old run still registered and unfenced, so its
        broker acts on that metadata: it leads its partitions and loads its coordinators before it may
        register (Kafka refuses a second registration until the old run's session expires) and before
        its listener serves. When the session expires the old run is fenced, every partition is
        leaderless for a moment, and Kafka skips the commit markers of a transaction caught between
        its prepare and its markers: they never reach any partition, so readers stop at that
        transaction and the worker's group cannot read its offsets (a stream layer wedged for good,
        seen in the chaos test). Fenced first, the restarted broker leads nothing until it has
        registered and serves, and the markers are written then.
        """
        config = self.data_dir / "fence.properties"
        config.write_text(fencing_properties(self.data_dir.resolve(), node, layout))
        seen = self.log_file.stat().st_size if self.log_file.exists() else 0
        fenced, active = FENCED_LINE.format(node_id=node.node_id), ACTIVE_LINE
        controller = subprocess.Popen(self._command("kafka.Kafka", str(config)), start_new_session=True)
        deadline = time.monotonic() + timeout
        session_s = FENCING_SESSION_TIMEOUT_MS / 1000
        try:
            active_at = None
            while time.monotonic() < deadline:
                if controller.poll() is not None:
                    raise BrokerError(f"the controller fencing a crashed run exited with "
                                      f"{controller.returncode}; see {self.log_file}")
                text = _read_from(self.log_file, seen)
                if fenced in text:
                    return
                if active_at is None and active in text:
                    active_at = time.monotonic()
                # Already fenced (it crashed before it was unfenced): no line comes, the session's
                # length says so.
                if active_at is not None and time.monotonic() - active_at > session_s + FENCED_LINE_MARGIN_S:
                    return
                time.sleep(0.2)
            raise BrokerError(f"the crashed run of broker {node.node_id} was not fenced within "
                              f"{timeout:.0f}s; see {self.log_file}")
        finally:
            _stop_process(controller, 30.0)

    def wait_ready(self, timeout: float, peers: Collection[int] = ()) -> None:
        """Ready means this node serves as a broker: its metadata lists it, and ``peers``, among the live
        (unfenced) brokers, not merely that its port is open (in a cluster it answers before it has caught
        up)."""
        from confluent_kafka.admin import AdminClient

        wanted = {self.node_id, *peers}
        deadline = time.monotonic() + timeout
        admin = None
        listed: set[int] = set()
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise BrokerError(f"broker exited with {self.process.returncode}; see {self.log_file}")
            if port_open("127.0.0.1", self.port):
                admin = admin or AdminClient({"bootstrap.servers": self.bootstrap, "log_level": 0})
                try:
                    listed = set(admin.list_topics(timeout=2).brokers)
                    if wanted <= listed:
                        return
                except Exception:  # noqa: BLE001 - librdkafka raises KafkaException while starting
                    pass
            time.sleep(0.2)
        missing = f" (live brokers it lists: {sorted(listed)}, wanted {sorted(wanted)})" if listed else ""
        raise BrokerError(f"broker not ready after {timeout:.0f}s{missing}; see {self.log_file}")

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM lets the broker flush and close its logs; SIGKILL only if it hangs."""
        if self.process is not None:
            _stop_process(self.process, timeout)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


FATAL_FAULT = "Encountered fatal fault"


class FatalFaultWatch:
    """A broker that logged a fatal fault and is still running ``limit_s`` later is stuck: the supervisor's
    health check for a broker role (``watch(started_at)``, the reason or None).

    Kafka's answer to a fatal fault is to exit the JVM, and that exit can hang for good: once, a SIGTERM
    that reached a broker two seconds into its start-up raced it into a fault (a metadata publisher
    not installed yet), and the process then sat in its exit, deaf to further SIGTERMs, its listeners
    closed, until it was killed 90 s later."""

    def __init__(self, broker: KafkaBroker, limit_s: float = 30.0) -> None:
        self._broker = broker
        self._limit_s = limit_s
        self._process: subprocess.Popen[bytes] | None = None
        self._read = 0
        self._faulted_at: float | None = None

    def __call__(self, _started_at: float) -> str | None:
        if self._broker.process is not self._process:  # a new process: its own lines only
            self._process, self._read, self._faulted_at = self._broker.process, self._broker.log_offset, None
        if self._faulted_at is None and self._broker.log_file.exists():
            with self._broker.log_file.open("rb") as log:
                log.seek(max(self._broker.log_offset, self._read - len(FATAL_FAULT)))  # a line read in half
                new = log.read()
                self._read = log.tell()
            if FATAL_FAULT.encode() in new:
                self._faulted_at = time.monotonic()
        if self._faulted_at is None or (waited := time.monotonic() - self._faulted_at) < self._limit_s:
            return None
        return f"it logged a fatal fault {waited:.0f}s ago and has not exited"


class KafkaCluster:
    """``nodes`` local brokers under ``data_dir`` (``node-<id>/`` each; a single node uses ``data_dir``
    itself, as before clusters existed). A data directory keeps the node count it was first started with:
    a different count would need a quorum change, so it is refused with the reason."""

    def __init__(self, data_dir: Path, port: int = 9092, nodes: int = 1, heap: str = "512m",
                 request_log: bool = False) -> None:
        self.data_dir = data_dir
        self.layout = ClusterLayout.plan(port, nodes)
        self._check_node_count(nodes)
        if nodes == 1:
            self.brokers = [KafkaBroker(data_dir, port, heap=heap, request_log=request_log)]
        else:
            self.brokers = [KafkaBroker(data_dir / f"node-{n.node_id}", n.port, heap=heap, node_id=n.node_id,
                                        layout=self.layout, cluster_id_file=data_dir / "cluster.id",
                                        request_log=request_log)
                            for n in self.layout.nodes]

    def _check_node_count(self, nodes: int) -> None:
        record = self.data_dir / "nodes"
        single = (self.data_dir / "logs" / "meta.properties").exists()
        before = int(record.read_text()) if record.exists() else (1 if single else None)
        if before is not None and before != nodes:
            raise BrokerError(f"{self.data_dir} holds a {before}-node Kafka cluster, not {nodes}: start it "
                              f"with {before} node(s), or use another data directory")
        self.data_dir.mkdir(parents=True, exist_ok=True)
        record.write_text(str(nodes))

    @property
    def bootstrap(self) -> str:
        return self.layout.bootstrap

    def role_name(self, broker: KafkaBroker) -> str:
        """``broker`` for a single node, ``broker-<id>`` in a cluster (the supervisor's role names)."""
        return "broker" if len(self.brokers) == 1 else f"broker-{broker.node_id}"

    def start(self, wait: float = 120.0) -> KafkaCluster:
        """Launch every node, then wait for each: a quorum forms only once most controllers run."""
        for broker in self.brokers:
            broker.launch()
        self.wait_ready(wait)
        return self

    def wait_ready(self, timeout: float) -> None:
        """Every node lists every node as a live broker: a topic created sooner, with a replica on a node
        the others do not list yet, can be refused (``ensure_topics`` retries that too)."""
        deadline = time.monotonic() + timeout
        everyone = [broker.node_id for broker in self.brokers]
        for broker in self.brokers:
            broker.wait_ready(max(1.0, deadline - time.monotonic()), peers=everyone)

    def stop(self, timeout: float = 60.0) -> None:
        """SIGTERM to every node at once (each shuts down cleanly), then wait."""
        for broker in self.brokers:
            if broker.process is not None and broker.process.poll() is None:
                broker.process.send_signal(signal.SIGTERM)
        for broker in self.brokers:
            broker.stop(timeout)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stop_process(process: subprocess.Popen[bytes], timeout: float) -> None:
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _read_from(path: Path, offset: int) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")


def _kafka_uuid() -> str:
    """Kafka's cluster ids are URL-safe base64 of 16 random bytes without padding. Like Kafka's own
    generator, never start with '-': the storage tool's argument parser would read it as an option."""
    import base64

    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def run_foreground(data_dir: Path, port: int, heap: str, nodes: int = 1, request_log: bool = False) -> int:
    """``clawr1 kafka``: run until SIGINT/SIGTERM (or a node exits), then stop every node cleanly."""
    cluster = KafkaCluster(data_dir, port, nodes, heap, request_log)
    started = time.monotonic()
    cluster.start()
    print(
        f"kafka ready on {cluster.bootstrap} in {time.monotonic() - started:.1f}s "
        f"({nodes} node(s), replication {cluster.layout.replication.factor}; data: {data_dir})",
        flush=True,
    )
    stop = stop_on_signals()
    processes = [b.process for b in cluster.brokers if b.process is not None]
    while not stop.wait(0.2) and all(p.poll() is None for p in processes):
        pass
    cluster.stop()
    return 0 if stop.is_set() else next((p.returncode or 1 for p in processes if p.returncode), 1)
