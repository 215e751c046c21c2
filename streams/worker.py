"""Run the stream worker (``clawr1 worker``, ``clawr1 up``): a blocking Quix Streams application.

Start several with the same app id (``CLAWR1_STREAMS_APP_ID``) and they split the partitions; give each
its own ``CLAWR1_STREAMS_INSTANCE_ID`` (``clawr1 up`` does). ``python -m clawr1.streams.worker`` runs one
from the ``CLAWR1_*`` environment and prints a line once it holds its partitions.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from clawr1.core.kafka_io import ensure_topics
from clawr1.core.settings import Settings, load_settings
from clawr1.streams import quix_compat
from clawr1.streams.app import StreamsApp
from clawr1.streams.config import StreamConfig

READY_LINE = "clawr1 streams worker ready"


def run_worker(settings: Settings, ready: Callable[[], None] | None = None,
               config: StreamConfig | None = None) -> int:
    """Block until SIGINT/SIGTERM (clean stop, 0) or a fatal error (raised).

    Creates every topic the worker reads and writes first, all with one partition count: the worker
    keeps one state store per partition for all its inputs; then its state changelog with that count
    (compacted, as its role's configs say: ``kafka_io.topic_config``; ``quix_compat.changelog_topic`` says
    why it is not left to Quix).
    """
    config = config or StreamConfig.from_settings(settings)
    served = ensure_topics(config.bootstrap, config.topics.all_names(), config.partitions,
                           replication=config.replication)  # counts as the broker has them (may predate ours)
    counts = {name: served[name] for name in config.topics.inputs()}
    if len(set(counts.values())) != 1:
        raise SystemExit(f"the worker's input topics must have one partition count, found {counts}")
    ensure_topics(config.bootstrap, [quix_compat.changelog_topic(config.app_id, config.topics.work)],
                  counts[config.topics.work], replication=config.replication)
    config.data_dir.mkdir(parents=True, exist_ok=True)
    StreamsApp(config, counts[config.topics.work]).run(ready)
    return 0


def main() -> int:
    return run_worker(load_settings(), ready=lambda: print(READY_LINE, flush=True))


if __name__ == "__main__":
    sys.exit(main())
