"""When a step is training-ready: a small, configurable conjunction of requirements.

The rule is a comma-separated list of requirement words (``CLAWR1_READY_RULE``); a step is ready
when its status is trainable, it is not a superseded retry, and it meets every listed requirement.
Default ``tokens,final_outcome``: a final reward of the step or of its trajectory, so both dense
step rewards and the sparse outcomes of GRPO rollouts (the seed protocol's ``complete_trajectory``)
make steps trainable without configuration.

A refusal is the policy's own action, so a ``refused`` step is training data like an ``ok`` one; a
``truncated`` step lacks the end of its action, a ``failed`` one has none and a ``no_content`` one (an
OpenTelemetry span without its messages) has neither state nor action: never ready.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

REQUIREMENTS = {
    "tokens": "prompt and response token ids present (engine or re-tokenized)",
    "engine_tokens": "token ids exactly as the serving engine produced them",
    "reward": "a step reward, provisional or final",
    "final_reward": "a final step reward",
    "final_trajectory_reward": "a final trajectory-level reward",
    "final_outcome": "a final step reward or a final trajectory-level reward",
}


DEFAULT_RULE = "tokens,final_outcome"
TRAINABLE_STATUSES = frozenset({"ok", "refused"})


@dataclass(frozen=True)
class ReadinessRule:
    requires: frozenset[str] = frozenset(DEFAULT_RULE.split(","))

    @classmethod
    def parse(cls, text: str) -> ReadinessRule:
        words = frozenset(w.strip() for w in text.split(",") if w.strip())
        unknown = words - set(REQUIREMENTS)
        if unknown:
            known = ", ".join(sorted(REQUIREMENTS))
            raise ValueError(f"unknown readiness requirement(s) {sorted(unknown)}; known: {known}")
        return cls(words)

    def is_ready(self, step: dict[str, Any]) -> bool:
        """``step`` is a normalized step record (step.avsc field names)."""
        if step["status"] not in TRAINABLE_STATUSES or step["link_status"] == "superseded":
            return False
        has_tokens = len(step["prompt_token_ids"]) > 0 and len(step["response_token_ids"]) > 0
        final_step = step["reward"] is not None and step["reward_status"] == "final"
        final_trajectory = (step["trajectory_reward"] is not None
                            and step["trajectory_reward_status"] == "final")
        checks = {
            "tokens": has_tokens and step["token_provenance"] != "none",
            "engine_tokens": has_tokens and step["token_provenance"] == "engine",
            "reward": step["reward"] is not None,
            "final_reward": final_step,
            "final_trajectory_reward": final_trajectory,
            "final_outcome": final_step or final_trajectory,
        }
        return all(checks[word] for word in self.requires)
