"""Black-box capture against a peer's: Agent Lightning 1.0.2 (``agl-server``, its store in memory) and
the Claw-R1 stack (``clawr1 up`` with token-id capture, agents on the reverse port), the same agents in
front of the same stand-in engine, in one run.

- Agent Lightning is installed (``agentlightning==1.0.2``, which needs Python >= 3.12) in a venv of its
  own, kept under ``.cache/bench_peer/`` for the next run (``--agl-venv`` names another, ``--agl-python``
  the interpreter that builds it); its server gets the engine as its one model server and a rollout per
  agent conversation; agents call its per-rollout proxy URL (it captures each call into its store).
- Claw-R1: ``bench_pipeline.Stack`` (broker, API with sink and pool, stream worker, proxy and emitter)
  with ``CLAWR1_CAPTURE_TOKEN_IDS``; agents call the reverse port naming themselves (``X-Claw-Agent``),
  no other hint: the stack links their turns itself. A run ends once all its calls are queryable in the
  pool. ``--before DIR``: a checkout of an earlier Claw-R1 (``git archive``; give it the ``.cache`` and
  ``.venv`` links a worktree has) on a stack and stand-in engine of its own, a third side
  (``clawr1_before``): before and after in the same run.
- Bare ``mitmdump`` (``bare_mitmdump``): mitmproxy in reverse mode in front of the engine with no addon,
  capturing nothing: the relay every mitmproxy addon stands on (the stack's capture is a mitmproxy addon),
  so the floor under Claw-R1's proxy, measured with the same agents in the same rounds.
- Workload: ``--agents`` (8) openai-SDK agents at once, each holding rollouts of ``--turns`` (4)
  non-streamed calls that send the conversation so far (about 300 tokens at the first turn to 1,500 at
  the fourth: the stand-in engine's tokens are bytes), ``--calls`` per run.
- Runs: one of each, uncounted, first (connections, the broker's first load); then ``--pairs`` (>= 3)
  rounds of direct (agents straight to the engine) and the capture sides, in an order rotated round by
  round, so the shared machine's load drifts over them alike.

Per side: calls/s (calls over the time from the first call to the last answer, and its ratio to the direct
run of the same round),
added latency p50/p99 (over the direct run of the same round), CPU per call of the capture processes
(utime + stime from /proc over the run: for Claw-R1 every process of the stack, the broker's JIT
compiler threads apart; for Agent Lightning its server process; for bare mitmdump its process), the idle
floor apart (CPU of those processes over ``--idle-s`` of no traffic before each run, as cores and as ms
per call of the run's length, up to the last call queryable), freshness (Claw-R1: call captured ->
queryable, p50/p99; Agent Lightning: in its store when the call returns), and the ratios of each side to
Agent Lightning, per round and over all rounds.

    .venv/bin/python -m bench.bench_peer [--calls 512] [--pairs 3] [--agents 8] [--turns 4]
    .venv/bin/python -m bench.bench_peer --calls 128 --pairs 3 --warmup 32 --idle-s 3   # quick

The stack starts in about a minute here; each run takes the idle window plus 10-20 s at 128 calls.

Not part of ``make test``. Results: bench/results/bench_peer.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.bench_pipeline import Stack
from bench.common import cpu_by_role, percentile, process, stop_process, wait_port
from tests.support.ports import free_port

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results" / "bench_peer.json"
AGL = "agentlightning==1.0.2"
AGL_VENV = REPO / ".cache" / "bench_peer" / "agentlightning-1.0.2"
MODEL = "standin-1"
# About 300 tokens (bytes) with the task line; each turn adds a reply and about 330 bytes of tool output.
SYSTEM_PROMPT = "You are a coding agent. Read the files you need, run the tests, fix what fails. " * 3


def tool_output(turn: int) -> str:
    """What a turn's command printed (about 330 bytes)."""
    return "\n".join(f"tests/test_mod_{turn}.py::test_case_{line} FAILED  (assert {line} == {line + 1})"
                     for line in range(6))


# --- Agent Lightning ---------------------------------------------------------------------------------

def python_312(explicit: str | None) -> str:
    """An interpreter new enough for Agent Lightning: ``explicit``, else pyenv's 3.12+ (oldest first), else
    python3.12 or python3.13 on PATH; the first that runs (a pyenv shim of an unselected version does not)."""
    if explicit:
        return explicit
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    versions = sorted((p for p in pyenv.glob("3.1[2-9]*") if (p / "bin" / "python").exists()),
                      key=lambda p: tuple(int(x) for x in p.name.split(".")[:2]))
    candidates = [str(v / "bin" / "python") for v in versions]
    candidates += [found for name in ("python3.12", "python3.13") if (found := shutil.which(name))]
    for candidate in candidates:
        if subprocess.run([candidate, "-c", ""], capture_output=True).returncode == 0:
            return candidate
    raise SystemExit("Agent Lightning needs Python >= 3.12: none found (give --agl-python)")


def agl_venv(venv: Path, python: str) -> Path:
    """``venv`` with Agent Lightning installed (made first when it lacks ``agl-server``); its bin dir."""
    server = venv / "bin" / "agl-server"
    if not server.exists():
        print(f"installing {AGL} into {venv} (once) ...", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([python, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", AGL], check=True)
    return server.parent


@contextmanager
def agl_server(bin_dir: Path, engine: str, workdir: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``agl-server`` on a free loopback port with ``engine`` as its model server; (process, URL)."""
    port = free_port()
    log = (workdir / "agl-server.log").open("wb")
    process = subprocess.Popen(
        [str(bin_dir / "agl-server"), "host=127.0.0.1", f"port={port}", f"default_proxy.model_name={MODEL}",
         f"hydra.run.dir={workdir / 'hydra'}"],
        cwd=workdir, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_port(port, 120)
        httpx.post(f"{url}/api/models", json=[{"model": MODEL, "endpoint": f"{engine}/v1"}],
                   timeout=30).raise_for_status()
        yield process, url
    finally:
        stop_process(process, signal.SIGINT)
        log.close()


# --- the agents ---------------------------------------------------------------------------------------

@dataclass
class Target:
    """Where a run's agents send their calls: the OpenAI base URL (and headers) of each rollout."""

    name: str
    base_url: Callable[[str], str]
    headers: Callable[[str], dict[str, str]] = lambda _agent: {}
    before_run: Callable[[list[str]], object] = lambda _rollouts: None
    # Calls the side holds for these rollouts, once the run is over (None: nothing to check).
    captured: Callable[[list[str]], int] | None = None


@dataclass
class Run:
    side: str
    calls: int = 0
    errors: int = 0
    latency_ms: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    answered_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    idle_cores: float = 0.0
    freshness_ms: list[float] = field(default_factory=list)
    rollouts: list[str] = field(default_factory=list)
    captured: int | None = None

    def summary(self, direct: Run | None) -> dict[str, Any]:
        total = sum(v for k, v in self.cpu_s.items() if k != "broker_jit")
        idle_ms = self.idle_cores * self.wall_s * 1000 / self.calls
        out: dict[str, Any] = {
            "calls": self.calls, "errors": self.errors, "captured": self.captured,
            "answered_s": round(self.answered_s, 2), "charged_s": round(self.wall_s, 2),
            "calls_per_s": round(self.calls / self.answered_s, 2),
            "latency_p50_ms": round(percentile(self.latency_ms, 0.5), 1),
            "latency_p99_ms": round(percentile(self.latency_ms, 0.99), 1),
        }
        if direct is not None:
            rate = self.calls / self.answered_s
            out |= {"calls_per_s_vs_direct": round(rate / (direct.calls / direct.answered_s), 3),
                    "added_p50_ms": round(out["latency_p50_ms"] - percentile(direct.latency_ms, 0.5), 1),
                    "added_p99_ms": round(out["latency_p99_ms"] - percentile(direct.latency_ms, 0.99), 1)}
        if self.cpu_s:
            out |= {"cpu_ms_per_call": round(total * 1000 / self.calls, 2),
                    "idle_cores": round(self.idle_cores, 3), "idle_ms_per_call": round(idle_ms, 2),
                    "cpu_ms_per_call_over_idle": round(total * 1000 / self.calls - idle_ms, 2),
                    "cpu_ms_per_call_by_process": {
                        k: round(v * 1000 / self.calls, 2)
                        for k, v in sorted(self.cpu_s.items(), key=lambda kv: -kv[1])}}
        if self.freshness_ms:
            out |= {"freshness_p50_ms": percentile(self.freshness_ms, 0.5),
                    "freshness_p99_ms": percentile(self.freshness_ms, 0.99)}
        return out


def rollout_agent(target: Target, agent: str, rollouts: list[str], turns: int, run: Run) -> None:
    """One agent: its rollouts one after another, each ``turns`` calls sending the conversation so far."""
    from openai import OpenAI

    with OpenAI(base_url=target.base_url(rollouts[0]), api_key="sk-bench", max_retries=0, timeout=120,
                default_headers=target.headers(agent)) as client:
        for rollout in rollouts:
            rollout_client = client.with_options(base_url=target.base_url(rollout))
            history = [{"role": "system", "content": SYSTEM_PROMPT},
                       {"role": "user", "content": f"Task {rollout}: make the test suite pass."}]
            for turn in range(turns):
                started = time.perf_counter()
                try:
                    reply = rollout_client.chat.completions.create(model=MODEL, messages=history)  # type: ignore[arg-type]
                except Exception:  # noqa: BLE001 - counted, the rollout goes on
                    run.errors += 1
                    continue
                run.latency_ms.append((time.perf_counter() - started) * 1000)
                history += [{"role": "assistant", "content": reply.choices[0].message.content or ""},
                            {"role": "user", "content": tool_output(turn)}]


def run_agents(target: Target, run: Run, tag: str, calls: int, agents: int, turns: int) -> None:
    per_agent = max(1, calls // (agents * turns))
    plan = {f"{tag}-a{a}": [f"{tag}-a{a}-r{r}" for r in range(per_agent)] for a in range(agents)}
    run.rollouts = [r for rollouts in plan.values() for r in rollouts]
    target.before_run(run.rollouts)
    run.calls = agents * per_agent * turns
    with ThreadPoolExecutor(agents) as pool:
        list(pool.map(lambda item: rollout_agent(target, item[0], item[1], turns, run), plan.items()))


# --- one run of one side --------------------------------------------------------------------------------

def idle_cores(cpu: Callable[[], dict[str, float]], seconds: float) -> float:
    """Cores the capture processes use with no traffic (their pollers, timers, samplers)."""
    before, started = cpu(), time.monotonic()
    time.sleep(seconds)
    after, elapsed = cpu(), time.monotonic() - started
    return sum(after.get(k, 0.0) - v for k, v in before.items() if k != "broker_jit") / elapsed


def measured_run(side: str, target: Target, cpu: Callable[[], dict[str, float]] | None,
                 settle: Callable[[str, int], list[float]] | None, args: argparse.Namespace) -> Run:
    """One run: the idle floor first, then the agents' calls, timed (and charged) until captured."""
    run, tag = Run(side), f"{side[:3]}{uuid.uuid4().hex[:6]}"
    if cpu is not None:
        run.idle_cores = idle_cores(cpu, args.idle_s)
    before = cpu() if cpu is not None else {}
    started = time.monotonic()
    run_agents(target, run, tag, args.calls, args.agents, args.turns)
    run.answered_s = time.monotonic() - started
    if settle is not None:
        run.freshness_ms = settle(tag, run.calls - run.errors)
        run.captured = len(run.freshness_ms)
    run.wall_s = time.monotonic() - started
    if cpu is not None:
        after = cpu()
        run.cpu_s = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    if target.captured is not None:
        run.captured = target.captured(run.rollouts)
    return run


def clawr1_settle(stack: Stack) -> Callable[[str, int], list[float]]:
    """Waits (polling the API twice a second: its cost is charged to the run) until the run's calls are
    queryable; their freshness, captured -> queryable."""
    def settle(tag: str, expected: int) -> list[float]:
        where = f"agent LIKE '{tag}-%'"
        deadline = time.monotonic() + 300
        while stack.count(where) < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {stack.count(where)} of {expected} calls reached the pool")
            time.sleep(0.5)
        return [float(r["lag"]) for r in stack.sql(
            "SELECT toUnixTimestamp64Milli(ingested_at) - toUnixTimestamp64Milli(created_at_ms) AS lag "
            f"FROM steps WHERE {where}")]
    return settle


def agl_captured(url: str, rollouts: list[str]) -> int:
    """``model_request`` events Agent Lightning holds for ``rollouts``."""
    with httpx.Client(base_url=url, timeout=30) as client:
        return sum(len(client.get(f"/api/rollouts/{r}/events", params={"event_type": "model_request"}).json())
                   for r in rollouts)


# --- the whole bench ---------------------------------------------------------------------------------------

def ratios(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, Any]:
    def ratio(key: str) -> float | None:
        return round(ours[key] / theirs[key], 3) if theirs.get(key) else None
    return {"cpu_per_call": ratio("cpu_ms_per_call"),
            "cpu_per_call_over_idle": ratio("cpu_ms_per_call_over_idle"),
            "calls_per_s": ratio("calls_per_s"), "calls_per_s_vs_direct": ratio("calls_per_s_vs_direct"),
            "added_p50": ratio("added_p50_ms"), "added_p99": ratio("added_p99_ms")}


def clawr1_target(name: str, stack: Stack) -> Target:
    return Target(name, lambda _r: f"http://127.0.0.1:{stack.reverse_port}/v1",
                  headers=lambda agent: {"X-Claw-Agent": agent})


def agl_target(url: str) -> Target:
    # Attempt "0": Agent Lightning's default attempt, the one its event query reads.
    return Target(
        "agent_lightning", lambda r: f"{url}/proxy/rollout/{r}/attempt/0/mode/train/openai/v1",
        before_run=lambda rollouts: httpx.post(
            f"{url}/api/rollouts", json=[{"rollout_id": r, "input": {"task": r}} for r in rollouts],
            timeout=60).raise_for_status(),
        captured=lambda rollouts: agl_captured(url, rollouts))


@contextmanager
def bare_mitmdump(engine: str, workdir: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """mitmdump reverse-proxying to ``engine`` with no addon; (process, URL)."""
    port = free_port()
    with process([str(Path(sys.executable).parent / "mitmdump"), "-q", "--mode",
                  f"reverse:{engine}@127.0.0.1:{port}", "--set", f"confdir={workdir / 'mitmdump'}"],
                 port=port) as child:
        yield child, f"http://127.0.0.1:{port}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=512, help="calls per run")
    parser.add_argument("--pairs", type=int, default=3, help="rounds of direct, Agent Lightning, Claw-R1")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--idle-s", type=float, default=4.0, help="idle floor measured before each run")
    parser.add_argument("--warmup", type=int, default=64, help="calls per side first, not counted (0: none)")
    parser.add_argument("--agl-venv", type=Path, default=AGL_VENV)
    parser.add_argument("--agl-python", help="Python >= 3.12 to build the Agent Lightning venv with")
    parser.add_argument("--before", type=Path,
                        help="a checkout of an earlier Claw-R1 (e.g. git archive), run as a third side, "
                             "clawr1_before, on a stack (and stand-in engine) of its own")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a setting of the clawr1 side's stack only (repeatable): with --before naming "
                             "this checkout, the same code with and without it")
    args = parser.parse_args()
    env = {"CLAWR1_CAPTURE_TOKEN_IDS": "true"}
    bin_dir = agl_venv(args.agl_venv, python_312(args.agl_python))

    rounds: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="clawr1-bench-peer-") as tmp, ExitStack() as held:
        work = Path(tmp)
        stacks = {"clawr1": Stack(work / "clawr1", env=env | dict(kv.split("=", 1) for kv in args.env),
                                  kept_log=RESULTS.with_name("bench_peer_stack.log"))}
        if args.before:
            stacks["clawr1_before"] = Stack(work / "before", env=env,
                                            kept_log=RESULTS.with_name("bench_peer_stack_before.log"),
                                            repo=args.before.resolve())
        for stack in stacks.values():
            held.callback(stack.stop)
        for stack in stacks.values():
            stack.wait_healthy()
        engine = f"http://127.0.0.1:{stacks['clawr1'].engine_port}"
        agl, agl_url = held.enter_context(agl_server(bin_dir, engine, work))
        bare, bare_url = held.enter_context(bare_mitmdump(engine, work))
        targets = {"direct": Target("direct", lambda _r: f"{engine}/v1"),
                   "agent_lightning": agl_target(agl_url),
                   "bare_mitmdump": Target("bare_mitmdump", lambda _r: f"{bare_url}/v1"),
                   **{name: clawr1_target(name, stack) for name, stack in stacks.items()}}
        cpus: dict[str, Callable[[], dict[str, float]]] = {"agent_lightning": lambda: cpu_by_role(agl.pid),
                                                           "bare_mitmdump": lambda: cpu_by_role(bare.pid)}
        cpus |= {name: (lambda s=stack: cpu_by_role(s.up.pid)) for name, stack in stacks.items()}
        settles = {name: clawr1_settle(stack) for name, stack in stacks.items()}

        def one(side: str, calls: int) -> Run:
            return measured_run(side, targets[side], cpus.get(side), settles.get(side),
                                argparse.Namespace(**{**vars(args), "calls": calls}))

        if args.warmup:
            for side in targets:
                one(side, args.warmup)
        captures = ["agent_lightning", "bare_mitmdump", *stacks]
        for n in range(args.pairs):
            order = ["direct", *captures[n % len(captures):], *captures[:n % len(captures)]]
            runs = {side: one(side, args.calls) for side in order}
            summaries = {side: run.summary(runs["direct"] if side != "direct" else None)
                         for side, run in runs.items()}
            theirs = summaries["agent_lightning"]
            rounds.append({"order": order, **summaries,
                           **{f"{name}_vs_agent_lightning": ratios(summaries[name], theirs)
                              for name in ("bare_mitmdump", *stacks)}})
            print(json.dumps({"round": n, **rounds[-1]}), flush=True)

    result = {"bench": "peer", "peer": AGL, "calls_per_run": rounds[0]["clawr1"]["calls"], "env": args.env,
              "agents": args.agents, "turns": args.turns, "pairs": args.pairs, "rounds": rounds,
              "overall": overall(rounds, ["bare_mitmdump", *stacks])}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["overall"], indent=2))
    print(f"results: {RESULTS}")
    return 0


def overall(rounds: list[dict[str, Any]], compared: list[str]) -> dict[str, Any]:
    """Per side the median over rounds of each figure, and the ratios of the medians to Agent Lightning's."""
    def median(side: str, key: str) -> float:
        return round(statistics.median(r[side][key] for r in rounds), 2)

    keys = ("calls_per_s", "calls_per_s_vs_direct", "added_p50_ms", "added_p99_ms", "cpu_ms_per_call",
            "idle_ms_per_call", "cpu_ms_per_call_over_idle", "idle_cores")
    sides: dict[str, dict[str, Any]] = {side: {k: median(side, k) for k in keys}
                                        for side in ("agent_lightning", *compared)}
    for side in compared:
        roles = {k for r in rounds for k in r[side]["cpu_ms_per_call_by_process"]}
        sides[side]["cpu_ms_per_call_by_process"] = {
            k: round(statistics.median(r[side]["cpu_ms_per_call_by_process"].get(k, 0.0) for r in rounds), 2)
            for k in sorted(roles)}
        if "freshness_p50_ms" in rounds[0][side]:  # a side that captures nothing has none
            sides[side]["freshness_p50_ms"] = median(side, "freshness_p50_ms")
            sides[side]["freshness_p99_ms"] = median(side, "freshness_p99_ms")
    return {**sides, "direct_latency_p50_ms": median("direct", "latency_p50_ms"),
            **{f"{side}_vs_agent_lightning": ratios(sides[side], sides["agent_lightning"])
               for side in compared},
            **{f"{side}_per_round_cpu_ratio": [r[f"{side}_vs_agent_lightning"]["cpu_per_call"]
                                               for r in rounds] for side in compared}}


if __name__ == "__main__":
    raise SystemExit(main())
