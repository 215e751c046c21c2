"""The demo's OpenTelemetry-instrumented agent: no proxy, its model calls reach the pool as GenAI spans.

Run as its own process (``python -m clawr1.demo.otel_agent``) because the official
``opentelemetry-instrumentation-openai-v2`` patches the openai client for the whole process: in the
demo's process it would also trace the agents that go through the proxy. It calls the engine directly,
exports traces and logs over OTLP/HTTP (``opentelemetry-exporter-otlp-proto-http``) to the API's
``/v1/traces`` and ``/v1/logs``, with message content captured on spans and as events; each rollout is
one trace (one trajectory), a multi-turn grep-tool loop like the proxy agents'.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from clawr1.core.signals import stop_on_signals
from clawr1.demo.tasks import GREP_TOOL, agent_task, run_tool, write_workspace

MODEL = "demo-policy"
SERVICE = "otel-agent"
CONTENT_MODE = "span_and_event"
"""OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT for the instrumentation 2.4b0 with util-genai 1.1b0
(its new conventions only; ``true`` there means no content)."""


def telemetry(api_url: str, service: str = SERVICE, delay_ms: int = 1000) -> tuple[Any, Any]:
    """A tracer and a logger provider exporting OTLP/HTTP protobuf to the API every ``delay_ms``."""
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create({"service.name": service})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(
        OTLPSpanExporter(endpoint=f"{api_url}/v1/traces"), schedule_delay_millis=delay_ms))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(BatchLogRecordProcessor(
        OTLPLogExporter(endpoint=f"{api_url}/v1/logs"), schedule_delay_millis=delay_ms))
    return tracer_provider, logger_provider


def rollout(client: Any, tracer: Any, workspace: Path, rng: random.Random, number: int, rounds: int) -> int:
    """One trajectory under one root span: per round a tool call, its result and a reply."""
    task = agent_task(rng, number)
    messages: list[dict[str, Any]] = [{"role": "system", "content": task.system},
                                      {"role": "user", "content": task.question}]
    calls = 0
    with tracer.start_as_current_span(f"rollout {task.task_id}", attributes={"gen_ai.agent.name": SERVICE}):
        for round_index in range(rounds):
            if round_index:
                messages.append({"role": "user", "content": task.follow_up(round_index)})
            while True:
                message = client.chat.completions.create(model=MODEL, messages=messages, tools=[GREP_TOOL],
                                                         seed=number).choices[0].message
                calls += 1
                reply = message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True)
                messages.append(reply)
                if not message.tool_calls:
                    break
                for call in message.tool_calls:
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": run_tool(
                        workspace, call.function.name, call.function.arguments)})
    return calls


def run(api_url: str, engine_url: str, pause_s: float, rounds: int, seed: int, stop: threading.Event) -> None:
    os.environ["OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"] = CONTENT_MODE
    from openai import OpenAI
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

    tracer_provider, logger_provider = telemetry(api_url)
    OpenAIInstrumentor().instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)
    tracer = tracer_provider.get_tracer("clawr1.demo.otel_agent")
    rng = random.Random(seed)
    try:
        with tempfile.TemporaryDirectory(prefix="clawr1-otel-agent-") as folder, \
                OpenAI(base_url=f"{engine_url}/v1", api_key="not-needed", max_retries=1) as client:
            workspace = Path(folder)
            write_workspace(workspace, rng)
            number = 0
            while not stop.is_set():
                number += 1
                rollout(client, tracer, workspace, rng, 90_000 + number, rounds)
                stop.wait(pause_s)
    finally:
        tracer_provider.shutdown()  # flushes what is left
        logger_provider.shutdown()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m clawr1.demo.otel_agent", description=__doc__)
    parser.add_argument("--api", required=True, help="the API URL the spans go to")
    parser.add_argument("--engine", required=True, help="the LLM engine's base URL (without /v1)")
    parser.add_argument("--pause", type=float, default=3.0, help="seconds between two rollouts")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    run(args.api, args.engine, args.pause, args.rounds, args.seed, stop_on_signals())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
