"""The idle floor: CPU of an idle ``clawr1 up`` (every process of the stack, the broker's JIT compiler
threads apart), this checkout against ``--before`` (a checkout of an earlier Claw-R1 with the ``.venv``
and ``.cache`` links a worktree has), both stacks up at once and measured over the same windows, so the
shared machine's load falls on both alike.

Each stack starts on its own data dir and ports (``bench_pipeline.Stack``), gets ``--settle`` seconds,
then ``--windows`` windows of ``--window-s`` seconds with no traffic; per window and build: cores by
process, and the ratio this build / before.

    .venv/bin/python -m bench.bench_idle --before DIR [--windows 4] [--window-s 60]

About 6 minutes at the defaults. Not part of ``make test``. Results: bench/results/bench_idle.json.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from bench.bench_pipeline import Stack
from bench.common import cpu_by_role

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "bench_idle.json"


def cores(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """Cores each process used between two ``cpu_by_role`` readings ``seconds`` apart."""
    return {role: round((after[role] - before.get(role, 0.0)) / seconds, 4) for role in after}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the build to compare with")
    parser.add_argument("--windows", type=int, default=4)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--settle", type=float, default=20.0, help="seconds after healthy, before measuring")
    args = parser.parse_args()
    rows: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="clawr1-idle-") as work:
        stacks = {"clawr1": Stack(Path(work) / "after", kept_log=RESULTS.with_name("bench_idle_stack.log")),
                  "clawr1_before": Stack(Path(work) / "before", repo=args.before.resolve(),
                                         kept_log=RESULTS.with_name("bench_idle_stack_before.log"))}
        try:
            for stack in stacks.values():
                stack.wait_healthy()
            time.sleep(args.settle)
            for window in range(args.windows):
                start = {side: cpu_by_role(stack.up.pid) for side, stack in stacks.items()}
                began = time.monotonic()
                time.sleep(args.window_s)
                seconds = time.monotonic() - began
                used = {side: cores(start[side], cpu_by_role(stack.up.pid), seconds)
                        for side, stack in stacks.items()}
                total = {side: round(sum(v for k, v in by.items() if k != "broker_jit"), 4)
                         for side, by in used.items()}
                row: dict[str, object] = {"window": window, "cores": total, "by_process": used,
                                          "ratio": round(total["clawr1"] / total["clawr1_before"], 3)}
                print(json.dumps(row), flush=True)
                rows.append(row)
        finally:
            for stack in stacks.values():
                stack.stop()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(rows, indent=2))
    print(f"results: {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
