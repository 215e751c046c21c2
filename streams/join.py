"""The reward join: step facts and feedback, folded into versioned normalized steps.

State lives per step (``StepState``: the step's fact and its own feedback, which may arrive first)
and per trajectory (``TrajectoryState``: which steps it has at which index, and trajectory-level
feedback). Every state is a set of distinct facts, and a step record is a pure function of those
sets, so the outcome does not depend on arrival order, and re-delivered facts change nothing:

    version = distinct step facts + distinct step feedback + distinct trajectory feedback
              + steps seen at index - 1 (only for steps whose parent is found by index)
              + 1 once the step is superseded
              + 1 once the step is revived (a later call continued it after all)
              + 1 once the trajectory is complete and the step is below its last index

A superseded step (a retry the agent threw away) keeps its own feedback but gets no trajectory
reward and is never ready. The linker revisits that decision when a later call continues the step:
it is then revived for good (a continued step is never superseded again), so "superseded and not
revived" is a function of the two facts, whichever arrived first.

Trajectory feedback with ``terminal`` (the compat port's ``complete_trajectory``) says the trajectory
is complete: its highest-index step is terminal, whichever arrived first. A step that arrives later at
a higher index takes the mark over (the last term above counts for the step that loses it), so the
outcome is the same in any order; a call made after the completion would take it too.

Each term only grows, so every change gets a higher version, the final version of a step is the
same in any order, and equal versions carry equal content within one history of the input.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the fold itself needs no tokenizer: the sink runs it without one (``rejoin``)
    from clawr1.streams.normalize import StepFact
from clawr1.streams.readiness import TRAINABLE_STATUSES, ReadinessRule
from clawr1.streams.rewards import distinct_facts, fact_digest, fold_rewards, human_score, labels_of


@dataclass
class StepState:
    base: dict[str, Any] | None = None
    base_digest: str = ""
    base_digests: list[str] = field(default_factory=list)
    feedback: list[dict[str, Any]] = field(default_factory=list)  # distinct by content digest
    superseded: bool = False  # the linker found the trajectory continued from a sibling (a retry)
    revived: bool = False  # ... and later found the step continued after all: it stands

    def to_json(self) -> dict[str, Any]:
        return {"base": self.base, "base_digest": self.base_digest, "base_digests": self.base_digests,
                "feedback": self.feedback, "superseded": self.superseded, "revived": self.revived}

    @property
    def thrown_away(self) -> bool:
        return self.superseded and not self.revived

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> StepState:
        return cls(**data) if data else cls()


@dataclass
class TrajectoryState:
    # step index (as a string: JSON keys) -> ids of the steps ever seen at that index, sorted
    entries: dict[str, list[str]] = field(default_factory=dict)
    feedback: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"entries": self.entries, "feedback": self.feedback}

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> TrajectoryState:
        return cls(**data) if data else cls()

    def at(self, index: int) -> list[str]:
        return self.entries.get(str(index), [])

    def step_ids(self) -> list[str]:
        return sorted({s for ids in self.entries.values() for s in ids})

    def completed(self) -> bool:
        """Whether trajectory feedback marked the trajectory complete (``terminal``)."""
        return any(f.get("terminal") for f in self.feedback)

    def last_index(self) -> int:
        return max(map(int, self.entries), default=-1)

    def below_last(self, index: int) -> bool:
        """Whether a step at ``index`` is below the last of a completed trajectory (it may have been
        the last before): a version term, once true it stays true."""
        return self.completed() and index < self.last_index()

    def is_last(self, index: int) -> bool:
        """Whether a step at ``index`` is the terminal one of a completed trajectory."""
        return self.completed() and index == self.last_index()


def displaced_terminals(trajectory: TrajectoryState, index: int) -> list[str]:
    """Steps that lost the terminal mark to the step at ``index`` (call after folding it in), to publish
    again: those at the highest index below it, when it is the last of a completed trajectory. Also
    on a re-delivered step, whose first publication of them a crash may have lost."""
    if not trajectory.is_last(index):
        return []
    below = [int(i) for i in trajectory.entries if int(i) < index]
    return trajectory.at(max(below)) if below else []


def _add_fact(facts: list[dict[str, Any]], fact: dict[str, Any]) -> bool:
    """Add unless the same content is there already; True when added."""
    digest = fact_digest(fact)
    if any(fact_digest(f) == digest for f in facts):
        return False
    facts.append(fact)
    return True


def apply_step_fact(state: StepState, trajectory: TrajectoryState, fact: StepFact) -> bool:
    """Fold a step fact in; True when it was new. Steps at the next index whose parent is found by
    index (``trajectory.at(index + 1)``) may change with it."""
    base = fact.step
    digest = fact_digest(base)
    new = digest not in state.base_digests
    if new:
        state.base_digests.append(digest)
        current = state.base
        if current is None or (base["updated_at_ms"], digest) > (current["updated_at_ms"], state.base_digest):
            state.base, state.base_digest = base, digest
    for inline in fact.feedback:
        new = _add_fact(state.feedback, inline) or new
    index = str(base["step_index"])
    at_index = trajectory.entries.setdefault(index, [])
    if base["step_id"] not in at_index:
        at_index.append(base["step_id"])
        at_index.sort()
        new = True
    return new


def apply_supersede(state: StepState, revive: bool = False) -> bool:
    """Mark the step superseded, or with ``revive`` continued after all; True when it was not yet."""
    attribute = "revived" if revive else "superseded"
    new = not getattr(state, attribute)
    setattr(state, attribute, True)
    return new


def apply_feedback(facts: list[dict[str, Any]], fact: dict[str, Any]) -> bool:
    """Fold step- or trajectory-level feedback into its state's list; True when it was new."""
    return _add_fact(facts, fact)


def parent_candidates(base: dict[str, Any], trajectory: TrajectoryState) -> list[str]:
    """Steps that may be the parent when the source gave none: those seen at the previous index."""
    if base["parent_step_id"] is not None or base["step_index"] == 0:
        return []
    return [s for s in trajectory.at(base["step_index"] - 1) if s != base["step_id"]]


def effective_parent(base: dict[str, Any], trajectory: TrajectoryState) -> str | None:
    candidates = parent_candidates(base, trajectory)
    return candidates[0] if candidates else base["parent_step_id"]


def build_step(state: StepState, trajectory: TrajectoryState, rule: ReadinessRule) -> dict[str, Any] | None:
    """The normalized step record (step.avsc) for the current facts; None until the step itself arrived."""
    base = state.base
    if base is None:
        return None
    step_facts = distinct_facts(state.feedback)
    trajectory_facts = [] if state.thrown_away else distinct_facts(trajectory.feedback)
    reward = fold_rewards(step_facts)
    trajectory_reward = fold_rewards(trajectory_facts)
    everything = sorted(step_facts + trajectory_facts, key=lambda f: (f["received_at_ms"], f["feedback_id"]))
    record = {
        **base,
        "parent_step_id": effective_parent(base, trajectory),
        "version": len(state.base_digests) + len(state.feedback) + len(trajectory.feedback)
        + len(parent_candidates(base, trajectory)) + state.superseded + state.revived
        + trajectory.below_last(base["step_index"]),
        "terminal": base["terminal"] or trajectory.is_last(base["step_index"]),
        "reward": reward.value,
        "reward_components": reward.components,
        "reward_source": reward.sources,
        "reward_status": reward.status,
        "trajectory_reward": trajectory_reward.value,
        "trajectory_reward_status": trajectory_reward.status,
        "feedback_json": json.dumps(everything, ensure_ascii=False, separators=(",", ":")),
        "quality_labels": labels_of(everything),
        "quality_score": human_score(everything),
        "updated_at_ms": max([base["updated_at_ms"], *(f["received_at_ms"] for f in everything)]),
    }
    if state.thrown_away:
        record["link_status"] = "superseded"
    record["ready"] = rule.is_ready(record)
    return record


def rejoin(row: dict[str, Any], fact: dict[str, Any], rule: ReadinessRule) -> dict[str, Any] | None:
    """A step's next version from its last one (as the pool holds it) and feedback that came after the
    worker let the step's state go: the fold of ``build_step`` over the facts the row records plus this
    one. None when the row holds the fact already (a replay)."""
    facts = json.loads(row["feedback_json"] or "[]")
    on_trajectory = [f for f in facts if f["target_kind"] == "trajectory"]
    on_step = [f for f in facts if f["target_kind"] != "trajectory"]
    if not apply_feedback(on_trajectory if fact["target_kind"] == "trajectory" else on_step, fact):
        return None
    state = StepState(base=row, feedback=on_step, superseded=row["link_status"] == "superseded")
    record = build_step(state, TrajectoryState(feedback=on_trajectory), rule)
    assert record is not None  # it has its base
    record["version"] = row["version"] + 1
    return record


def scope_of(record: dict[str, Any]) -> tuple[str, str]:
    """The prefix-tree merge scope of a step: its prompt group, else its trajectory."""
    if record["prompt_group_id"]:
        return record["prompt_group_id"], "prompt_group"
    return record["trajectory_id"], "trajectory"


def mergeable(record: dict[str, Any]) -> bool:
    """Whether the step's tokens go into its scope's prefix tree (ready or not, as long as tokenized and
    of a trainable status)."""
    tokenized = record["token_provenance"] != "none" and len(record["prompt_token_ids"]) > 0
    return record["status"] in TRAINABLE_STATUSES and tokenized
