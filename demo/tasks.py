"""The demo's pure parts: its settings, tasks, the grep tool, the policy clock and its reward function.

Kept free of I/O (except the tool's own temp directory) so tests can check what the live loop in
``clawr1.demo.workload`` does with them: which task a group gets, what the tool answers, when the policy
version moves and what a step is worth.
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from clawr1.core import registry
from clawr1.core.settings import config_from, setting_field
from clawr1.rewards.rules import format_check, math_answer


@dataclass(frozen=True)
class DemoConfig:
    """Rates and sizes of the demo loop; each field is read from its ``CLAWR1_DEMO_*`` variable.
    The defaults fit a 2-core laptop running the whole stack: a few steps per second in total."""

    agents: int = setting_field(registry.DEMO_AGENTS)
    """Black-box openai-SDK agent threads (one more anthropic agent and one compat agent always run)."""
    group_size: int = setting_field(registry.DEMO_GROUP_SIZE)
    """GRPO rollouts per task (the X-Claw-Prompt-Group-Size the agents declare)."""
    rounds: int = setting_field(registry.DEMO_ROUNDS)
    """User turns per rollout; each is a tool call, the tool's result and a final reply."""
    agent_pause_s: float = setting_field(registry.DEMO_AGENT_PAUSE_S)
    """Pause of each agent between two groups."""
    whitebox_pause_s: float = setting_field(registry.DEMO_WHITEBOX_PAUSE_S)
    """Pause of the white-box rollout worker between two groups."""
    event_pause_s: float = setting_field(registry.DEMO_EVENT_PAUSE_S)
    """Pause of the black-box service between two posted turns."""
    human_pause_s: float = setting_field(registry.DEMO_HUMAN_PAUSE_S)
    """How often the simulated human looks at the newest steps."""
    human_fraction: float = setting_field(registry.DEMO_HUMAN_FRACTION)
    """Share of the steps the human looked at that it labels (a quarter of those it corrects)."""
    batch_groups: int = setting_field(registry.DEMO_BATCH_GROUPS)
    """Prompt groups per trainer batch."""
    bump_every: int = setting_field(registry.DEMO_BUMP_EVERY)
    """The trainer bumps the policy version after this many batches."""
    max_staleness: int = setting_field(registry.DEMO_MAX_STALENESS)
    """The trainer's preset takes steps at most this many versions behind its own."""
    progress_s: float = setting_field(registry.DEMO_PROGRESS_S)
    """Seconds between two progress lines."""
    seed: int = setting_field(registry.DEMO_SEED)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> DemoConfig:
        """The defaults overridden by ``CLAWR1_DEMO_*`` variables; a malformed one names itself."""
        return config_from(cls, env)


class PolicyClock:
    """The policy version the trainer publishes and every agent reports (thread-safe).

    The trainer calls :meth:`batch_done` after each committed batch; every ``bump_every`` batches the
    version moves on, so steps collected before fall behind and ``max_staleness`` starts to matter.
    """

    def __init__(self, bump_every: int, version: int = 1) -> None:
        self.bump_every = bump_every
        self._version = version
        self._batches = 0
        self._lock = threading.Lock()

    @property
    def version(self) -> int:
        with self._lock:
            return self._version

    @property
    def batches(self) -> int:
        with self._lock:
            return self._batches

    def batch_done(self) -> bool:
        """Count one trained batch; True when it moved the version."""
        with self._lock:
            self._batches += 1
            if self._batches % self.bump_every:
                return False
            self._version += 1
            return True


# --- tasks ----------------------------------------------------------------------------------------

TOPICS = ("kafka", "avro", "trainer", "reward", "proxy", "pool", "tokens", "group", "policy", "stream")
QUESTIONS = (
    "Find where the notes mention {topic} and explain what they say.",
    "Which files talk about {topic}? Summarise the relevant lines.",
    "Search the workspace for {topic} and report anything surprising.",
)
FOLLOW_UPS = (
    "Look again, more carefully this time.",
    "Can you double-check with another search?",
    "Now search for a related term and compare.",
)


@dataclass(frozen=True)
class AgentTask:
    """One prompt of a black-box agent: every rollout of its group starts from the same messages."""

    task_id: str
    system: str
    question: str

    def follow_up(self, round_index: int) -> str:
        return FOLLOW_UPS[(round_index - 1) % len(FOLLOW_UPS)]


def agent_task(rng: random.Random, number: int) -> AgentTask:
    topic = rng.choice(TOPICS)
    question = rng.choice(QUESTIONS).format(topic=topic)
    system = "You are a careful research agent with a grep tool."
    return AgentTask(f"task-{number:05d}-{topic}", system, question)


@dataclass(frozen=True)
class MathTask:
    """A white-box rollout worker's prompt: an addition with a known answer (its ground truth)."""

    a: int
    b: int

    @property
    def question(self) -> str:
        return f"What is {self.a} + {self.b}? Think, then answer in <answer></answer>."

    @property
    def answer(self) -> int:
        return self.a + self.b


def math_task(rng: random.Random) -> MathTask:
    return MathTask(rng.randint(2, 99), rng.randint(2, 99))


def accuracy_at(version: int) -> float:
    """How often the toy white-box policy answers right at ``version``: it learns as versions pass."""
    return min(0.95, 0.25 + 0.1 * max(0, version - 1))


def math_reply(task: MathTask, rng: random.Random, version: int) -> str:
    """The toy policy's R1-style reply: right with probability ``accuracy_at(version)``, else off by a bit."""
    answer = task.answer if rng.random() < accuracy_at(version) else task.answer + rng.choice((-10, -1, 1, 2))
    return f"<think>{task.a} plus {task.b}, carefully.</think> <answer>{answer}</answer>"


# --- the tool -------------------------------------------------------------------------------------

GREP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "grep_files",
        "description": "Search the workspace notes for any of the words in `query`; returns matching lines.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}
MAX_MATCHES = 5
_WORD = re.compile(r"[a-z0-9]+")


def write_workspace(root: Path, rng: random.Random, files: int = 6, lines: int = 12) -> None:
    """Notes for the grep tool to search: short lines of project words, so some queries hit."""
    vocabulary = [*TOPICS, "the", "a", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "with",
                  "batch", "offset", "ready", "reply", "prompt"]
    root.mkdir(parents=True, exist_ok=True)
    for number in range(files):
        text = "\n".join(" ".join(rng.choice(vocabulary) for _ in range(8)) for _ in range(lines))
        (root / f"notes-{number}.txt").write_text(text + "\n", encoding="utf-8")


def grep_files(root: Path, query: str) -> str:
    """Lines of the files under ``root`` holding any word of ``query``, ignoring case
    (``file:line: text``), at most ``MAX_MATCHES``; ``no matches`` when none does."""
    words = set(_WORD.findall(query.lower()))
    found: list[str] = []
    for path in sorted(root.glob("*.txt")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if words & set(_WORD.findall(line.lower())):
                found.append(f"{path.name}:{number}: {line}")
                if len(found) == MAX_MATCHES:
                    return "\n".join(found)
    return "\n".join(found) or "no matches"


def run_tool(root: Path, name: str, arguments: str) -> str:
    """What the agent sends back for one tool call; a bad call is answered with the reason, as agents do."""
    if name != GREP_TOOL["function"]["name"]:
        return f"error: unknown tool {name!r}"
    try:
        query = json.loads(arguments)["query"]
    except (ValueError, KeyError, TypeError):
        return f"error: arguments must be a JSON object with a 'query' string, got {arguments!r}"
    return grep_files(root, str(query))


# --- reward -----------------------------------------------------------------------------------------

def demo_reward(**fields: Any) -> dict[str, Any]:
    """The demo's ``CLAWR1_REWARD_FN`` (``clawr1.demo.tasks:demo_reward``), built on ``clawr1.rewards.rules``.

    A step with a ground truth (the white-box math tasks) scores with ``math_answer`` plus a small
    bonus from ``format_check``; a tool call scores 1 when its arguments are a JSON object with a
    query; a text reply scores the share of its words that the tool results in its prompt contain
    (answers grounded in what the tool found).
    """
    extra = fields.get("extra_fields") or {}
    if (fields.get("dataset_fields") or {}).get("ground_truth") is not None:
        correct = math_answer(**fields)["score"]
        formatted = format_check(**fields)["score"]
        return {"score": correct + 0.1 * formatted, "correct": correct, "format": formatted}
    calls = extra.get("tool_calls") or []
    if calls:
        ok = all(_query_arguments(call) for call in calls)
        return {"score": float(ok), "tool_call_ok": float(ok)}
    reply = set(_WORD.findall(str(extra.get("response_text") or "").lower()))
    seen = " ".join(str(m.get("content") or "") for m in extra.get("prompt_messages") or []
                    if isinstance(m, Mapping) and m.get("role") == "tool")
    grounded = len(reply & set(_WORD.findall(seen.lower()))) / len(reply) if reply else 0.0
    return {"score": round(grounded, 4), "grounded": round(grounded, 4)}


def _query_arguments(call: Any) -> bool:
    function = call.get("function") if isinstance(call, Mapping) else None
    arguments = (function or call).get("arguments") if isinstance(call, Mapping) else None
    try:
        parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
    except ValueError:
        return False
    return isinstance(parsed, Mapping) and isinstance(parsed.get("query"), str)
