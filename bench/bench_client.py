"""What ``GatewayClient`` costs the process that posts steps (a rollout worker), per step.

A rollout worker's CPU is the trainer's: what the client spends encoding and sending a batch is spent
beside generation. The client posts to a stand-in that reads each request and answers 202 with its
ids, in its own process, so only the client's own work is counted (``time.process_time`` of this
process). Two step shapes: the pipeline bench's white-box steps (512 prompt and 128 response ids, 128
logprobs, requests of 100) and its GRPO rollouts (prompts from 1,024 ids growing by 256 a turn, no
reward yet, requests of 200). The baseline, alternating with it in the same run, is the same client
encoding with the standard library (as it does where orjson is not installed).

    .venv/bin/python -m bench.bench_client [--rounds 4]

Results: bench/results/bench_client.json (ms of CPU per step, by shape and encoder; the ratio).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import clawr1.gateway.client as client_module
from bench.bench_pipeline import step
from bench.bench_streams import posted_rollouts
from bench.common import wait_port
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parent.parent

RESULTS = REPO / "bench" / "results" / "bench_client.json"


class _Accepting(BaseHTTPRequestHandler):
    """Answers a steps request as the gateway does (202, one id per step), having read all of it."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        steps = self.rfile.read(int(self.headers["Content-Length"])).count(b'"trajectory_id"')
        body = json.dumps({"accepted": steps, "ids": [f"{i:032x}" for i in range(steps)]}).encode()
        self.send_response(202)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_args: Any) -> None:
        pass


def _serve(port: int) -> None:
    ThreadingHTTPServer(("127.0.0.1", port), _Accepting).serve_forever()


def ms_per_step(url: str, steps: list[dict[str, Any]], batch: int, orjson: bool) -> float:
    """CPU ms per step of posting ``steps`` in requests of ``batch`` (after one request not counted)."""
    kept = client_module.orjson
    client_module.orjson = kept if orjson else None
    try:
        with client_module.GatewayClient(url, batch_size=batch) as client:
            client.submit_steps(steps[:batch])
            started = time.process_time()
            client.submit_steps(steps)
            return 1000 * (time.process_time() - started) / len(steps)
    finally:
        client_module.orjson = kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds of both encoders")
    args = parser.parse_args()
    if client_module.orjson is None:
        raise SystemExit("orjson is not installed: `make install` installs it (the gateway extra)")
    port = free_port()
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(port,), daemon=True)
    server.start()
    url = f"http://127.0.0.1:{port}"
    shapes = {
        "whitebox": ([step("bc", i) for i in range(2000)], 100),
        "rollouts": (posted_rollouts("bc", 24), 200),
    }
    try:
        wait_port(port)
        result: dict[str, Any] = {}
        for name, (steps, batch) in shapes.items():
            runs: dict[str, list[float]] = {"orjson": [], "json": []}
            for _ in range(args.rounds):
                for encoder in runs:
                    runs[encoder].append(round(ms_per_step(url, steps, batch, encoder == "orjson"), 4))
            medians = {encoder: statistics.median(ms) for encoder, ms in runs.items()}
            result[name] = {"steps": len(steps), "batch": batch, "cpu_ms_per_step": runs,
                            "median_ms_per_step": medians,
                            "json_over_orjson": round(medians["json"] / medians["orjson"], 2)}
            print(f"{name:9s} {len(steps)} steps in requests of {batch}: orjson {medians['orjson']:.3f} "
                  f"ms/step, json {medians['json']:.3f} ms/step ({result[name]['json_over_orjson']}x)")
    finally:
        server.terminate()
        server.join(10)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
