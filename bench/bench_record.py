"""What the emitter spends building one captured call's record along an agent conversation, turn by turn.

An agent's every call carries its conversation so far (system prompt, task, each tool call and its
output), so a call's request grows with the turns, and so does what ``build_record`` reads: the request
body, the prompt's messages and their JSON, all redacted (``clawr1.core.redaction``). Each conversation
here runs ``--turns`` calls, each built once, as the emitter builds them; ``--conversations`` different
ones (their text drawn anew) give the medians. The baseline, measured on the same call in the same
run, is parsing its request body once with the standard library (``json.loads``): the least any
record building reads.

    .venv/bin/python -m bench.bench_record [--turns 40] [--conversations 5]

Results: bench/results/bench_record.json (ms per call and the ratio to the baseline, by turn).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import captured_chat_call
from clawr1.proxy.record import build_record

REPO = Path(__file__).resolve().parent.parent

WORDS = ("the", "a", "function", "return", "value", "list", "dict", "error", "file", "path", "test", "run",
         "bash", "output", "line", "code", "python", "import", "class", "def", "self", "print", "if", "else",
         "for", "while", "with", "open", "read", "write", "assert", "fix", "parser")


def prose(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def tool_output(rng: random.Random, lines: int) -> str:
    """A file or a command's output as tools return them: code with braces, brackets and quotes."""
    return "\n".join(f'    {rng.choice(WORDS)}_{i} = {{"{rng.choice(WORDS)}": [{i}, "{prose(rng, 3)}"]}}'
                     for i in range(lines))


def conversation(rng: random.Random, turns: int) -> list[dict[str, Any]]:
    """System prompt and task, then per turn an assistant tool call and the tool's output."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": prose(rng, 400)},
                                      {"role": "user", "content": prose(rng, 60)}]
    for turn in range(turns):
        call_id = f"call_{turn}"
        command = json.dumps({"command": f"cat src/{rng.choice(WORDS)}.py"})
        messages.append({"role": "assistant", "content": prose(rng, 30), "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": "bash", "arguments": command}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": tool_output(rng, 30)})
    return messages


def call_of(messages: list[dict[str, Any]], rng: random.Random) -> Any:
    body = {"model": "standin-1", "messages": messages, "max_tokens": 512, "temperature": 0.7}
    return captured_chat_call(body, prose(rng, 80), f"chatcmpl-{rng.getrandbits(32)}")


def cpu_ms(work: Any) -> float:
    started = time.process_time()
    work()
    return (time.process_time() - started) * 1000


def run(turns: int, conversations: int) -> dict[str, Any]:
    build: dict[int, list[float]] = {t: [] for t in range(turns)}
    parse: dict[int, list[float]] = {t: [] for t in range(turns)}
    sizes: dict[int, int] = {}
    for seed in range(conversations):
        rng = random.Random(seed)
        messages = conversation(rng, turns)
        for turn in range(turns):
            call = call_of(messages[:3 + 2 * turn], rng)  # the task, then every earlier tool call and output
            sizes[turn] = len(call.request_body)
            build[turn].append(cpu_ms(lambda c=call: build_record(c, "bench")))
            parse[turn].append(cpu_ms(lambda c=call: json.loads(c.request_body)))
    marks = sorted({0, turns // 4, turns // 2, turns - 1})
    built = {t: statistics.median(v) for t, v in build.items()}
    parsed = {t: statistics.median(v) for t, v in parse.items()}
    by_turn = {str(t + 1): {"request_kb": round(sizes[t] / 1000, 1), "build_record_ms": round(built[t], 3),
                            "json_loads_ms": round(parsed[t], 3),
                            "ratio": round(built[t] / max(parsed[t], 1e-6), 1)} for t in marks}
    total_build, total_parse = sum(built.values()), sum(parsed.values())
    return {"turns": turns, "conversations": conversations, "by_turn": by_turn,
            "conversation_build_record_ms": round(total_build, 1),
            "conversation_json_loads_ms": round(total_parse, 1),
            "conversation_ratio": round(total_build / total_parse, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--conversations", type=int, default=5)
    args = parser.parse_args()
    result = run(args.turns, args.conversations)
    print(json.dumps(result, indent=2))
    out = REPO / "bench" / "results" / "bench_record.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written {out}")


if __name__ == "__main__":
    main()
