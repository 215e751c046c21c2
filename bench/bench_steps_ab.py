"""CPU per step of the steps fast path (``pack_body``: parse, checks, redaction, ids, packed records) of two
checkouts, alternated in fresh processes, so a shared machine's load falls on both alike.

Steps: ``plain`` is bench_gateway's (512 + 128 token ids, logprobs, no text); ``chat`` adds the
conversation so far as a white-box agent sends it (a system prompt per group of 64, each trajectory's
earlier turns again in its later steps, ~1 KB a turn, up to 16 messages) in prose; ``code`` the same in
code-like text full of braces and words such as key, token, session and pass (the costliest clean text
for redaction). Each process packs 2,000 steps it has not seen (after 400 others), as the gateway meets
them; the ratio of each pair, and their median, is printed.

    .venv/bin/python -m bench.bench_steps_ab A=CHECKOUT B=CHECKOUT [--pairs 4] [--kinds plain,chat,code]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PROSE = ("the model reads the question and then answers it with a short list of steps that are easy to "
         "follow for a new user of the system who wants to learn more about it today")
CODE = ("the key points of this session are in the token budget access function { return x; } "
        "please pass the config [1, 2] and explain")
STEPS, WARMUP, BATCH = 2000, 400, 100


def _text(seed: str, words: str, count: int) -> str:
    chosen, vocabulary = random.Random(seed), words.split(" ")
    return " ".join(chosen.choice(vocabulary) for _ in range(count))


def step(n: int, kind: str) -> dict[str, Any]:
    from tests.support.steps import make_step

    made = make_step(n)
    if kind == "plain":
        return made
    words = PROSE if kind == "chat" else CODE
    trajectory, turn = n // 8, n % 8
    messages = [{"role": "system", "content": _text(f"s{n // 64}", words, 150)}]
    for earlier in range(turn):
        messages += [{"role": "user", "content": _text(f"u{trajectory}.{earlier}", words, 150)},
                     {"role": "assistant", "content": _text(f"a{trajectory}.{earlier}", words, 120)}]
    messages.append({"role": "user", "content": _text(f"u{trajectory}.{turn}", words, 150)})
    made.update(prompt_messages=messages, response_text=_text(f"a{trajectory}.{turn}", words, 120),
                metadata={"n": n, "task": "math", "split": "train"})
    return made


def child(kind: str) -> float:
    """µs of this process's CPU per step packed (run with PYTHONPATH at the checkout measured)."""
    from clawr1.gateway.fastpath import pack_body

    bodies = [json.dumps([step(first + i, kind) for i in range(BATCH)]).encode()
              for first in range(0, STEPS + WARMUP, BATCH)]
    for body in bodies[STEPS // BATCH:]:
        pack_body(body, "bench", 1, BATCH)
    started = time.process_time()
    for body in bodies[:STEPS // BATCH]:
        assert pack_body(body, "bench", 1, BATCH) is not None
    return (time.process_time() - started) / STEPS * 1e6


def measure(checkout: Path, kind: str) -> float:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    # This file runs as a script, so a checkout without it is measured too; it imports the checkout's code.
    out = subprocess.run([sys.executable, __file__, "--child", kind], env=env, cwd=checkout,
                         capture_output=True, text=True, check=True).stdout
    return float(out.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="*", help="NAME=CHECKOUT, two of them: A then B")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--kinds", default="plain,chat,code")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(f"{child(args.child):.1f}")
        return
    (a_name, a), (b_name, b) = (entry.split("=", 1) for entry in args.checkouts)
    for kind in args.kinds.split(","):
        ratios = []
        for pair in range(args.pairs):
            first, second = measure(Path(a), kind), measure(Path(b), kind)
            ratios.append(second / first)
            print(f"{kind} pair {pair}: {a_name} {first:.1f} µs/step, {b_name} {second:.1f}, "
                  f"ratio {ratios[-1]:.3f}", flush=True)
        print(f"{kind}: median ratio {b_name}/{a_name} {statistics.median(ratios):.3f} "
              f"(range {min(ratios):.3f}-{max(ratios):.3f})", flush=True)


if __name__ == "__main__":
    main()
