"""Entry points of the pool sink: in a thread of the process that owns the pool, or as its own process.

``python -m clawr1.sinks.runner`` runs ``run_sink_process(load_settings())`` (what ``clawr1 sink`` calls).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from clawr1.core.settings import Settings, load_settings
from clawr1.core.signals import stop_on_signals
from clawr1.pool.retention import migrate_with_retention
from clawr1.pool.store import PoolStore
from clawr1.schemas.codec import codec_for
from clawr1.sinks.config import SinkConfig
from clawr1.sinks.pool_sink import PoolSink, SinkStats


def run_sink(settings: Settings, store: PoolStore, stop: threading.Event,
             ready: Callable[[], None] | None = None, config: SinkConfig | None = None) -> SinkStats:
    """Consume the curated topics into ``store`` until ``stop`` is set; ``ready`` fires once subscribed.

    The store is migrated first, so the sink can start against an empty pool.
    """
    store.migrate()
    sink = PoolSink(settings.bootstrap_servers, store, config or SinkConfig.from_settings(settings),
                    codec_for(settings.schema_registry_url), settings.topic_partitions)
    return sink.run(stop, ready)


def run_sink_process(settings: Settings) -> SinkStats:
    """Blocking: open the pool named by the settings and sink into it until SIGINT/SIGTERM."""
    stop = stop_on_signals()
    with PoolStore(settings.pool_dsn, cluster=settings.clickhouse_cluster) as store:
        migrate_with_retention(store, settings)  # the sink process owns the pool: it sets the TTLs
        return run_sink(settings, store, stop)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run_sink_process(load_settings())
