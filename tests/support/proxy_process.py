"""``python -m tests.support.proxy_process TOPIC DRAIN_S``: the proxy as its own process,
configured from CLAWR1_* variables like ``clawr1 proxy``, printing READY once it listens."""

from __future__ import annotations

import os
import sys

from clawr1.core.settings import load_settings
from clawr1.proxy.runner import run_proxy


def say_ready() -> None:
    # One write: print() sends the text and its newline apart when unbuffered (PYTHONUNBUFFERED), and
    # librdkafka's stderr, the same pipe in tests, landed between them ("READY%3|...FAIL...").
    os.write(1, b"READY\n")


def main() -> int:
    topic, drain_s = sys.argv[1], float(sys.argv[2])
    return run_proxy(load_settings(), say_ready, topic=topic, drain_s=drain_s)


if __name__ == "__main__":
    raise SystemExit(main())
