"""The stream worker as a Quix Streams application: exactly-once, one transaction per checkpoint.

Inputs are the four raw topics and the worker's own work topic (``clawr1.core.topics.WORK``); each
message (one record or an envelope of many, ``clawr1.schemas.batch``) is decoded once and its records
handed to the ``Processor``, each with its ``Origin``. Every ``commit_interval_ms`` Quix closes a
checkpoint: our ``CheckpointFlush`` sink writes back the state the checkpoint changed and sends its
outputs as envelopes, then Quix produces the state changelogs and commits them, the outputs and the
input offsets in one Kafka transaction. A crash anywhere before that commit aborts the whole
checkpoint, and the next owner of its partitions starts from the last commit with the state of that
commit: nothing lost, nothing twice, with no bookkeeping of our own.

Workers with the same app id (the consumer group) split the partitions; Quix assigns every topic's
partition ``p`` to one worker (range assignment), which is why one store per partition can serve all
inputs. A worker slot (``instance_id``) is also its transactional id: a restarted worker fences its
predecessor's open transaction at once instead of leaving readers waiting for the broker to time it out.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, cast

import rocksdict
from quixstreams import Application
from quixstreams.context import message_context
from quixstreams.sinks import BaseSink
from quixstreams.state.rocksdb import RocksDBOptions

from clawr1.core import topics
from clawr1.core.kafka_io import COMPRESSION, make_admin, make_producer
from clawr1.core.metrics import (
    STREAM_CHECKPOINT_SECONDS,
    STREAM_DEAD_LETTERS,
    STREAM_MESSAGES_OUT,
    STREAM_RECORDS_IN,
    STREAM_RECORDS_OUT,
    STREAM_STATE_WRITES,
)
from clawr1.core.thin_batch import ThinWait
from clawr1.schemas.codec import DecodeError, EncodeError, codec_for
from clawr1.streams import expiry, messages, quix_compat
from clawr1.streams.commit_pacing import CommitPacing
from clawr1.streams.commit_watchdog import CommitWatchdog
from clawr1.streams.config import StreamConfig
from clawr1.streams.origin import Origin
from clawr1.streams.outbox import Envelope, Outbox
from clawr1.streams.processor import Processor
from clawr1.streams.store import Store
from clawr1.streams.tokenization import Retokenizer
from clawr1.streams.turns import InvalidEvent

log = logging.getLogger(__name__)


def _same(data: bytes) -> bytes:
    """State values are encoded by ``clawr1.streams.store``; Quix stores the bytes as given."""
    return data


def _text(key: Any) -> str | None:
    if key is None:
        return None
    return key.decode("utf-8", "backslashreplace") if isinstance(key, bytes) else str(key)


class CheckpointFlush(BaseSink):
    """Runs at every checkpoint commit, before Quix writes the changelogs and commits the transaction."""

    def __init__(self, flush: Callable[[], None]) -> None:
        super().__init__(on_client_connect_success=lambda: None)
        self._flush = flush

    def add(self, *args: Any, **kwargs: Any) -> None:
        """Rows carry nothing for this sink: the outputs are gathered by the processor's outbox."""

    def flush(self) -> None:
        self._flush()


def state_dir(config: StreamConfig) -> Path:
    """Where this worker's RocksDB partitions live: one folder per worker slot. Workers of one machine
    that shared a folder waited on each other's partition locks (up to 30 s in Quix) whenever a partition
    moved while its last owner still held it open (a frozen worker, one slow to revoke); the stall
    watch took the waiter for stuck and killed it, and the group rebalanced again. A partition new to a
    slot is rebuilt from its changelog, as on any other machine."""
    return config.data_dir / config.app_id / (config.instance_id or "")


@dataclass(frozen=True)
class _ExpiringStateOptions(RocksDBOptions):
    """Quix's RocksDB options, plus compaction of the files that expiry fills with deletions: without
    it, a store whose keys all expired kept its files (72 MB after a short soak whose live state was
    14 KB) until unrelated writes happened to compact them."""

    def to_options(self) -> rocksdict.Options:
        options = super().to_options()
        # A file is compacted once 50 of any 100 entries in a row, or half of all, are deletions.
        options.add_compact_on_deletion_collector_factory(100, 50, 0.5)
        return options


def rocksdb_options(config: StreamConfig) -> RocksDBOptions:
    """RocksDB's memory, sized for a worker: Quix's defaults (a 1 GiB block cache, 64 MiB x 3 memtables
    per partition store) let a busy worker's RSS grow past a GB. Writes land in small memtables that
    flush often; expired state is compacted away (``_ExpiringStateOptions``). The write-ahead log keeps
    up to eight memtables' worth (64 MiB a partition by default, which a seldom-full column family pins
    even with nothing live left): bounded at two, workers that restarted while a broker was down stayed
    stuck in the chaos tests."""
    write_buffer = config.rocksdb_write_buffer_mb * 1024 * 1024
    return _ExpiringStateOptions(dumps=_same, loads=_same,
                                 block_cache_size=config.rocksdb_cache_mb * 1024 * 1024,
                                 write_buffer_size=write_buffer, max_write_buffer_number=2,
                                 target_file_size_base=4 * write_buffer, max_total_wal_size=8 * write_buffer)


def kafka_overrides(config: StreamConfig, client_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the worker sets on Quix's consumer and producer beyond Quix's own exactly-once settings."""
    consumer: dict[str, Any] = {
        "client.id": client_id,
        "session.timeout.ms": int(config.session_timeout_s * 1000),
        "heartbeat.interval.ms": int(min(3.0, config.session_timeout_s / 3) * 1000),
    }
    producer: dict[str, Any] = {
        "partitioner": "murmur2_random",  # Java's: where the gateway and the proxy put a key
        "transaction.timeout.ms": config.transaction_timeout_ms,
        "linger.ms": config.linger_ms,
        "compression.type": COMPRESSION,
        "message.max.bytes": 16 * 1024 * 1024,
    }
    if config.instance_id:
        consumer["group.instance.id"] = config.instance_id
        producer["transactional.id"] = f"{config.app_id}-{config.instance_id}"
    return consumer, producer


class StreamsApp:
    """One worker: a Quix application over the stream inputs, with the processor behind them."""

    def __init__(self, config: StreamConfig, partitions: int) -> None:
        self.config = config
        self.partitions = partitions
        self.codec = codec_for(config.schema_registry_url)
        self.client_id = f"{config.app_id}-{config.instance_id or uuid.uuid4().hex[:8]}"
        consumer, producer = kafka_overrides(config, self.client_id)
        self.app = Application(
            broker_address=config.bootstrap,
            consumer_group=config.app_id,
            auto_offset_reset="earliest",
            processing_guarantee="exactly-once",
            commit_interval=config.commit_interval_ms / 1000,
            # A checkpoint closes (its outputs become visible) only when a poll returns: with Quix's 1 s
            # default, the last records before a pause waited up to 1 s in an open transaction.
            consumer_poll_timeout=min(0.05, config.commit_interval_ms / 2000),
            commit_every=config.commit_every,
            state_dir=str(state_dir(config)),
            rocksdb_options=rocksdb_options(config),
            consumer_extra_config=consumer,
            producer_extra_config=producer,
            loglevel=cast(Literal["CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET"],
                          config.log_level.upper()),
        )
        names = config.topics
        self.outbox = Outbox(partitions)
        # One store for every input: the work topic's dataframe registers it (see the module doc).
        self.work = self._dataframe(names.work)
        self.store = Store(lambda partition: quix_compat.partition_state(self.work, partition))
        retokenizer = Retokenizer.load(config.tokenizer) if config.tokenizer else None
        self.processor = Processor(config, partitions, self.store, self.outbox, retokenizer)
        self.work.update(lambda value, key, timestamp, headers, state: self._on_work(value, key, timestamp),
                         metadata=True, stateful=True)
        readers: list[tuple[str, str, Callable[[str | None, dict[str, Any], Origin], None]]] = [
            (names.raw_llm, topics.RAW_LLM.schema, self.processor.on_llm_call),
            (names.raw_events, topics.RAW_EVENTS.schema, self.processor.on_service_event),
            (names.raw_steps, topics.RAW_STEPS.schema,
             lambda _, record, origin: self.processor.on_whitebox_step(record, origin)),
            (names.raw_feedback, topics.RAW_FEEDBACK.schema,
             lambda _, record, origin: self.processor.on_feedback(record, origin)),
        ]
        for name, schema, handle in readers:
            self._dataframe(name).update(self._reader(schema, handle), metadata=True)
        self.work.sink(CheckpointFlush(self._flush))
        # A commit cannot succeed once the broker timed its transaction out; one still running well past
        # that is wedged (commit_watchdog's doc says where it was seen) and the worker leaves.
        self.watchdog = CommitWatchdog(3 * config.transaction_timeout_ms / 1000)
        quix_compat.wrap_commits(self.work, self.watchdog.watch)
        thin = ThinWait(config.thin_commit_interval_ms / 1000, config.thin_commit_records)
        self.pacing = CommitPacing(config.busy_commit_interval_ms / 1000, config.commit_every, thin,
                                   config.commit_interval_ms / 1000)
        quix_compat.wrap_commits(self.work, self.pacing.wrap(partial(quix_compat.open_checkpoint, self.work)))
        self.ticker = _Ticker(config, partitions, self.processor.clock.bucket_ms / 1000)

    def _dataframe(self, name: str) -> Any:
        topic = self.app.topic(name, key_deserializer="bytes", value_deserializer="bytes",
                               key_serializer="bytes", value_serializer="bytes")
        return self.app.dataframe(topic)

    # ------------------------------------------------------------------ events
    def _origin(self, key: Any, value: bytes | None, timestamp: int) -> Origin:
        ctx = message_context()
        return Origin(ctx.topic, ctx.partition, ctx.offset, key, value, timestamp)

    def _reader(self, schema: str, handle: Callable[[str | None, dict[str, Any], Origin], None]
                ) -> Callable[[Any, Any, int, Any], None]:
        """A raw topic's handler: decode once, then each record on its own (a bad one is dead-lettered)."""
        def on_message(value: bytes | None, key: Any, timestamp: int, headers: Any) -> None:
            origin = self._origin(key, value, timestamp)
            try:
                if value is None:
                    raise InvalidEvent("empty message (no value)")
                # Token ids as int32 arrays: the stream logic checks, hashes, merges and packs them again
                # without a Python int per token (``clawr1.streams.turns.TokenIds``).
                records = self.codec.decode_records(value, expect=schema, int_arrays=True)
            except (DecodeError, InvalidEvent) as exc:
                self.pacing.fed()
                self._dead_letter(origin, "decode" if isinstance(exc, DecodeError) else "validate", str(exc))
                return
            self.pacing.fed(max(1, len(records)))
            STREAM_RECORDS_IN.labels(topic=origin.topic).inc(len(records))
            envelope = self.codec.writer_of(value).name != schema
            # An envelope's records each carry their own key fields; only a lone record has the message's.
            text_key = None if envelope else _text(key)
            for index, record in enumerate(records):
                at = replace(origin, value=None, index=index,
                             cite=partial(self.codec.encode, schema, record)) if envelope else origin
                self._guarded(at, "normalize", partial(handle, text_key, record, at))
        return on_message

    def _on_work(self, value: bytes | None, key: Any, timestamp: int) -> None:
        origin = self._origin(key, value, timestamp)
        try:
            batch = messages.unpack(value or b"")
        except ValueError as exc:
            self.pacing.fed()
            self._dead_letter(origin, "decode", f"unreadable internal message: {exc}")
            return
        self.pacing.fed(max(1, len(batch)))
        STREAM_RECORDS_IN.labels(topic=origin.topic).inc(len(batch))
        for entry_key, message in batch:
            self._guarded(origin, "join", partial(self.processor.on_work, entry_key, message, origin))

    def _guarded(self, origin: Origin, stage: str, work: Callable[[], None]) -> None:
        """Run ``work``; whatever an event does wrong ends in the dead-letter topic, never a crash."""
        try:
            work()
        except DecodeError as exc:
            self._dead_letter(origin, "decode", str(exc))
        except InvalidEvent as exc:
            self._dead_letter(origin, "validate", str(exc))
        except Exception as exc:  # noqa: BLE001 - any bug on one event must not stop the worker
            log.exception("%s failed on %s[%s]@%s", stage, origin.topic, origin.partition, origin.offset)
            self._dead_letter(origin, stage, f"{type(exc).__name__}: {exc}")

    def _dead_letter(self, origin: Origin, stage: str, reason: str) -> None:
        self.processor.dead_letter(stage, reason, origin)
        STREAM_DEAD_LETTERS.labels(stage=stage).inc()

    # ------------------------------------------------------------------ checkpoints
    def _flush(self) -> None:
        started = time.monotonic()
        STREAM_STATE_WRITES.inc(self.processor.flush())
        names = self.config.topics
        try:
            envelopes = self._envelopes()
        except EncodeError as exc:  # a bug in what the join built: find the records, keep the rest
            log.error("an output envelope did not encode (%s); sending its records one by one", exc)
            envelopes = self._salvage()
        for envelope in envelopes:
            quix_compat.produce(self.work, envelope.topic, envelope.value, envelope.key, envelope.partition)
            STREAM_MESSAGES_OUT.labels(topic=envelope.topic).inc()
        STREAM_RECORDS_OUT.labels(topic=names.steps).inc(len(self.outbox.steps))
        STREAM_RECORDS_OUT.labels(topic=names.prefix_nodes).inc(len(self.outbox.nodes))
        self.outbox.clear()
        STREAM_CHECKPOINT_SECONDS.observe(time.monotonic() - started)

    def _salvage(self) -> list[Envelope]:
        """Envelopes of the records that encode; a dead letter (stage ``join``) for each that does not."""
        bad: list[tuple[str, str]] = []
        for step_id, record in list(self.outbox.steps.items()):
            try:
                self.codec.encode("step", record)
            except EncodeError as exc:
                bad.append((step_id, str(exc)))
                del self.outbox.steps[step_id]
        for slot, row in list(self.outbox.nodes.items()):
            try:
                self.codec.encode("prefix_node", row)
            except EncodeError as exc:
                bad.append((f"{slot[0]}/{slot[1]}", str(exc)))
                del self.outbox.nodes[slot]
        origin = Origin(self.config.topics.work, -1, -1, None, None, int(time.time() * 1000))
        for name, reason in bad:
            self._dead_letter(origin, "join", f"output {name} does not match its schema: {reason}")
        return self._envelopes()

    def _envelopes(self) -> list[Envelope]:
        """What the outbox holds, encoded for the topics it goes to."""
        names = self.config.topics
        return self.outbox.envelopes(self.codec, names.steps, names.prefix_nodes, names.work, names.dlq)

    # ------------------------------------------------------------------ running
    def run(self, ready: Callable[[], None] | None = None) -> None:
        """Block until SIGINT/SIGTERM; ``ready`` is called once this worker holds its partitions."""
        if ready is not None:
            _AssignmentWatch(self.config.bootstrap, self.config.app_id, self.client_id, ready).start()
        self.watchdog.start()
        self.ticker.start()
        try:
            self.app.run()
        finally:
            self.ticker.stop()
            self.watchdog.stop()


class _Ticker:
    """Sends every partition of the work topic a ``tick`` every ``period_s``, so that each checkpoint
    that sweeps expired state (``clawr1.streams.expiry``) also happens on an idle stack: Quix closes a
    checkpoint with no input without running it. Ticks are outside the worker's transactions; a lost one
    only delays a sweep."""

    def __init__(self, config: StreamConfig, partitions: int, period_s: float) -> None:
        self._config, self._partitions, self._period_s = config, partitions, period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._tick, name="clawr1-expiry-tick", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _tick(self) -> None:
        producer = make_producer(self._config.bootstrap, **{"linger.ms": 50})
        tick = messages.pack([("", messages.message(expiry.TICK))])
        try:
            while not self._stop.wait(self._period_s):
                for partition in range(self._partitions):
                    producer.produce(self._config.topics.work, tick, partition=partition)
                producer.poll(0)
        finally:
            producer.flush(5)


class _AssignmentWatch:
    """Calls ``ready`` once the consumer group shows this worker's member with partitions assigned."""

    def __init__(self, bootstrap: str, group: str, client_id: str, ready: Callable[[], None]) -> None:
        self._thread = threading.Thread(target=self._watch, name="clawr1-ready", daemon=True)
        self._bootstrap, self._group, self._client_id, self._ready = bootstrap, group, client_id, ready

    def start(self) -> None:
        self._thread.start()

    def _watch(self) -> None:
        admin = make_admin(self._bootstrap)
        while True:
            try:
                described = admin.describe_consumer_groups([self._group])[self._group].result(10)
                if any(m.client_id == self._client_id and m.assignment.topic_partitions
                       for m in described.members):
                    self._ready()
                    return
            except Exception as exc:  # noqa: BLE001 - the broker may not know the group yet
                log.debug("waiting for the group %s: %s", self._group, exc)
            time.sleep(0.2)
