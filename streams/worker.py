"""Run the stream processors as a blocking Faust worker (``clawr1 worker``, ``clawr1 up``).

Start several with the same app id (``CLAWR1_STREAMS_APP_ID``) and they split the partitions.
``python -m clawr1.streams.worker`` runs one from the ``CLAWR1_*`` environment and prints a line when
it is ready (tables recovered, agents running).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from typing import Any

import faust

from clawr1.core.kafka_io import ensure_topics
from clawr1.core.settings import Settings, load_settings
from clawr1.streams.app import StreamsApp
from clawr1.streams.config import StreamConfig

READY_LINE = "clawr1 streams worker ready"


class _Worker(faust.Worker):
    """Faust's worker, calling ``ready`` once startup (table recovery included) has finished."""

    def __init__(self, app: faust.App, ready: Callable[[], None] | None, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._ready = ready
        # Faust's terminal spinner lowers the root logger to DEBUG to spin on every record, so every
        # debug call in aiokafka and Faust (several per message) would build a log record.
        self.spinner = None

    async def on_startup_finished(self) -> None:
        await super().on_startup_finished()
        if self._ready is not None:
            self._ready()


def ensure_changelogs(streams: StreamsApp, timeout: float = 30.0) -> None:
    """Create the tables' changelog topics, compacted as Faust would, before Faust starts.

    Faust creates them during its own start-up, but on a fresh broker its consumer can then see
    them with 0 partitions for a while, and the first write to a table fails Faust's partition
    check (``PartitionsMismatch``). Created first (and waited for until served), they are complete
    before Faust looks.
    """
    config = streams.config
    names = [table.changelog_topic.get_topic_name() for table in streams.app.tables.values()]
    ensure_topics(config.bootstrap, names, config.partitions, timeout,
                  replication=config.replication, config={"cleanup.policy": "compact"})


def run_worker(settings: Settings, ready: Callable[[], None] | None = None,
               config: StreamConfig | None = None) -> int:
    """Block until SIGINT/SIGTERM (clean stop) or a fatal error; returns the exit status.

    Creates every topic the worker reads (raw and internal) first: Faust creates only its
    changelogs, and tables need their source topics to exist with the same partition count.
    """
    config = config or StreamConfig.from_settings(settings)
    ensure_topics(config.bootstrap, config.topics.all_names(), config.partitions)
    config.data_dir.mkdir(parents=True, exist_ok=True)  # Faust makes only the last level
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    streams = StreamsApp(config)
    ensure_changelogs(streams)
    worker = _Worker(streams.app, ready, loop=loop, loglevel=config.log_level, quiet=True,
                     redirect_stdouts=False)
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 1
    return 0


def main() -> int:
    return run_worker(load_settings(), ready=lambda: print(READY_LINE, flush=True))


if __name__ == "__main__":
    sys.exit(main())
