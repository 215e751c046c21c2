"""``python -m tests.support.proxy_process TOPIC DRAIN_S``: the proxy as its own process,
configured from CLAWR1_* variables like ``clawr1 proxy``, printing READY once it listens."""

from __future__ import annotations

import sys

from clawr1.core.settings import load_settings
from clawr1.proxy.runner import run_proxy


def main() -> int:
    topic, drain_s = sys.argv[1], float(sys.argv[2])
    return run_proxy(load_settings(), lambda: print("READY", flush=True), topic=topic, drain_s=drain_s)


if __name__ == "__main__":
    raise SystemExit(main())
