"""OpenTelemetry in, datasets out, on one live `clawr1 up --demo` (real Kafka, chDB, proxy, stand-in engine):

- the demo's OpenAI Agents SDK agent and its OpenTelemetry agent land steps beside the other ways in
  (four source kinds);
- the official OTel SDK with the official openai-v2 instrumentation of the official openai client,
  exporting through the official OTLP/HTTP exporters, lands one step per chat call with the call's
  model, messages, response id and usage, whether content travels on spans or as log events;
- a malformed OTLP body is a 400 with the parser's reason;
- `clawr1 export` of the live pool loads with Hugging Face `datasets`, as many rows as the SQL count
  of the same filter over the pool as it was at the export's watermark, and an export killed midway
  resumes with nothing twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.live_stack import CLAWR1, clawr1_up
from tests.support.ports import free_port
from tests.support.waiting import wait_until

AGENTS_SDK_AGENT = "agents-sdk-agent"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    data = tmp_path_factory.mktemp("otel-demo") / "data"
    engine = free_port()
    env = {"CLAWR1_DEMO_ENGINE_PORT": str(engine), "CLAWR1_DEMO_PROGRESS_S": "10"}
    with clawr1_up(data, env=env, args=["--demo"], stop_timeout=120) as live:
        yield {"api": live.url("api"), "engine": f"http://127.0.0.1:{engine}", "healthy_at": time.monotonic()}


def sql(api: str, query: str, parameters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    reply = httpx.post(f"{api}/v1/sql", timeout=60,
                       json={"query": query, "format": "JSONEachRow", "parameters": parameters or {}})
    assert reply.status_code == 200, reply.text
    return [json.loads(line) for line in reply.text.splitlines() if line.strip()]


def test_the_demo_lands_agents_sdk_and_otel_steps(demo: dict[str, Any]) -> None:
    """Both agents' steps arrive (within 60 s of a healthy stack on an unloaded 2-core machine, checked
    by hand with `make run`; the bound here is generous: time is measured, not asserted, in tests)."""
    query = """SELECT countIf(agent = {agent:String}) AS agents_sdk, countIf(source_kind = 'otel') AS otel,
                      groupUniqArray(source_kind) AS kinds FROM steps"""

    def both_agents() -> dict[str, Any]:
        [row] = sql(demo["api"], query, {"agent": AGENTS_SDK_AGENT})
        return row if int(row["agents_sdk"]) and int(row["otel"]) else {}

    wait_until(both_agents, demo["healthy_at"] + 240 - time.monotonic(), interval=1,
               message="steps of both agents 240 s after the stack was healthy")
    kinds = {"blackbox_agent", "whitebox_agent", "blackbox_service", "otel"}

    def every_kind() -> dict[str, Any]:
        [row] = sql(demo["api"], query, {"agent": AGENTS_SDK_AGENT})
        return row if set(row["kinds"]) == kinds else {}

    wait_until(every_kind, 60, interval=1, message="the pool holding all four source kinds")
    [otel] = sql(demo["api"], "SELECT agent, status, model, prompt_messages FROM steps "
                 "WHERE source_kind = 'otel' ORDER BY created_at_ms LIMIT 1")
    assert (otel["agent"], otel["status"], otel["model"]) == ("otel-agent", "ok", "demo-policy")
    assert json.loads(otel["prompt_messages"])[0]["role"] == "system"


def _rollout(client: Any, tracer: Any, tools: list[dict[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """A tool loop under one root span: (its trace id, per call the messages sent and the response)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You search notes."},
                                      {"role": "user", "content": f"Find kafka ({time.time_ns()})."}]
    calls = []
    with tracer.start_as_current_span("rollout") as root:
        while True:
            sent = [dict(m) for m in messages]
            response = client.chat.completions.create(model="otel-policy", messages=sent, tools=tools)
            calls.append({"messages": sent, "response": response})
            message = response.choices[0].message
            messages.append(message.model_dump(include={"role", "content", "tool_calls"}, exclude_none=True))
            if not message.tool_calls:
                break
            messages += [{"role": "tool", "tool_call_id": c.id, "content": "notes.txt:1: kafka"}
                         for c in message.tool_calls]
    return f"{root.get_span_context().trace_id:032x}", calls


@pytest.mark.parametrize("content", ["event_only", "span_only"])
def test_official_sdk_and_openai_v2_spans_land_one_step_per_chat_call(
        demo: dict[str, Any], content: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from openai import OpenAI
    from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from clawr1.demo.tasks import GREP_TOOL

    # With opentelemetry-util-genai 1.1b0 the instrumentation follows the current GenAI conventions,
    # whose content modes are these (``true``, the 1.30 conventions' switch, would capture nothing).
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", content)
    resource = Resource.create({"service.name": f"otel-test-{content}"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"{demo['api']}/v1/traces")))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(
        BatchLogRecordProcessor(OTLPLogExporter(endpoint=f"{demo['api']}/v1/logs")))
    instrumentor = OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=tracer_provider, logger_provider=logger_provider)
    try:
        with OpenAI(base_url=f"{demo['engine']}/v1", api_key="unused", max_retries=1) as client:
            trace_id, calls = _rollout(client, tracer_provider.get_tracer("test"), [GREP_TOOL])
        # Spans and logs leave at once, as two exporters do: the traces request waits for the events.
        flushing = threading.Thread(target=logger_provider.force_flush)
        flushing.start()
        assert tracer_provider.force_flush(30_000)
        flushing.join(30)
    finally:
        instrumentor.uninstrument()
        tracer_provider.shutdown()
        logger_provider.shutdown()
    assert len(calls) >= 2, "the stand-in engine answers a first call with a tool call"

    query = """SELECT step_index, source_kind, status, model, response_id, usage_prompt_tokens,
                      usage_completion_tokens, prompt_messages, response_text, tool_calls_json, link_status
               FROM steps WHERE trajectory_id = {t:String} ORDER BY step_index"""

    def landed() -> list[dict[str, Any]]:
        rows = sql(demo["api"], query, {"t": trace_id})
        return rows if len(rows) >= len(calls) else []

    rows = wait_until(landed, 60, interval=0.5, message=f"the {len(calls)} steps of trace {trace_id}")
    assert len(rows) == len(calls)
    for index, (row, call) in enumerate(zip(rows, calls, strict=True)):
        response = call["response"]
        assert (row["step_index"], row["source_kind"], row["status"]) == (index, "otel", "ok"), row
        assert (row["model"], row["response_id"]) == (response.model, response.id)
        assert (int(row["usage_prompt_tokens"]), int(row["usage_completion_tokens"])) == (
            response.usage.prompt_tokens, response.usage.completion_tokens)
        stored = json.loads(row["prompt_messages"])
        assert [(m["role"], m.get("content") or None) for m in stored] == [
            (m["role"], m.get("content") or None) for m in call["messages"]]
        message = response.choices[0].message
        assert row["response_text"] == (message.content or "")
        stored_calls = json.loads(row["tool_calls_json"])
        assert [c["id"] for c in stored_calls] == [c.id for c in message.tool_calls or []]
    assert [r["link_status"] for r in rows] == ["root", *["linked"] * (len(rows) - 1)]


def test_a_malformed_otlp_body_is_a_400_with_the_reason(demo: dict[str, Any]) -> None:
    garbage = httpx.post(f"{demo['api']}/v1/traces", content=b"\x0a\xff\xff\xff",
                         headers={"Content-Type": "application/x-protobuf"})
    assert garbage.status_code == 400, garbage.text
    assert garbage.json()["error"] == "malformed_body"
    assert "not a valid OTLP protobuf ExportTraceServiceRequest" in garbage.json()["message"]
    bad_id = httpx.post(f"{demo['api']}/v1/logs", json={"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"traceId": "not-hex", "spanId": "00"}]}]}]})
    assert bad_id.status_code == 400 and "not a hex id" in bad_id.json()["message"], bad_id.text
    no_spans = httpx.post(f"{demo['api']}/v1/traces", json={"resourceSpans": [{"scopeSpans": [{"spans": [
        {"traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1", "name": "GET /"}]}]}]})
    assert no_spans.status_code == 200 and no_spans.json() == {
        "partialSuccess": {"errorMessage": "ignored 1 not genai spans (only GenAI model calls become steps)"}}


def export(api: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([*CLAWR1, "export", "--api", api, "--out", str(out), *args],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"clawr1 export {' '.join(args)}: {done.stderr}"
    return done


def manifest_of(out: Path) -> dict[str, Any]:
    return json.loads((out / "manifest.json").read_text())


def counted(api: str, manifest: dict[str, Any]) -> int:
    """The SQL count of an export's filter, run now: what the export must hold (the filters here are on
    what never changes, and bounded in time, so agents writing meanwhile do not move it)."""
    [row] = sql(api, manifest["count_sql"], manifest["filter"]["parameters"])
    return int(row["v"])


def settled(api: str) -> str:
    """A condition on steps created 2 s before now: their membership no longer moves."""
    [row] = sql(api, "SELECT toUnixTimestamp64Milli(now64(3)) - 2000 AS t")
    return f"toUnixTimestamp64Milli(created_at_ms) <= {int(row['t'])}"


def load(kind: str, out: Path, cache: Path) -> Any:
    from datasets import load_dataset

    files = [str(out / name) for name in (shard["file"] for shard in manifest_of(out)["shards"])]
    return load_dataset(kind, data_files=files, split="train", cache_dir=str(cache))


def test_an_export_of_the_live_pool_loads_with_datasets(demo: dict[str, Any], tmp_path: Path) -> None:
    otel_steps = "SELECT count() AS n FROM steps WHERE source_kind = 'otel'"
    wait_until(lambda: int(sql(demo["api"], otel_steps)[0]["n"]) >= 8, 180, interval=2,
               message="the demo writing enough steps to export")
    steps = tmp_path / "steps"
    export(demo["api"], steps, "--channel", "train", "--where", f"status = 'ok' AND {settled(demo['api'])}",
           "--shard-mb", "0.002", "--page-rows", "10")  # a row group alone outgrows 2 KB
    manifest = manifest_of(steps)
    assert manifest["complete"] and len(manifest["shards"]) > 1 and manifest["rows"] > 0
    dataset = load("parquet", steps, tmp_path / "cache")
    assert dataset.num_rows == manifest["rows"] == manifest["total_rows"] == counted(demo["api"], manifest)
    assert len(set(dataset["step_id"])) == dataset.num_rows
    assert set(dataset["channel"]) == {"train"} and set(dataset["status"]) == {"ok"}
    row = next(r for r in dataset if r["response_logprobs"] and r["reward"] is not None)
    assert row["input_ids"] == row["prompt_token_ids"] + row["response_token_ids"]
    assert row["loss_mask"] == [0] * len(row["prompt_token_ids"]) + [1] * len(row["response_token_ids"])
    assert len(row["response_logprobs"]) == len(row["response_token_ids"])
    assert row["messages"][-1]["role"] == "assistant" and row["messages"][0]["role"] in {"system", "user"}
    assert {"policy_version", "trajectory_id", "step_index", "reward_status", "source_kind"} <= set(row)

    trajectories = tmp_path / "trajectories"
    export(demo["api"], trajectories, "--group-by", "trajectory", "--where",
           f"source_kind = 'otel' AND {settled(demo['api'])}")
    grouped = manifest_of(trajectories)
    by_trajectory = load("parquet", trajectories, tmp_path / "cache")
    expected = counted(demo["api"], grouped)
    assert by_trajectory.num_rows == grouped["rows"] == expected
    first = by_trajectory[0]
    assert first["num_steps"] == len(first["step_id"]) and first["step_index"] == sorted(first["step_index"])


def test_an_interrupted_export_resumes_without_duplicates(demo: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "resumed"
    # A page a query, a shard a page: slow enough to be killed after its first shard.
    args = ["--format", "jsonl", "--page-rows", "1", "--shard-mb", "0.001", "--where",
            f"source_kind IN ('otel', 'blackbox_service') AND {settled(demo['api'])}"]
    killed = subprocess.Popen([*CLAWR1, "export", "--api", demo["api"], "--out", str(out), *args],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:

        def first_shard() -> bool:
            assert killed.poll() is None, f"the export ended before it could be killed: {killed.stderr}"
            return (out / "manifest.json").exists() and bool(manifest_of(out)["shards"])

        wait_until(first_shard, 120, message="the export writing a shard")
        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
    cut = manifest_of(out)
    assert not cut["complete"] and cut["rows"] < cut["total_rows"], cut
    export(demo["api"], out, *args)
    manifest = manifest_of(out)
    assert manifest["complete"] and manifest["watermark_ms"] == cut["watermark_ms"]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")], "a temporary file was left"
    listed = [*(s["file"] for s in manifest["shards"]), "manifest.json"]
    assert sorted(p.name for p in out.iterdir()) == sorted(listed)
    ids = [json.loads(line)["step_id"] for shard in manifest["shards"]
           for line in (out / shard["file"]).read_text().splitlines()]
    assert len(ids) == len(set(ids)) == manifest["rows"] == counted(demo["api"], manifest), (
        f"{len(ids)} rows, {len(set(ids))} distinct")


def test_the_export_refuses_a_folder_of_another_export(demo: dict[str, Any], tmp_path: Path) -> None:
    export(demo["api"], tmp_path, "--where", "source_kind = 'otel'")
    other = subprocess.run([*CLAWR1, "export", "--api", demo["api"], "--out", str(tmp_path)],
                           capture_output=True, text=True, timeout=120, env={**os.environ})
    assert other.returncode == 2 and "holds another export" in other.stderr, other.stderr
