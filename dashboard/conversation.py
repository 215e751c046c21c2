"""A trajectory as the conversation it was: what each step added, what the model answered, what it got.

Every step of a multi-turn trajectory stores its whole prompt, so step k repeats steps 0..k-1. The view
shows only what is new at each step: the prompt messages after the ones the previous step already sent
(and after the previous reply, which the agent sends back as an assistant message), and the prompt token
ids after the longest prefix shared with the previous step's prompt and response ids. A step whose
prompt does not start with the previous one (a history the agent trimmed or rewrote) is flagged as
``rewritten`` and shows the messages from where the two part.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from clawr1.dashboard.decoding import TokenDecoder

TOKENS_SHOWN = 2048
"""Token ids (and their decoded pieces) sent per list: enough to read a turn, bounded for long ones."""
_SHOWN_APART = frozenset({"prompt_messages", "prompt_token_ids", "response_token_ids"})


def message_list(prompt: Any) -> list[Any] | None:
    """The chat messages of a captured prompt (a list, or ``{"messages": [...]}``); None for anything
    else (a raw completions prompt, text that was not JSON), which is shown as captured."""
    if isinstance(prompt, list):
        return prompt
    if isinstance(prompt, Mapping) and isinstance(prompt.get("messages"), list):
        return list(prompt["messages"])
    return None


def common_prefix(a: Sequence[Any], b: Sequence[Any]) -> int:
    """How many leading items ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def new_messages(previous_prompt: Any, prompt: Any) -> dict[str, Any]:
    """What a step's prompt adds to the previous step's: ``repeated`` leading messages, the ``messages``
    after them, and ``rewritten`` when the prompt does not extend the previous one."""
    messages = message_list(prompt)
    if messages is None:
        return {"repeated": 0, "messages": prompt, "rewritten": False}
    before = message_list(previous_prompt) or []
    repeated = common_prefix(before, messages)
    rewritten = repeated < len(before)
    if before and not rewritten and repeated < len(messages) and _role(messages[repeated]) == "assistant":
        repeated += 1  # the previous step's reply, sent back: shown there as its response
    return {"repeated": repeated, "messages": messages[repeated:], "rewritten": rewritten}


def _role(message: Any) -> Any:
    return message.get("role") if isinstance(message, Mapping) else None


def token_view(ids: Sequence[int], start: int, decoder: TokenDecoder | None,
               tokenizer: str | None) -> dict[str, Any]:
    """Ids from ``start`` on (at most ``TOKENS_SHOWN``), with each id's text when ``decoder`` is the
    tokenizer that made them (``pieces`` is None otherwise: the page shows the captured text beside)."""
    shown = [int(i) for i in ids[start:start + TOKENS_SHOWN]]
    decoded = decoder is not None and decoder.knows(tokenizer)
    return {"start": start, "total": len(ids), "ids": shown,
            "pieces": decoder.pieces(shown) if decoded and decoder is not None else None}


def feedback_by_target(records: Iterable[Mapping[str, Any]], steps: Sequence[Mapping[str, Any]]
                       ) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """Each step's feedback (aimed at the step or at its response) by step id, and the feedback aimed
    at the whole trajectory."""
    by_response = {step["response_id"]: step["step_id"] for step in steps}
    per_step: dict[str, list[dict[str, Any]]] = {step["step_id"]: [] for step in steps}
    whole: list[dict[str, Any]] = []
    for record in records:
        kind, target = record["target_kind"], record["target_id"]
        step_id = target if kind == "step" else by_response.get(target) if kind == "response" else None
        if step_id in per_step:
            per_step[step_id].append(dict(record))
        elif kind == "trajectory":
            whole.append(dict(record))
    return per_step, whole


def turns(rows: Sequence[Mapping[str, Any]], feedback: Mapping[str, list[dict[str, Any]]],
          decoder: TokenDecoder | None) -> list[dict[str, Any]]:
    """The steps in order, each with what it added to the conversation, its reply, tokens and feedback.
    ``rows`` carry the parsed ``prompt_messages`` and ``tool_calls``, and both token id arrays."""
    out: list[dict[str, Any]] = []
    previous: Mapping[str, Any] | None = None
    for row in rows:
        step = {k: v for k, v in row.items() if k not in _SHOWN_APART}
        prompt_ids, response_ids = row["prompt_token_ids"], row["response_token_ids"]
        start = 0
        if previous is not None and len(prompt_ids):
            before = [*previous["prompt_token_ids"], *previous["response_token_ids"]]
            start = common_prefix(before, prompt_ids)
        out.append({
            **step,
            "prompt": new_messages(previous["prompt_messages"] if previous else None, row["prompt_messages"]),
            "prompt_ids": token_view(prompt_ids, start, decoder, row["tokenizer"]),
            "response_ids": token_view(response_ids, 0, decoder, row["tokenizer"]),
            "feedback_records": feedback.get(row["step_id"], []),
        })
        previous = row
    return out


def trajectory_totals(trajectory_id: str, rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The header of the view, from its steps: source, group, versions, rewards, readiness."""
    rewards = [row["reward"] for row in rows if row["reward"] is not None]
    versions = sorted({row["policy_version"] for row in rows if row["policy_version"] is not None})
    first = rows[0] if rows else {}
    return {
        "trajectory_id": trajectory_id,
        "steps": len(rows),
        "source_kind": first.get("source_kind"),
        "source_name": first.get("source_name"),
        "agent": first.get("agent"),
        "prompt_group_id": next((row["prompt_group_id"] for row in rows if row["prompt_group_id"]), None),
        "policy_versions": versions,
        "reward_sum": sum(rewards) if rewards else None,
        "trajectory_reward": next((row["trajectory_reward"] for row in reversed(rows)
                                   if row["trajectory_reward"] is not None), None),
        "terminal": any(row["terminal"] for row in rows),
        "all_ready": bool(rows) and all(row["ready"] for row in rows),
        "failed": sum(1 for row in rows if row["status"] == "failed"),
        "started_ms": min((row["created_ms"] for row in rows), default=None),
        "last_ms": max((row["created_ms"] for row in rows), default=None),
    }
