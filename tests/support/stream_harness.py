"""The stream logic without Kafka, for the streams unit tests and the processor benchmark: a processor over
in-memory partition stores that counts its writes, fed events one at a time, its checkpoints delivering
the worker's own messages to their partitions as the work topic would."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from clawr1.core.routing import partition_of
from clawr1.schemas.codec import AvroCodec
from clawr1.streams import messages
from clawr1.streams.config import StreamConfig
from clawr1.streams.origin import Origin
from clawr1.streams.outbox import Envelope, Outbox
from clawr1.streams.processor import Processor
from clawr1.streams.store import Store

PARTITIONS = 4


class CountingStore(dict[bytes, Any]):
    """A partition's store as the Quix ``State`` offers it, counting writes (changelog records): those of
    the expiry wheel (namespace ``E``, at most two per partition per bucket) apart."""

    writes = 0
    wheel_writes = 0

    def get(self, key: bytes, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(key, default)

    def set(self, key: bytes, value: Any) -> None:
        self[key] = value
        self._count(key)

    def delete(self, key: bytes) -> None:
        self.pop(key, None)
        self._count(key)

    @staticmethod
    def _count(key: bytes) -> None:
        if key.startswith(b"E/"):
            CountingStore.wheel_writes += 1
        else:
            CountingStore.writes += 1


START_MS = 1_800_000_000_000  # the harness's clock: records carry the time they were written


class Harness:
    """Events in, checkpoints, and the worker's own messages delivered to their partitions."""

    def __init__(self, codec: AvroCodec | None = None) -> None:
        """``codec`` given: every checkpoint's outputs are also kept encoded, as they would leave, in
        ``published``."""
        CountingStore.writes = CountingStore.wheel_writes = 0
        self.partitions = [CountingStore() for _ in range(PARTITIONS)]
        self.outbox = Outbox(PARTITIONS)
        self.config = StreamConfig("k:1", Path("/unused"))
        self.now_ms = START_MS
        self.processor = self._processor()
        self.steps: dict[str, dict[str, Any]] = {}
        self.hops = 0
        self.codec = codec
        self.published: list[Envelope] = []
        self.dead_letters: list[dict[str, Any]] = []  # every checkpoint's
        self.nodes: list[dict[str, Any]] = []  # every checkpoint's prefix-tree rows

    def _processor(self) -> Processor:
        processor = Processor(self.config, PARTITIONS, Store(lambda p: self.partitions[p]), self.outbox)
        processor.now_ms = lambda: self.now_ms
        return processor

    def restart(self) -> None:
        """A new processor over the same stores, as after a worker restart."""
        self.processor = self._processor()

    @staticmethod
    def origin_at(partition: int) -> Origin:
        """An event of ``partition``."""
        return Origin("t", partition, 0, None, b"x", 0)

    def whitebox(self, record: dict[str, Any]) -> None:
        origin = self.origin_at(partition_of(record["trajectory_id"], PARTITIONS))
        self.processor.on_whitebox_step(record, origin)

    def llm(self, record: dict[str, Any], key: str) -> None:
        self.processor.on_llm_call(key, record, self.origin_at(partition_of(key, PARTITIONS)))

    def feedback(self, record: dict[str, Any]) -> None:
        self.processor.on_feedback(record, self.origin_at(partition_of(record["target_id"], PARTITIONS)))

    def checkpoint(self) -> None:
        """Flush, keep the published steps, and deliver the worker's messages (more checkpoints)."""
        while True:
            self.processor.flush()
            if self.codec is not None:
                self.published += self.outbox.envelopes(self.codec, "steps", "nodes", "work", "dead")
            for record in self.outbox.steps.values():
                held = self.steps.get(record["step_id"])
                if held is None or held["version"] <= record["version"]:
                    self.steps[record["step_id"]] = record
            self.dead_letters += [record for _, record in self.outbox.dead_letters]
            self.nodes += list(self.outbox.nodes.values())
            internal = dict(self.outbox.internal)
            self.outbox.clear()
            if not internal:
                return
            for partition, sent in internal.items():
                self.hops += 1
                for key, message in messages.unpack(messages.pack(sent)):  # as the work topic carries them
                    self.processor.on_work(key, message, self.origin_at(partition))


def decoded_state(harness: Harness, prefix: bytes) -> dict[bytes, Any]:
    """Every state value under ``prefix`` (a namespace's ``X/``), decoded, across the harness's partitions."""
    return {k: orjson.loads(v) for p in harness.partitions for k, v in p.items() if k.startswith(prefix)}
