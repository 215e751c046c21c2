"""Every use of Quix Streams beyond its documented examples, in one place, pinned by a test.

The worker keeps one state store per partition for all its inputs and writes its outputs in batches
at the end of each checkpoint, inside the checkpoint's Kafka transaction. Quix's documented surface
gives each dataframe a ``State`` scoped to the current message's key, and produces per row; so the
worker reaches for what lies underneath, public names that Quix's own ``stateful`` wrapper and sinks
use:

- the checkpoint's store transaction of a partition (``StreamingDataFrame.processing_context
  .checkpoint.get_store_transaction(...).as_state(...)``): the same ``State`` protocol, without the
  per-key prefix;
- the application's transactional producer (``processing_context.producer``), called from a sink's
  ``flush`` (which Quix runs before the changelogs are produced and the transaction commits);
- the processing context's ``commit_checkpoint``, wrapped (on that one instance) so that a commit that
  never returns is seen (``clawr1.streams.commit_watchdog``) and a due checkpoint stays open while input
  keeps coming (``clawr1.streams.commit_pacing``, which tells checkpoints apart by the context's
  ``checkpoint``);
- the name Quix gives a store's changelog topic, so the worker can create it before Quix looks for it
  (``changelog_topic``);
- ``RocksDBOptions.to_options``, extended by the worker's options with a compaction rule for the files
  that expired state fills with deletions (``clawr1.streams.app``).

``tests/unit/streams/test_streams_quix_compat.py`` checks that every name in ``PINNED`` exists on the
installed version, so an upgrade that renames one fails there with this module named, not in production.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from quixstreams.dataframe import StreamingDataFrame

from clawr1.core import pins

# (module, attribute path) this module relies on; see the module doc.
PINNED: tuple[pins.Pin, ...] = (
    ("quixstreams.dataframe.dataframe", "StreamingDataFrame.processing_context"),
    ("quixstreams.dataframe.dataframe", "StreamingDataFrame.stream_id"),
    ("quixstreams.processing.context", "ProcessingContext.checkpoint"),
    ("quixstreams.processing.context", "ProcessingContext.producer"),
    ("quixstreams.processing.context", "ProcessingContext.commit_checkpoint"),
    ("quixstreams.checkpointing.checkpoint", "Checkpoint.get_store_transaction"),
    ("quixstreams.state.base.transaction", "PartitionTransaction.as_state"),
    ("quixstreams.internal_producer", "InternalProducer.produce"),
    # The worker's RocksDB options add a compaction rule to the options Quix builds (streams/app.py).
    ("quixstreams.state.rocksdb.options", "RocksDBOptions.to_options"),
)

STATE_PREFIX = b"clawr1"
DEFAULT_STORE = "default"


def changelog_topic(app_id: str, stream_topic: str, store: str = DEFAULT_STORE) -> str:
    """The changelog Quix keeps for ``store`` of the dataframe over ``stream_topic`` in app ``app_id``.

    Quix creates a missing changelog and at once reads its metadata and configs back; a broker of a
    cluster that has not caught up yet answers that it has no such topic, and the worker dies while
    starting. Created beforehand by ``ensure_topics`` (which waits until the cluster serves it), the
    topic is simply found. ``tests/integration/streams`` checks Quix uses exactly this name."""
    return f"changelog__{app_id}--{stream_topic}--{store}"


def missing_names(pinned: tuple[pins.Pin, ...] = PINNED) -> list[str]:
    """The pinned names the installed Quix Streams lacks (``module:Class.attr``)."""
    return pins.missing_names(pinned)


def partition_state(sdf: StreamingDataFrame, partition: int) -> Any:
    """The ``State`` of ``sdf``'s store for ``partition`` in the current checkpoint (bytes keys)."""
    transaction = sdf.processing_context.checkpoint.get_store_transaction(
        stream_id=sdf.stream_id, partition=partition)
    return transaction.as_state(prefix=STATE_PREFIX)


def produce(sdf: StreamingDataFrame, topic: str, value: bytes, key: bytes | None = None,
            partition: int | None = None) -> None:
    """Produce with the application's producer: inside the open transaction under exactly-once."""
    sdf.processing_context.producer.produce(topic=topic, value=value, key=key, partition=partition)


def open_checkpoint(sdf: StreamingDataFrame) -> object:
    """The checkpoint now open in ``sdf``'s application (a new object after each commit)."""
    return sdf.processing_context.checkpoint


def wrap_commits(sdf: StreamingDataFrame, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Route every checkpoint commit of ``sdf``'s application (the timed one and the one on a revoke)
    through ``wrap(commit)``: Quix looks the method up on its processing context at each call."""
    context = sdf.processing_context
    setattr(context, "commit_checkpoint", wrap(context.commit_checkpoint))  # noqa: B010 - an instance attribute
