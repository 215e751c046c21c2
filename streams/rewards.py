"""Feedback facts and how several of them fold into a step's (or trajectory's) reward.

Folding is order-independent, so the same set of feedback gives the same reward however the
events interleaved (a replay after a crash included):

- one fact per ``feedback_id``; if a sender reused an id with other content, the later received
  (then the larger content digest) wins;
- rewards come per source, a source being ``(source, source_name)`` (e.g. ``reward_model``/``rm-a``);
  each source's newest reward-bearing fact (by ``received_at_ms``, then id) stands, so a final
  reward replaces the same source's provisional one;
- the value is the sum over sources (a fact with components but no reward counts as the sum of its
  components); components with one name add up across sources;
- the status is ``final`` when every source's standing fact is final, else ``pending``.
Labels, comments and corrections never change a reward; they are kept in ``feedback_json``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from clawr1.streams.turns import InvalidEvent

TARGET_KINDS = ("step", "response", "trajectory")


def fact_digest(fact: dict[str, Any]) -> str:
    """Content identity of a fact (a step's source record, a feedback): orjson with sorted keys, as a
    step fact carries its token ids and this runs for every step (the standard library's encoder was
    the worker's largest single cost)."""
    return hashlib.sha256(orjson.dumps(fact, option=orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY)
                          ).hexdigest()[:32]


def feedback_fact(record: dict[str, Any]) -> dict[str, Any]:
    """A validated feedback record (feedback.avsc) as a plain, JSON-safe fact."""
    if record["target_kind"] not in TARGET_KINDS:
        kinds = ", ".join(TARGET_KINDS)
        raise InvalidEvent(f"target_kind must be one of {kinds}, got {record['target_kind']!r}")
    if not record["target_id"]:
        raise InvalidEvent("target_id is empty")
    if not record["feedback_id"]:
        raise InvalidEvent("feedback_id is empty")
    numbers = [record["reward"], *record["components"].values()]
    if any(v is not None and not math.isfinite(v) for v in numbers):
        raise InvalidEvent("reward and components must be finite numbers")
    if record["terminal"] and record["target_kind"] != "trajectory":
        raise InvalidEvent("terminal marks a trajectory complete; this feedback targets a "
                           f"{record['target_kind']}")
    fact = {k: record[k] for k in ("feedback_id", "target_kind", "target_id", "reward", "components", "final",
                                   "source", "source_name", "label", "comment", "correction",
                                   "received_at_ms")}
    if record["terminal"]:  # only when set: facts stored before the field existed keep their digests
        fact["terminal"] = True
    if record.get("privileged"):  # as terminal; records of earlier schema versions have no such field
        fact["privileged"] = True
    return fact


def inline_fact(step_id: str, reward: float, final: bool, source: str, source_name: str,
                received_at_ms: int) -> dict[str, Any]:
    """A reward that arrived with its step (white-box steps, service turns), as a feedback fact."""
    return {"feedback_id": f"{step_id}:inline", "target_kind": "step", "target_id": step_id, "reward": reward,
            "components": {}, "final": final, "source": source, "source_name": source_name, "label": None,
            "comment": None, "correction": None, "received_at_ms": received_at_ms}


def _order(fact: dict[str, Any]) -> tuple[int, str]:
    return fact["received_at_ms"], fact["feedback_id"]


def distinct_facts(facts: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One fact per feedback id, oldest first."""
    by_id: dict[str, tuple[int, str, dict[str, Any]]] = {}
    for fact in facts:
        candidate = (fact["received_at_ms"], fact_digest(fact), fact)
        known = by_id.get(fact["feedback_id"])
        if known is None or candidate[:2] > known[:2]:
            by_id[fact["feedback_id"]] = candidate
    return sorted((entry[2] for entry in by_id.values()), key=_order)


@dataclass(frozen=True)
class RewardFold:
    value: float | None
    components: dict[str, float]
    sources: str | None
    status: str  # pending | final


def _value(fact: dict[str, Any]) -> float | None:
    if fact["reward"] is not None:
        return float(fact["reward"])
    if fact["components"]:
        return float(sum(fact["components"].values()))
    return None


def fold_rewards(facts: list[dict[str, Any]]) -> RewardFold:
    """``facts`` as returned by ``distinct_facts`` (oldest first)."""
    standing: dict[tuple[str, str], dict[str, Any]] = {}
    for fact in facts:
        if _value(fact) is not None:
            standing[(fact["source"], fact["source_name"])] = fact
    if not standing:
        return RewardFold(None, {}, None, "pending")
    components: dict[str, float] = {}
    for fact in standing.values():
        for name, value in fact["components"].items():
            components[name] = components.get(name, 0.0) + value
    names = sorted({f"{source}:{name}" if name else source or "unspecified" for source, name in standing})
    return RewardFold(
        value=sum(v for f in standing.values() if (v := _value(f)) is not None),
        components=components,
        sources=",".join(names),
        status="final" if all(f["final"] for f in standing.values()) else "pending",
    )


def labels_of(facts: Iterable[dict[str, Any]]) -> list[str]:
    return sorted({f["label"] for f in facts if f["label"]})


def human_score(facts: list[dict[str, Any]]) -> float | None:
    """Quality score for curation: the newest reward a human gave (source ``human``)."""
    rated = [f for f in facts if f["source"] == "human" and _value(f) is not None]
    return _value(rated[-1]) if rated else None
