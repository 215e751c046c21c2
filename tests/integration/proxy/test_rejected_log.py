"""A record Kafka refuses for good is set aside in rejected.log, readable by its owner only."""

from __future__ import annotations

import stat
import uuid
from pathlib import Path

from clawr1.proxy.emitter import Emitter
from tests.support.waiting import wait_until


def test_rejected_records_are_kept_owner_only(kafka_bootstrap: str, tmp_path: Path) -> None:
    log = tmp_path / "rejected.log"
    log.write_bytes(b"")
    log.chmod(0o644)  # as an older version left it
    emitter: Emitter[bytes] = Emitter(
        bootstrap=kafka_bootstrap, topic=f"clawr1.test.rejected.{uuid.uuid4().hex[:8]}", spool_dir=tmp_path,
        prepare=lambda value: ("k", value), partitions=1, producer_overrides={"message.max.bytes": 2000})
    emitter.start()
    try:
        emitter.submit(b"prompt and reply " * 500)  # over the producer's limit: never deliverable
        wait_until(lambda: emitter.stats.rejected, 30, message="the record set aside")
    finally:
        emitter.close(timeout=2)
    assert emitter.stats.rejected == 1
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert b"prompt and reply" in log.read_bytes()
