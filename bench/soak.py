"""Soak: the whole stack (``clawr1 up``) under a training run's mixed load, and after it: do state,
memory and disk stay bounded, and does overload meet backpressure rather than restarts?

Load, for ``--minutes``:
- white-box GRPO rollouts at ``--rate`` steps/s: groups of 8 rollouts x 8 turns
  (``bench_streams.rollout_steps``: prompts growing from 1,024 tokens by 256 a turn, ~2,000 tokens a
  step), one group per request, posted by ``--senders`` threads paced to the rate; every step
  rewarded: a group's steps are posted without rewards, then a final reward for each of them by
  ``POST /v1/feedback`` (by step id);
- ``--agents`` openai-SDK agents (half of them streaming) through the proxy in front of the stand-in
  engine, in conversations of ``--agent-turns`` calls, one call after another.
Then the stack runs on unloaded for ``--after-minutes`` (default: the worker's state TTL, or 600 s
where this build has none, + 1 minute): state that ends is gone by then.

``--overload K``: after the soak, a capacity phase (``--capacity-minutes``, senders unpaced; capacity =
white-box steps/s reaching the pool over its second half), then twice that rate for K minutes, then
``--rate`` again for a minute (recovery).

Every ``--interval`` seconds (15) a sample, printed as a table row and kept: bytes on disk by component
(each Kafka topic, the worker's changelog topics ``changelog__*``, the pool, the worker's state dir, the
whole data dir), resident memory of each role, the worker's live state keys (and bytes) per namespace
(its changelog topics followed from the beginning: a key's last value wins, an empty one deletes it),
the supervisor's restarts (``run/supervisor.json``), the gateway's answers by status (429s, and those
with Retry-After), and freshness (``ingested_at - created_at_ms`` of each step's first version in the
pool, p50/p99, over the steps that landed since the last sample; also to its first rewarded version).

Summary: bytes per million steps by component (at their peak and at the end, over the steps in the
pool at the end), each role's RSS growth over the first and the second half of the soak, state keys at
their peak and at the end, restarts, 429s, lost (acknowledged but not in the pool: steps, rewards,
agent calls), freshness per phase (of the steps accepted in it) and, with ``--overload``, capacity,
429s and the rows of the recovery. Results: bench/results/soak.json, the stack's log
bench/results/soak_stack.log.

    .venv/bin/python -m bench.soak --minutes N --rate R [--after-minutes M] [--agents 4]
        [--overload K] [--state-ttl S] [--env CLAWR1_<NAME>=VALUE ...] [--interval 15]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import OFFSET_BEGINNING, Message, TopicPartition

from bench.bench_pipeline import Stack, agent_calls
from bench.bench_streams import posted_rollouts
from bench.common import disk_bytes, rss_by_role
from clawr1.core.kafka_io import make_consumer
from clawr1.core.registry import REGISTRY
from clawr1.gateway.client import GatewayClient, GatewayError

REPO = Path(__file__).resolve().parent.parent

RESULTS = REPO / "bench" / "results" / "soak.json"
GROUP = 64  # steps of a GRPO group: 8 rollouts x 8 turns
STATE_TTL = "CLAWR1_STREAMS_STATE_TTL_S"
LATE_S = 1.0  # how far behind its schedule the pacer lets the senders fall before it forgets the debt
MB = 1 << 20


class Tally:
    """Counts shared by the load's threads: acknowledged items, answers by status, errors."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.errors: list[str] = []

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.counts[name] += n

    def error(self, message: str) -> None:
        with self._lock:
            self.counts["errors"] += 1
            if len(self.errors) < 10:
                self.errors.append(message[:500])

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)


class TalliedTransport(httpx.HTTPTransport):
    """The client's transport, counting every answer by status (a retried request counts each time)
    and the 429s that say when to come back."""

    def __init__(self, tally: Tally) -> None:
        super().__init__()
        self.tally = tally

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.tally.add(f"http_{response.status_code}")
        if response.status_code == 429 and "retry-after" in response.headers:
            self.tally.add("http_429_retry_after")
        return response


class Pacer:
    """Hands out group numbers at ``rate`` steps/s to whichever sender asks (``None``: as fast as they
    ask; 0: none). A sender that fell behind sends at once, but at most ``LATE_S`` of debt is kept: a
    rollout worker that was held up does not burst its whole backlog."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._next = 0
        self._due = time.monotonic()
        self.rate: float | None = 0.0

    def set_rate(self, rate: float | None) -> None:
        with self._lock:
            self.rate, self._due = rate, time.monotonic()

    def take(self, stop: threading.Event) -> int | None:
        while not stop.is_set():
            with self._lock:
                now, rate = time.monotonic(), self.rate
                if rate is None or (rate > 0 and self._due <= now):
                    group, self._next = self._next, self._next + 1
                    if rate:
                        self._due = max(self._due, now - LATE_S) + GROUP / rate
                    return group
                wait = self._due - now if rate else 0.2
            stop.wait(min(wait, 0.2))
        return None


def sender(api: str, run: str, pacer: Pacer, stop: threading.Event, tally: Tally) -> None:
    """Posts GRPO groups as the pacer grants them, each step's reward after the group (every step
    rewarded), and counts what the gateway acknowledged."""
    with GatewayClient(api, batch_size=GROUP, timeout_s=60, transport=TalliedTransport(tally)) as client:
        while (group := pacer.take(stop)) is not None:
            steps = [{**s, "reward": None} for s in posted_rollouts(run, 1, first=group)]
            try:
                ids = client.submit_steps(steps)
            except GatewayError as exc:
                tally.add("steps_refused", len(steps))
                tally.error(f"steps: {exc}")
                continue
            tally.add("steps_acked", len(ids))
            try:
                client.submit_feedback([{"step_id": i, "reward": 1.0, "source": "rule"} for i in ids])
                tally.add("rewards_acked", len(ids))
            except GatewayError as exc:
                tally.add("rewards_refused", len(ids))
                tally.error(f"feedback: {exc}")


def agent(port: int, name: str, stream: bool, turns: int, think_s: float, stop: threading.Event,
          answered: list[int], tally: Tally) -> None:
    """One openai-SDK agent calling until ``stop``; a failed call is counted and a new conversation
    begins."""
    from openai import OpenAIError

    calls = itertools.takewhile(lambda _: not stop.is_set(), itertools.count())
    while not stop.is_set():
        try:
            agent_calls(port, name, calls, turns, answered, stream=stream, think_s=think_s)
        except OpenAIError as exc:
            tally.error(f"agent {name}: {type(exc).__name__}: {exc}")
            stop.wait(1.0)


def namespace(key: bytes, family: bytes) -> str:
    """A state key's namespace: the letters before its first ``/``, after the store's prefix (Quix writes
    ``clawr1|C/<name>``); prefixed by the column family where it is not the default one."""
    head = key.split(b"/", 1)[0].rsplit(b"|", 1)[-1].decode(errors="replace") if b"/" in key else "?"
    return head if family in (b"", b"default") else f"{family.decode(errors='replace')}:{head}"


class StateKeys:
    """The worker's live state keys, from its changelog topics (``changelog__*``, every partition, any
    topic that appears later too) read from the beginning and then followed."""

    def __init__(self, bootstrap: str) -> None:
        self.consumer = make_consumer(bootstrap, "bench-soak-" + uuid.uuid4().hex[:8])
        self.assigned: set[tuple[str, int]] = set()
        self.live: dict[bytes, tuple[str, int]] = {}

    def refresh(self, timeout_s: float = 30.0) -> bool:
        """Read what the changelogs gained up to their ends as of now (the worker keeps writing); False
        when ``timeout_s`` ran out first (the counts are then behind)."""
        topics = self.consumer.list_topics(timeout=10).topics
        new = [TopicPartition(name, p, OFFSET_BEGINNING) for name, meta in topics.items()
               if name.startswith("changelog__") for p in meta.partitions if (name, p) not in self.assigned]
        if new:
            self.consumer.incremental_assign(new)
            self.assigned |= {(tp.topic, tp.partition) for tp in new}
        ends = {tp: self.consumer.get_watermark_offsets(TopicPartition(*tp), timeout=10)[1]
                for tp in self.assigned}
        pending = [TopicPartition(*tp) for tp, end in ends.items() if end > 0]
        deadline = time.monotonic() + timeout_s
        while pending and time.monotonic() < deadline:
            for message in self.consumer.consume(10_000, 0.5):
                if not message.error():
                    self._apply(message)
            # A transaction's commit marker ends a partition: the position passes it once it is read.
            pending = [tp for tp in self.consumer.position(pending)
                       if tp.offset < ends[(tp.topic, tp.partition)]]
        return not pending

    def _apply(self, message: Message) -> None:
        key, value = message.key() or b"", message.value()
        if not value:
            self.live.pop(key, None)
            return
        family = dict(message.headers() or []).get("__column_family__") or b""
        self.live[key] = (namespace(key, family), len(value))

    def by_namespace(self) -> tuple[dict[str, int], dict[str, int]]:
        """Live keys and their values' bytes, per namespace."""
        keys: Counter[str] = Counter()
        size: Counter[str] = Counter()
        for ns, n in self.live.values():
            keys[ns] += 1
            size[ns] += n
        return dict(sorted(keys.items())), dict(sorted(size.items()))

    def close(self) -> None:
        self.consumer.close()


def disk_by_component(data_dir: Path) -> tuple[dict[str, int], dict[str, int]]:
    """Bytes on disk: the components (all Kafka topics, the changelogs, the pool, the worker's state, the
    whole data dir), and each topic (its partition folders on every broker)."""
    topics: Counter[str] = Counter()
    for root, dirs, files in os.walk(data_dir / "kafka"):
        match = re.fullmatch(r"(.+)-\d+", Path(root).name)
        if match and any(f.endswith(".log") for f in files):
            topics[match.group(1)] += disk_bytes(Path(root))
            dirs.clear()
    components = {"kafka": sum(topics.values()),
                  "changelog": sum(n for t, n in topics.items() if t.startswith("changelog__")),
                  "pool": disk_bytes(data_dir / "pool"), "worker_state": disk_bytes(data_dir / "streams"),
                  "data_dir": disk_bytes(data_dir)}
    return components, dict(sorted(topics.items()))


def restarts(data_dir: Path) -> dict[str, int]:
    """Restarts per role so far, as the supervisor records them."""
    try:
        roles = json.loads((data_dir / "run" / "supervisor.json").read_text())["roles"]
    except (FileNotFoundError, ValueError, KeyError):  # not written yet, or being replaced
        return {}
    out: Counter[str] = Counter()
    for role in roles:
        out[role["role"]] += int(role["restarts"])
    return dict(out)


def freshness(stack: Stack, t0_ms: int, t1_ms: int, by: str = "landed") -> dict[str, Any]:
    """p50/p99 (ms) of ``ingested_at - created_at_ms`` of each step's first version in the pool and of
    its first rewarded one, over the steps that landed (``by="landed"``; rewarded ones: whose reward
    landed) in ``[t0_ms, t1_ms)``, or that the gateway or proxy accepted then (``by="accepted"``)."""
    since = t0_ms - 3_600_000  # steps older than an hour are not looked at
    if by == "landed":
        first, rewarded = (f"first >= {t0_ms} AND first < {t1_ms}",
                           f"rewarded > 0 AND rewarded >= {t0_ms} AND rewarded < {t1_ms}")
    else:
        first = f"created >= {t0_ms} AND created < {t1_ms}"
        rewarded = f"rewarded > 0 AND {first}"
    row = stack.sql(
        "SELECT quantilesExactIf(0.5, 0.99)(first - created, " + first + ") AS fresh, "
        "countIf(" + first + ") AS n, "
        "quantilesExactIf(0.5, 0.99)(rewarded - created, " + rewarded + ") AS fresh_rewarded, "
        "countIf(" + rewarded + ") AS n_rewarded FROM ("
        "SELECT step_id, min(toUnixTimestamp64Milli(ingested_at)) AS first, "
        "minIf(toUnixTimestamp64Milli(ingested_at), reward_status = 'final') AS rewarded, "
        "min(toUnixTimestamp64Milli(created_at_ms)) AS created FROM step_versions "
        f"WHERE toUnixTimestamp64Milli(created_at_ms) >= {since} GROUP BY step_id)")[0]
    n, n_rewarded = int(row["n"]), int(row["n_rewarded"])
    return {"n": n, "p50_ms": row["fresh"][0] if n else None, "p99_ms": row["fresh"][1] if n else None,
            "n_rewarded": n_rewarded, "rewarded_p50_ms": row["fresh_rewarded"][0] if n_rewarded else None,
            "rewarded_p99_ms": row["fresh_rewarded"][1] if n_rewarded else None}


@dataclass
class Soak:
    """The stack, the load on it and what was sampled of it."""

    stack: Stack
    run: str
    args: argparse.Namespace
    tally: Tally = field(default_factory=Tally)
    pacer: Pacer = field(default_factory=Pacer)
    stop_senders: threading.Event = field(default_factory=threading.Event)
    stop_agents: threading.Event = field(default_factory=threading.Event)
    answered: dict[bool, list[int]] = field(default_factory=lambda: {False: [], True: []})
    samples: list[dict[str, Any]] = field(default_factory=list)
    phases: list[dict[str, Any]] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    last_ms: int = field(default_factory=lambda: int(time.time() * 1000))

    def __post_init__(self) -> None:
        self.state = StateKeys(self.stack.bootstrap)

    def start_load(self) -> None:
        args = self.args
        for _ in range(args.senders):
            self._thread(sender, self.stack.api, self.run, self.pacer, self.stop_senders, self.tally)
        if args.agents:
            # One call alone first: threads that build the SDK's lazily built models at once can fail.
            agent_calls(self.stack.reverse_port, f"{self.run}-a-first", range(1), 1, self.answered[False])
        for k in range(args.agents):
            streamed = k % 2 == 1
            self._thread(agent, self.stack.reverse_port, f"{self.run}-a{k}", streamed, args.agent_turns,
                         args.agent_think_s, self.stop_agents, self.answered[streamed], self.tally)

    def _thread(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        thread.start()
        self.threads.append(thread)

    def stop_load(self) -> None:
        self.pacer.set_rate(0.0)
        self.stop_senders.set()
        self.stop_agents.set()
        for thread in self.threads:
            thread.join(180)  # a sender may be retrying its last request

    def phase(self, name: str, seconds: float, rate: float | None) -> dict[str, Any]:
        """Load at ``rate`` (None: senders unpaced) for ``seconds``, sampled every interval."""
        self.pacer.set_rate(rate)
        begin_ms, end, before = int(time.time() * 1000), time.monotonic() + seconds, self.tally.snapshot()
        first = len(self.samples)
        tick = time.monotonic()
        while tick < end:  # samples on a fixed beat (a sample's own time included), the last at the end
            tick = min(end, tick + self.args.interval)
            time.sleep(max(0.0, tick - time.monotonic()))
            self.sample(name, rate)
        after = self.tally.snapshot()
        info = {"phase": name, "seconds": round(seconds), "rate": rate, "begin_ms": begin_ms,
                "end_ms": int(time.time() * 1000), "samples": [first, len(self.samples)],
                "load": {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)},
                "p99_ms_by_sample": [s["freshness"]["p99_ms"] for s in self.samples[first:]]}
        self.phases.append(info)
        return info

    def pool_counts(self) -> dict[str, int]:
        row = self.stack.sql(
            f"SELECT countIf(trajectory_id LIKE '{self.run}-g%') AS whitebox, "
            f"countIf(trajectory_id LIKE '{self.run}-g%' AND reward_status = 'final') AS rewarded, "
            f"countIf(agent LIKE '{self.run}-a%') AS agents, count() AS steps FROM steps")[0]
        return {k: int(v) for k, v in row.items()}

    def sample(self, phase: str, rate: float | None) -> dict[str, Any]:
        now_ms = int(time.time() * 1000)
        read_from = time.monotonic()
        caught_up = self.state.refresh()
        state_read_s = round(time.monotonic() - read_from, 1)
        keys, key_bytes = self.state.by_namespace()
        disk, topics = disk_by_component(self.stack.data_dir)
        fresh = freshness(self.stack, self.last_ms, now_ms)
        sample: dict[str, Any] = {
            "t_s": round(time.monotonic() - self.started, 1), "phase": phase, "rate": rate,
            "load": {**self.tally.snapshot(), "agent_calls": len(self.answered[False]),
                     "agent_calls_streamed": len(self.answered[True])},
            "pool": self.pool_counts(), "disk": disk, "topics": topics,
            "rss": dict(sorted(rss_by_role(self.stack.up.pid).items())),
            "state_keys": keys, "state_bytes": key_bytes, "state_caught_up": caught_up,
            "state_read_s": state_read_s, "restarts": restarts(self.stack.data_dir),
            "freshness": fresh, "in_per_s": round(fresh["n"] * 1000 / max(1, now_ms - self.last_ms), 1),
        }
        self.last_ms = now_ms
        self.samples.append(sample)
        print(row(sample), flush=True)
        return sample

    def settle(self, quiet_s: float = 30.0, timeout_s: float = 900.0) -> bool:
        """Until the pool holds every acknowledged step, reward and agent call, or its counts stood still
        for ``quiet_s``; whether that took a wait (the load outran the after phase)."""
        deadline, since, waited = time.monotonic() + timeout_s, time.monotonic(), False
        last: dict[str, int] = {}
        while time.monotonic() < deadline:
            counts, load = self.pool_counts(), self.tally.snapshot()
            if (counts["whitebox"] >= load.get("steps_acked", 0)
                    and counts["rewarded"] >= load.get("rewards_acked", 0)
                    and counts["agents"] >= sum(len(a) for a in self.answered.values())):
                return waited
            if counts != last:
                last, since = counts, time.monotonic()
            elif time.monotonic() - since > quiet_s:
                return waited
            waited = True
            time.sleep(2)
        return waited

    def capacity(self, info: dict[str, Any]) -> float:
        """White-box steps/s that reached the pool over the second half of the phase ``info``."""
        rows = self.samples[info["samples"][0]:info["samples"][1]]
        half = rows[0]["t_s"] + (rows[-1]["t_s"] - rows[0]["t_s"]) / 2 if rows else 0
        second = [s for s in rows if s["t_s"] >= half] or rows
        if len(second) < 2:
            raise RuntimeError("the capacity phase needs at least 3 samples: raise --capacity-minutes")
        return ((second[-1]["pool"]["whitebox"] - second[0]["pool"]["whitebox"])
                / (second[-1]["t_s"] - second[0]["t_s"]))


HEADER = (f"{'t_s':>7} {'phase':<9} {'rate':>6} {'pool':>8} {'in/s':>6} {'kafkaMB':>8} {'chlogMB':>8} "
          f"{'poolMB':>7} {'stateMB':>8} {'dataMB':>8} {'wrkRSS':>7} {'keys':>7} {'429':>5} {'rst':>3} "
          f"{'p50ms':>6} {'p99ms':>7} {'rwp99':>7}  keys by namespace")


def row(s: dict[str, Any]) -> str:
    """One sample as a table row (MB, ms)."""
    fresh, disk = s["freshness"], s["disk"]
    rate = "max" if s["rate"] is None else f"{s['rate']:.0f}"
    ns = " ".join(f"{k}={v}" for k, v in s["state_keys"].items())

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    return (f"{s['t_s']:>7.0f} {s['phase']:<9} {rate:>6} {s['pool']['steps']:>8} {s['in_per_s']:>6.0f} "
            f"{disk['kafka'] / MB:>8.1f} {disk['changelog'] / MB:>8.1f} {disk['pool'] / MB:>7.1f} "
            f"{disk['worker_state'] / MB:>8.1f} {disk['data_dir'] / MB:>8.1f} "
            f"{s['rss'].get('worker', 0) / MB:>7.0f} {sum(s['state_keys'].values()):>7} "
            f"{s['load'].get('http_429', 0):>5} {sum(s['restarts'].values()):>3} {ms(fresh['p50_ms']):>6} "
            f"{ms(fresh['p99_ms']):>7} {ms(fresh['rewarded_p99_ms']):>7}  {ns}")


def growth(before: float, after: float) -> float | None:
    return round(after / before - 1, 3) if before else None


def summarize(soak: Soak, load_phases: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the soak is run for, from its samples."""
    samples, end = soak.samples, soak.samples[-1]
    steps = end["pool"]["steps"]
    per_million = 1e6 / steps if steps else 0.0
    components = list(end["disk"]) + sorted(end["topics"])

    def size(s: dict[str, Any], name: str) -> int:
        return int(s["disk"].get(name, s["topics"].get(name, 0)))

    def figures(peak: int, last: int) -> dict[str, float]:
        return {"peak_mb": round(peak / MB, 1), "end_mb": round(last / MB, 1),
                "peak_gb_per_million_steps": round(peak * per_million / 1e9, 3),
                "end_gb_per_million_steps": round(last * per_million / 1e9, 3)}

    disk = {name: figures(max(size(s, name) for s in samples), size(end, name)) for name in components}
    soak_rows = samples[load_phases[0]["samples"][0]:load_phases[0]["samples"][1]]
    rss: dict[str, Any] = {}
    if len(soak_rows) >= 3:
        first, mid, last = soak_rows[0], soak_rows[len(soak_rows) // 2], soak_rows[-1]
        for role in mid["rss"]:
            at = [s["rss"].get(role, 0) for s in (first, mid, last)]
            mb = {f"{k}_mb": round(v / MB) for k, v in zip(("first", "mid", "end"), at, strict=True)}
            rss[role] = {**mb,
                         "first_half_growth": growth(at[0], at[1]),
                         "second_half_growth": growth(at[1], at[2])}
    peak = max(samples, key=lambda s: sum(s["state_keys"].values()))
    total = {k: sum(s["state_keys"].values()) for k, s in (("peak", peak), ("end", end))}
    # Live state bytes: what the worker holds; expiry markers (Z) are a few bytes a trajectory.
    byte_peak = max(sum(s["state_bytes"].values()) for s in samples)
    byte_end = sum(end["state_bytes"].values())
    load = end["load"]
    lost = {"steps": load.get("steps_acked", 0) - end["pool"]["whitebox"],
            "rewards": load.get("rewards_acked", 0) - end["pool"]["rewarded"],
            "agent_calls": load["agent_calls"] + load["agent_calls_streamed"] - end["pool"]["agents"]}
    return {
        "steps_in_pool": steps, "pool": end["pool"], "disk": disk, "rss": rss,
        "state_keys": {"peak": total["peak"], "end": total["end"],
                       "end_vs_peak": round(total["end"] / total["peak"], 3) if total["peak"] else None,
                       "peak_by_namespace": peak["state_keys"], "end_by_namespace": end["state_keys"],
                       "end_bytes_by_namespace": end["state_bytes"],
                       "peak_bytes": byte_peak, "end_bytes": byte_end,
                       "end_vs_peak_bytes": round(byte_end / byte_peak, 4) if byte_peak else None},
        "restarts": {role: n - samples[0]["restarts"].get(role, 0) for role, n in end["restarts"].items()},
        "http": {k: v for k, v in sorted(load.items()) if k.startswith("http_")},
        "load": load, "lost": lost, "errors": soak.tally.errors,
        "freshness_by_phase": {p["phase"]: freshness(soak.stack, p["begin_ms"], p["end_ms"], by="accepted")
                               for p in load_phases},
    }


def report(result: dict[str, Any]) -> list[str]:
    """The summary as a few lines of text (the whole of it is in the JSON)."""
    s = result["summary"]
    main = ("kafka", "changelog", "pool", "worker_state", "data_dir")
    lines = [f"steps in the pool: {s['steps_in_pool']} ({s['pool']['whitebox']} white-box, "
             f"{s['pool']['agents']} agent calls)",
             "GB per million steps, peak / end: " + ", ".join(
                 f"{k} {d['peak_gb_per_million_steps']} / {d['end_gb_per_million_steps']}"
                 for k, d in ((k, s["disk"][k]) for k in main)),
             "RSS MB first / mid / end of the soak (growth over each half): " + ", ".join(
                 f"{role} {r['first_mb']} / {r['mid_mb']} / {r['end_mb']} ({r['first_half_growth']:+.0%}, "
                 f"{r['second_half_growth']:+.0%})" for role, r in s["rss"].items()
                 if r["first_half_growth"] is not None and r["second_half_growth"] is not None)]
    keys = s["state_keys"]
    lines.append(f"state keys: peak {keys['peak']}, end {keys['end']} ({keys['end_vs_peak']} of the peak); "
                 "at the end " + " ".join(f"{k}={v}" for k, v in keys["end_by_namespace"].items()))
    lines.append(f"state bytes: peak {keys['peak_bytes']}, end {keys['end_bytes']} "
                 f"({keys['end_vs_peak_bytes']} of the peak)")
    http = s["http"]
    lines.append(f"restarts {s['restarts']}; 429s {http.get('http_429', 0)} "
                 f"({http.get('http_429_retry_after', 0)} with Retry-After); lost {s['lost']}")
    if result["capacity_steps_per_s"] is not None:
        lines.append(f"capacity {result['capacity_steps_per_s']} white-box steps/s reaching the pool")
    for phase in result["phases"]:
        if phase["phase"] in s["freshness_by_phase"]:
            f, load = s["freshness_by_phase"][phase["phase"]], phase["load"]
            lines.append(
                f"{phase['phase']}: offered {phase['rate'] or 'max'} steps/s, acknowledged "
                f"{load.get('steps_acked', 0) / phase['seconds']:.0f}/s, 429s {load.get('http_429', 0)} "
                f"({load.get('http_429_retry_after', 0)} with Retry-After); freshness of its steps p50 "
                f"{f['p50_ms']} ms, p99 {f['p99_ms']} ms (to the reward p99 {f['rewarded_p99_ms']} ms); "
                f"p99 by sample {phase['p99_ms_by_sample']}")
    return lines


def parse_env(pairs: list[str], state_ttl: float | None) -> dict[str, str]:
    """The stack's own settings: ``--env`` pairs (declared names only: the stack refuses others) and the
    state TTL where this build declares it."""
    env = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in REGISTRY:
            raise SystemExit(f"--env {name}: not a setting of this build (see docs/settings.md)")
        env[name] = value
    if state_ttl is not None:
        if STATE_TTL in REGISTRY:
            env[STATE_TTL] = f"{state_ttl:g}"
        else:
            print(f"this build has no {STATE_TTL}: --state-ttl ignored, state is kept", file=sys.stderr)
    return env


def state_ttl_s(env: dict[str, str]) -> float:
    """The state TTL the stack runs with (600 s where this build has none)."""
    if STATE_TTL in env:
        return float(env[STATE_TTL])
    if STATE_TTL in os.environ:
        return float(os.environ[STATE_TTL])
    return float(REGISTRY[STATE_TTL].default) if STATE_TTL in REGISTRY else 600.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="minutes of mixed load")
    parser.add_argument("--rate", type=float, default=100.0, help="white-box steps/s")
    parser.add_argument("--after-minutes", type=float, default=None,
                        help="minutes observed after the load (default: the state TTL + 1)")
    parser.add_argument("--agents", type=int, default=4, help="openai-SDK agents (half streamed)")
    parser.add_argument("--agent-turns", type=int, default=8, help="calls per agent conversation")
    parser.add_argument("--agent-think-s", type=float, default=0.0, help="an agent's pause between calls")
    parser.add_argument("--senders", type=int, default=4,
                        help="threads posting groups (raise it where acknowledged falls short of offered)")
    parser.add_argument("--overload", type=float, default=0.0,
                        help="minutes at 2x the measured capacity after the soak (0: skip)")
    parser.add_argument("--capacity-minutes", type=float, default=1.0, help="the capacity phase's length")
    parser.add_argument("--state-ttl", type=float, default=None, help=f"seconds, passed as {STATE_TTL}")
    parser.add_argument("--env", action="append", default=[], metavar="CLAWR1_<NAME>=VALUE",
                        help="a setting for the stack (repeatable)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--interval", type=float, default=15.0, help="seconds between samples")
    args = parser.parse_args()
    env = parse_env(args.env, args.state_ttl)
    after = args.after_minutes if args.after_minutes is not None else state_ttl_s(env) / 60 + 1
    with tempfile.TemporaryDirectory(prefix="clawr1-soak-") as tmp:
        stack = Stack(Path(tmp) / "soak", workers=args.workers, env=env,
                      kept_log=RESULTS.with_name("soak_stack.log"))
        soak: Soak | None = None
        try:
            stack.wait_healthy()
            soak = Soak(stack, "soak" + uuid.uuid4().hex[:6], args)
            print(HEADER, flush=True)
            soak.sample("start", 0.0)
            soak.start_load()
            load = [soak.phase("soak", args.minutes * 60, args.rate)]
            capacity = None
            if args.overload:
                load.append(soak.phase("capacity", args.capacity_minutes * 60, None))
                capacity = soak.capacity(load[-1])
                load.append(soak.phase("overload", args.overload * 60, round(2 * capacity, 1)))
                load.append(soak.phase("recover", 60, args.rate))
            soak.stop_load()
            soak.phase("after", after * 60, 0.0)
            if soak.settle():
                soak.sample("settled", 0.0)
            result = {"args": vars(args), "stack_env": env,
                      "capacity_steps_per_s": None if capacity is None else round(capacity, 1),
                      "summary": summarize(soak, load), "phases": soak.phases, "samples": soak.samples}
        finally:
            if soak is not None:
                soak.stop_load()
                soak.state.close()
            stack.stop()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print("\n".join(report(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
