"""State that ends, on the real worker: once every trajectory, conversation and group of the recorded
mix has been left alone for ``CLAWR1_STREAMS_STATE_TTL_S``, the worker's changelog holds nothing of them
but small markers (and where the expiry wheel stands); nothing it published is taken back."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from confluent_kafka import TopicPartition

from clawr1.core.kafka_io import make_consumer
from clawr1.streams import quix_compat
from tests.integration.streams.conftest import PARTITIONS, Outputs, WorkerRun, settled
from tests.integration.streams.mix import EXPECTED_STEPS, MIX
from tests.support.waiting import wait_until

TTL_S = 2


def live_state(bootstrap: str, topic: str) -> tuple[Counter[str], Counter[str]]:
    """Live keys per namespace in a compacted changelog, read whole (the last record of a key wins, a
    tombstone removes it), and the keys ever written there per namespace."""
    consumer = make_consumer(bootstrap, "expiry-test-reader")
    partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
    live: dict[bytes, bool] = {}
    ever: set[bytes] = set()
    done: set[int] = {p for p, end in ends.items() if end == 0}
    try:
        while len(done) < len(ends):
            for message in consumer.consume(1000, 1.0):
                if message.error() is not None:
                    continue
                key = message.key() or b""
                if message.value() is None:
                    live.pop(key, None)
                else:
                    live[key] = True
                    ever.add(key)
                if message.offset() + 1 >= ends[message.partition()] - 1:  # a transaction marker may end it
                    done.add(message.partition())
    finally:
        consumer.close()
    return Counter(namespace(key) for key in live), Counter(namespace(key) for key in ever)


def namespace(key: bytes) -> str:
    """A state key is Quix's prefix, then ours (``quix_compat.STATE_PREFIX``), then ``<namespace>/``."""
    ours = key[key.index(quix_compat.STATE_PREFIX) + len(quix_compat.STATE_PREFIX):]
    return ours.lstrip(b"|:").split(b"/", 1)[0].decode(errors="replace")


def test_the_mix_leaves_only_markers_once_its_state_expired(
        worker_runs: Callable[[], tuple[WorkerRun, Outputs]]) -> None:
    run, outputs = worker_runs()
    run.env["CLAWR1_STREAMS_STATE_TTL_S"] = str(TTL_S)
    run.start()
    run.produce(MIX)
    outputs.wait_for(settled, 90, run)
    changelog = quix_compat.changelog_topic(run.app_id, run.topics.work)

    def only_markers_left() -> bool:
        return set(live_state(run.bootstrap, changelog)[0]) <= {"Z", "E"}

    def left() -> str:
        return f"state expired; left: {live_state(run.bootstrap, changelog)[0]}\n{run.tail()}"

    wait_until(only_markers_left, 60, interval=1.0, message=left)
    after, ever = live_state(run.bootstrap, changelog)
    assert {"R", "T", "X", "G", "GC"} <= set(ever)  # the mix's conversations, trajectories, groups were held
    # Per partition the wheel's cursor, and the bucket (count and slice) where its markers' checks wait.
    assert after["E"] <= 3 * PARTITIONS
    assert set(outputs.latest_steps()) == set(EXPECTED_STEPS)  # nothing published was taken back
    assert run.process is not None and run.process.poll() is None
