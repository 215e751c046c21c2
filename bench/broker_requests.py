"""What the broker serves per captured call and per white-box step: its requests, counted from its own
request log (``CLAWR1_KAFKA_REQUEST_LOG``: Kafka's request logger, one JSON line per request served).

``clawr1 up`` on a private data dir (token-id capture, the stand-in engine), then, each counted from the
broker's log alone:

- idle: ``--idle-s`` of no traffic: requests per second by kind (the pollers' floor);
- black-box: ``--calls`` openai-SDK calls by 8 agents in conversations of ``--turns``, through the reverse
  port, until all are queryable: requests per call by kind;
- white-box: ``--steps`` posted in requests of 100, until queryable: requests per step by kind.

A kind is the request's API and the client that sent it (a produce also says whether it was
transactional and which topics it wrote); each phase also gives the partitions a produce request
carried on average. The broker's CPU follows its requests more than the bytes in them: this says where
they come from (the emitter, the worker's transactions, the transaction coordinator's own checks, the
consumers' fetches) and what a change does to them.

    .venv/bin/python -m bench.broker_requests [--calls 400] [--turns 4] [--steps 4000] [--idle-s 10]

Not part of ``make test``. Results: bench/results/broker_requests.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from bench.bench_pipeline import REPO, Stack, agent_calls, step
from clawr1.gateway.client import GatewayClient

RESULTS = REPO / "bench" / "results" / "broker_requests.json"
_PREFIX = "Completed request:"
AGENTS = 8


def request_kind(line: str) -> tuple[str, int] | None:
    """``(kind, partitions written)`` of one request-log line (None for any other line): the API, the
    client id, and for a produce whether it was transactional and the topics it wrote."""
    at = line.find(_PREFIX)
    if at < 0:
        return None
    served = json.loads(line[at + len(_PREFIX):])
    header = served["requestHeader"]
    api = header.get("requestApiKeyName") or f"api {header['requestApiKey']}"
    partitions = 0
    if api == "PRODUCE":
        request = served["request"]
        topics = sorted(t["name"] for t in request["topicData"])
        partitions = sum(len(t["partitionData"]) for t in request["topicData"])
        how = "in a transaction" if request.get("transactionalId") else "plain"
        api = f"PRODUCE {how} {','.join(topics)}"
    return f"{api} <- {header.get('clientId') or '?'}", partitions


def census(lines: Iterable[str], units: float) -> dict[str, Any]:
    """Requests per unit (a call, a step, a second) by kind, most first, and the partitions a produce
    request carried on average."""
    kinds: Counter[str] = Counter()
    produces = partitions = 0
    for line in lines:
        found = request_kind(line)
        if found is None:
            continue
        kind, written = found
        kinds[kind] += 1
        if kind.startswith("PRODUCE"):
            produces, partitions = produces + 1, partitions + written
    return {"requests_per_unit": round(sum(kinds.values()) / units, 3),
            "by_kind": {kind: round(n / units, 3) for kind, n in kinds.most_common()},
            "partitions_per_produce": round(partitions / produces, 2) if produces else None}


class RequestLog:
    """The broker's request log, read phase by phase from where the last phase ended."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._at = path.stat().st_size

    def skip(self) -> None:
        self._at = self.path.stat().st_size

    def phase(self) -> list[str]:
        with self.path.open("rb") as log:
            log.seek(self._at)
            data = log.read()
        self._at += len(data)
        return data.decode(errors="replace").splitlines()


def calls(stack: Stack, prefix: str, count: int, turns: int) -> None:
    """``count`` calls by ``AGENTS`` agents at once, in conversations of ``turns``."""
    per_agent = max(1, count // AGENTS)

    def agent(n: int) -> None:
        agent_calls(stack.reverse_port, f"{prefix}{n}", range(n * per_agent, (n + 1) * per_agent), turns, [])

    with ThreadPoolExecutor(AGENTS) as pool:
        list(pool.map(agent, range(AGENTS)))


def measured(log: RequestLog, units: float, work: Callable[[], None]) -> dict[str, Any]:
    log.skip()
    started = time.monotonic()
    work()
    return {"units": units, "seconds": round(time.monotonic() - started, 2), **census(log.phase(), units)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="black-box calls (a multiple of 8)")
    parser.add_argument("--turns", type=int, default=4, help="calls per conversation")
    parser.add_argument("--steps", type=int, default=4000, help="white-box steps (0: none)")
    parser.add_argument("--idle-s", type=float, default=10.0)
    args = parser.parse_args()
    run = uuid.uuid4().hex[:8]
    with tempfile.TemporaryDirectory(prefix="broker-requests-") as tmp:
        stack = Stack(Path(tmp) / "stack", env={"CLAWR1_KAFKA_REQUEST_LOG": "true",
                                                "CLAWR1_CAPTURE_TOKEN_IDS": "true"})
        try:
            stack.wait_healthy()
            log = RequestLog(stack.data_dir / "kafka" / "kafka.log.requests")
            calls(stack, f"warm{run}-", 64, args.turns)  # connections, the broker's first load
            stack.wait_count(f"agent LIKE 'warm{run}-%'", 64 // AGENTS * AGENTS, timeout=300)
            result: dict[str, Any] = {
                "idle": measured(log, args.idle_s, lambda: time.sleep(args.idle_s)) | {"unit": "second"}}
            n = args.calls // AGENTS * AGENTS

            def blackbox() -> None:
                calls(stack, f"bb{run}-", n, args.turns)
                stack.wait_count(f"agent LIKE 'bb{run}-%'", n, timeout=600)

            result["blackbox"] = measured(log, n, blackbox) | {"unit": "call", "turns": args.turns}
            if args.steps:
                def whitebox() -> None:
                    with GatewayClient(stack.api, batch_size=100, timeout_s=120) as client:
                        client.submit_steps([step(f"wb{run}", i) for i in range(args.steps)])
                    stack.wait_count(f"trajectory_id LIKE 'wb{run}-%'", args.steps, timeout=600)

                result["whitebox"] = measured(log, args.steps, whitebox) | {"unit": "step"}
        finally:
            stack.stop()
    print(json.dumps(result, indent=2))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
