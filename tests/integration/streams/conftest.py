"""A real stream worker in a subprocess (so a test can SIGKILL it) and a reader of its outputs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from clawr1.core.kafka_io import ensure_topics, make_producer
from clawr1.streams.config import StreamTopics
from clawr1.streams.worker import READY_LINE
from tests.integration.streams.mix import (
    EXPECTED_DEAD_LETTERS,
    EXPECTED_SCOPE_VERSIONS,
    EXPECTED_STEPS,
    MIX,
    Raw,
)
from tests.support.events import build_tokenizer
from tests.support.kafka import TopicFollower
from tests.support.waiting import wait_until

REPO = Path(__file__).resolve().parents[3]
PARTITIONS = 4


@dataclass
class WorkerRun:
    """One worker configuration (topics, app id, data dir); ``start`` may be called again after a kill."""

    bootstrap: str
    workdir: Path
    tokenizer: str
    suffix: str = field(default_factory=lambda: "." + uuid.uuid4().hex[:10])
    process: subprocess.Popen[bytes] | None = None
    starts: int = 0
    env: dict[str, str] = field(default_factory=dict)  # settings beyond the defaults

    @property
    def topics(self) -> StreamTopics:
        return StreamTopics().with_suffix(self.suffix)

    @property
    def app_id(self) -> str:
        """The worker's app id, which is also its consumer group."""
        return "test-streams" + self.suffix

    @property
    def log(self) -> Path:
        return self.workdir / f"worker-{self.starts}.log"

    def start(self, timeout: float = 60.0) -> None:
        self.starts += 1
        env = {
            **os.environ,
            "CLAWR1_KAFKA_BOOTSTRAP": self.bootstrap,
            "CLAWR1_DATA_DIR": str(self.workdir),
            "CLAWR1_TOPIC_SUFFIX": self.suffix,
            "CLAWR1_STREAMS_APP_ID": self.app_id,
            "CLAWR1_TOPIC_PARTITIONS": str(PARTITIONS),
            "CLAWR1_TOKENIZER": self.tokenizer,
            "CLAWR1_STREAMS_SESSION_TIMEOUT_S": "6",
            **self.env,
        }
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "clawr1.streams.worker"],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        process = self.process

        def ready() -> bool:
            if READY_LINE in self.log.read_text(errors="replace"):
                return True
            assert process.poll() is None, f"stream worker exited before it was ready:\n{self.tail()}"
            return False

        wait_until(ready, timeout, interval=0.1, message=lambda: f"stream worker ready:\n{self.tail()}")

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> int:
        """SIGTERM, as ``clawr1`` stops it; returns the exit status."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
            raise AssertionError(f"worker ignored SIGTERM:\n{self.tail()}") from None

    def produce(self, raws: list[Raw]) -> None:
        producer = make_producer(self.bootstrap)
        for raw in raws:
            producer.produce(getattr(self.topics, raw.topic), key=raw.key, value=raw.value)
        assert producer.flush(30) == 0


class Outputs:
    """Everything the worker wrote to the steps, dead-letter and prefix-node topics, decoded."""

    def __init__(self, bootstrap: str, topics: StreamTopics) -> None:
        self.topics = topics
        self.follower = TopicFollower(bootstrap, [topics.steps, topics.dlq, topics.prefix_nodes])
        self.steps: list[dict[str, Any]] = []
        self.dead_letters: list[dict[str, Any]] = []
        self.nodes: list[dict[str, Any]] = []

    def poll(self, seconds: float) -> None:
        """Reads what arrives within ``seconds``."""
        for read in self.follower.read(seconds):
            {"step": self.steps, "dead_letter": self.dead_letters, "prefix_node": self.nodes}[
                read.schema
            ].append(read.record)

    def wait_for(self, done: Callable[[Outputs], bool], timeout: float, *runs: WorkerRun) -> None:
        def settled() -> bool:
            if done(self):
                return True
            self.poll(0.5)
            return False

        def incomplete() -> str:
            logs = "\n".join(f"worker log {run.log}:\n{run.tail()}" for run in runs)
            return f"outputs complete: {unsettled(self)}; {logs}"

        wait_until(settled, timeout, interval=0, message=incomplete)

    def latest_steps(self) -> dict[str, dict[str, Any]]:
        """What the pool keeps: per step_id the record with the highest version."""
        latest: dict[str, dict[str, Any]] = {}
        for record in self.steps:
            known = latest.get(record["step_id"])
            if known is None or record["version"] > known["version"]:
                latest[record["step_id"]] = record
            elif record["version"] == known["version"]:
                assert record == known, f"version {record['version']} of {record['step_id']} changed content"
        return latest

    def tree_nodes(self) -> dict[str, dict[str, Any]]:
        """Per scope: its current nodes (latest row per node) and its figures (highest-version row)."""
        scopes: dict[str, dict[str, Any]] = {}
        for row in self.nodes:
            scope = scopes.setdefault(row["scope_id"], {"nodes": {}, "figures": (-1,)})
            current = scope["nodes"].get(row["node_id"])
            if current is None or row["version"] >= current["version"]:
                scope["nodes"][row["node_id"]] = row
            if row["version"] >= scope["figures"][0]:
                scope["figures"] = (row["version"], row["total_tokens"], row["tree_tokens"], row["forks"])
        return scopes

    def close(self) -> None:
        self.follower.close()


@pytest.fixture(scope="module")
def worker_runs(
    kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], tuple[WorkerRun, Outputs]]]:
    """Makes worker runs with their own topics; stops every worker process and reader at the end."""
    tokenizer = build_tokenizer(str(tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"))
    made: list[tuple[WorkerRun, Outputs]] = []

    def make() -> tuple[WorkerRun, Outputs]:
        run = WorkerRun(kafka_bootstrap, tmp_path_factory.mktemp("worker"), tokenizer)
        ensure_topics(kafka_bootstrap, run.topics.all_names(), PARTITIONS)
        made.append((run, Outputs(kafka_bootstrap, run.topics)))
        return made[-1]

    yield make
    for run, outputs in made:
        run.stop()
        outputs.close()


@pytest.fixture(scope="module")
def worker_peers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[WorkerRun], WorkerRun]]:
    """Makes more workers of a run's app (same app id and topics, own data dir and log, as on another
    host); stops every one at the end."""
    made: list[WorkerRun] = []

    def make(run: WorkerRun) -> WorkerRun:
        made.append(replace(run, workdir=tmp_path_factory.mktemp("peer"), process=None, starts=0))
        return made[-1]

    yield make
    for peer in made:
        peer.stop()


def unsettled(outputs: Outputs) -> dict[str, object]:
    """What still differs from the final state: step versions, dead letters, prefix-tree scopes."""
    versions = {step_id: record["version"] for step_id, record in outputs.latest_steps().items()}
    expected = {step_id: fields[0] for step_id, fields in EXPECTED_STEPS.items()}
    scopes = {scope: tree["figures"][0] for scope, tree in outputs.tree_nodes().items()}
    differ: dict[str, object] = {
        "steps (got, want)": {
            k: (versions.get(k), expected.get(k))
            for k in versions.keys() | expected.keys()
            if versions.get(k) != expected.get(k)
        },
        "scopes (got, want)": {
            k: (scopes.get(k), EXPECTED_SCOPE_VERSIONS.get(k))
            for k in scopes.keys() | EXPECTED_SCOPE_VERSIONS.keys()
            if scopes.get(k) != EXPECTED_SCOPE_VERSIONS.get(k)
        },
    }
    dead = len({d["dlq_id"] for d in outputs.dead_letters})
    if dead != len(EXPECTED_DEAD_LETTERS):
        differ["dead letters (got, want)"] = (dead, len(EXPECTED_DEAD_LETTERS))
    return {k: v for k, v in differ.items() if v}


def settled(outputs: Outputs) -> bool:
    """Every step, dead letter and prefix-tree scope at its final version."""
    return not unsettled(outputs)


@dataclass
class Result:
    run: WorkerRun
    outputs: Outputs

    @property
    def steps(self) -> dict[str, dict[str, Any]]:
        return self.outputs.latest_steps()


@pytest.fixture(scope="module")
def uninterrupted(worker_runs: Callable[[], tuple[WorkerRun, Outputs]]) -> Result:
    """One worker replays the whole mix without interruption: the reference final state."""
    run, outputs = worker_runs()
    run.start()
    run.produce(MIX)
    outputs.wait_for(settled, 90, run)
    outputs.poll(2.0)  # anything after the final state would be a wrong extra version
    return Result(run, outputs)


def kept_dead_letters(outputs: Outputs, topics: StreamTopics) -> list[tuple[str, str, str, bytes | None]]:
    """Dead letters as the pool keeps them: one per ``dlq_id`` (a replay writes the same one again)."""
    field_of = {
        getattr(topics, name): name for name in ("raw_llm", "raw_steps", "raw_events", "raw_feedback")
    }
    unique = {d["dlq_id"]: d for d in outputs.dead_letters}
    return sorted(
        (field_of[d["source_topic"]], d["stage"], d["reason"], d["original_value"]) for d in unique.values()
    )


def final_state(result: Result) -> dict[str, Any]:
    """What the pool ends up holding, free of the run's topic names: comparable across runs."""
    trees = {
        scope: (
            sorted(
                (n["node_id"], n["parent_node_id"], n["depth_start"], n["token_ids"], n["step_ids"])
                for n in tree["nodes"].values()
            ),
            tree["figures"][1:],
        )
        for scope, tree in result.outputs.tree_nodes().items()
    }
    return {
        "steps": result.steps,
        "dead_letters": kept_dead_letters(result.outputs, result.run.topics),
        "trees": trees,
    }
