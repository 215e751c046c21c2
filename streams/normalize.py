"""Raw events to *step facts*: the source's part of a normalized step (step.avsc field names).

A step fact holds what the source said about one step: identity, prompt, reply, tokens and their
provenance, timings. Rewards and feedback are joined later (``clawr1.streams.join``); a reward that came
with the step (white-box, service turn) travels beside it as an inline feedback fact. Normalizing
is deterministic: the same event always gives the same fact, which is what makes replays harmless.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import orjson

from clawr1.schemas.batch import pack_doubles, pack_ints, unpack_doubles, unpack_int_array
from clawr1.streams.linking import LINKED, ROOT, Assignment, reply_digest, step_ids_of
from clawr1.streams.rewards import inline_fact
from clawr1.streams.tokenization import Retokenizer
from clawr1.streams.turns import Reply, TokenIds, Turn, turn_from_whitebox


@dataclass(frozen=True)
class StepFact:
    """One source's account of a step; ``step`` has the step.avsc identity/state/action fields."""

    step: dict[str, Any]
    feedback: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "feedback": self.feedback}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StepFact:
        """``to_json``'s dict, or ``wire_fact``'s: packed arrays are read back as an envelope gives them."""
        step = data["step"]
        if any(isinstance(step.get(name), str) for name in _WIRE_ARRAYS):
            step = dict(step)
            for name, code in _WIRE_ARRAYS.items():
                if isinstance(step.get(name), str):
                    packed = bytes.fromhex(step[name])
                    step[name] = unpack_int_array(packed) if code == "i" else unpack_doubles(packed)
        return cls(step, data["feedback"])


# A fact's arrays and their packing (int32 ids, float64 logprobs) as a work message carries them.
_WIRE_ARRAYS = {"prompt_token_ids": "i", "response_token_ids": "i", "response_logprobs": "d"}


def wire_fact(fact: dict[str, Any]) -> dict[str, Any]:
    """A fact (``StepFact.to_json``) as a work message carries it to another partition: its token ids
    and logprobs as hex of packed int32 and float64, as ``ScopeStep.to_message`` does and for the same
    reason (a keyed GRPO rollout crosses to its group's owner and back: as JSON lists, parsing its ids
    was the largest cost of those hops). Packed arrays stay as they are."""
    step = fact["step"]
    packed = {name: (pack_ints(value) if code == "i" else pack_doubles(value)).hex()
              for name, code in _WIRE_ARRAYS.items()
              if (value := step.get(name)) is not None and not isinstance(value, str)}
    return {**fact, "step": {**step, **packed}} if packed else fact


def _dumps(value: Any) -> str:
    """Compact UTF-8 JSON, by orjson (the standard library's encoder was 7% of the worker's time per
    step). The same text as the standard library's but for some floats, spelled otherwise (``1e-7``
    for ``1e-07``: the same number); the standard library still writes what orjson refuses (integers
    past 64 bits, lone surrogates)."""
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except (TypeError, orjson.JSONEncodeError):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _sha(value: Any) -> str:
    """Digest of ids and text; orjson writes these exactly as ``_dumps`` does (compact, UTF-8), faster."""
    return hashlib.sha256(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)).hexdigest()


def prompt_id_of(turn: Turn) -> str:
    """Content hash of the prompt: its conversation digest, or of its token ids without messages."""
    return turn.message_digests[-1] if turn.messages else _sha(turn.prompt_token_ids)


@dataclass(frozen=True)
class Tokens:
    prompt: TokenIds
    response: TokenIds
    logprobs: list[float] | None
    provenance: str  # engine | retokenized | none
    tokenizer: str | None
    checks: list[str]


NO_TOKENS = Tokens([], [], None, "none", None, [])


def choose_tokens(turn: Turn, reply: Reply, retokenizer: Retokenizer | None) -> Tokens:
    """Engine ids when complete, else re-tokenized ids when a tokenizer is configured, else none.

    Never a mix: a step whose engine ids are partial (prompt without response, or the reverse) is
    re-tokenized whole or left without ids. Logprobs are kept only when aligned with the ids.
    """
    if turn.failed:
        return NO_TOKENS
    if turn.engine_tokens and len(turn.prompt_token_ids) and len(reply.token_ids):
        aligned = reply.logprobs is not None and len(reply.logprobs) == len(reply.token_ids)
        checks = [] if aligned or reply.logprobs is None else ["logprobs not aligned with token ids; dropped"]
        return Tokens(turn.prompt_token_ids, reply.token_ids, reply.logprobs if aligned else None, "engine",
                      None, checks)
    partial = ["incomplete engine ids not used"] if len(turn.prompt_token_ids) or len(reply.token_ids) else []
    if retokenizer is None or not turn.messages:  # nothing to render without a prompt
        return Tokens([], [], None, "none", None, partial)
    prompt, response = retokenizer.encode_turn(turn.messages, turn.raw_prompt, reply.text, reply.tool_calls,
                                               turn.metadata.get("tools"))
    return Tokens(prompt, response, None, "retokenized", retokenizer.identity, partial)


def _response_id(turn: Turn, reply: Reply, single: bool, prompt_id: str) -> str:
    """The engine's id (per choice when n > 1), else a content hash of prompt and reply."""
    if turn.engine_response_id:
        return turn.engine_response_id if single else f"{turn.engine_response_id}:{reply.index}"
    if turn.messages:
        return reply_digest(turn, reply.messages)
    return _sha([prompt_id, reply.token_ids, reply.text])


# The proxy's note on a stream cut before its end (clawr1.proxy.record.TRUNCATED_NOTE).
TRUNCATED_NOTE = "stream truncated"
# The OTLP route's note on a span that came without its prompt or reply
# (clawr1.gateway.otlp.events.NO_CONTENT_NOTE).
NO_CONTENT_NOTE = "no message content"


def step_status(turn: Turn, reply: Reply) -> str:
    """failed (no usable reply) | refused (the model declined: finish reason ``refusal``) | truncated
    (the proxy saw the stream end without its finish) | no_content (a span without its messages:
    metadata and usage only) | ok."""
    if turn.failed:
        return "failed"
    if reply.finish_reason == "refusal":
        return "refused"
    notes = turn.metadata.get("capture_notes") or ()
    if any(note.startswith(TRUNCATED_NOTE) for note in notes):
        return "truncated"
    if any(note.startswith(NO_CONTENT_NOTE) for note in notes):
        return "no_content"
    return "ok"


# Under which feedback source a reward that came with its step is folded in.
INLINE_REWARD_SOURCE = {"blackbox_service": "service", "whitebox_agent": "whitebox", "otel": "otel"}


def steps_from_turn(turn: Turn, assignments: list[Assignment],
                    retokenizer: Retokenizer | None) -> list[StepFact]:
    """One step per reply (choice), placed by its assignment; a failed call is one failed step."""
    replies = turn.replies or [Reply(0, "", [], [])]
    single = len(replies) == 1
    prompt_id = prompt_id_of(turn)
    facts = []
    for step_id, reply, assignment in zip(step_ids_of(turn), replies, assignments, strict=True):
        tokens = choose_tokens(turn, reply, retokenizer)
        metadata = dict(turn.metadata)
        if not single:
            metadata["choice_index"] = reply.index
        if reply.finish_reason is not None:
            metadata["finish_reason"] = reply.finish_reason
        if tokens.checks:
            metadata["token_check"] = tokens.checks
        step = {
            "step_id": step_id,
            "trajectory_id": assignment.trajectory_id,
            "step_index": assignment.step_index,
            "parent_step_id": assignment.parent_step_id,
            "prompt_group_id": assignment.prompt_group_id,
            "prompt_group_size": assignment.prompt_group_size,
            "prompt_id": prompt_id,
            "response_id": _response_id(turn, reply, single, prompt_id),
            "source_kind": turn.source_kind,
            "source_name": turn.source_name,
            "agent": turn.agent,
            "model": turn.model,
            "policy_version": turn.policy_version,
            "engine": turn.engine,
            "sampling_params_json": _dumps(turn.sampling_params),
            "created_at_ms": turn.created_at_ms,
            "latency_ms": turn.latency_ms,
            "usage_prompt_tokens": turn.usage_prompt_tokens,
            "usage_completion_tokens": turn.usage_completion_tokens if single
            else len(reply.token_ids) or None,
            "prompt_messages": _dumps(turn.messages),
            "response_text": reply.text,
            "tool_calls_json": _dumps(reply.tool_calls),
            "prompt_token_ids": tokens.prompt,
            "response_token_ids": tokens.response,
            "response_logprobs": tokens.logprobs,
            "token_provenance": tokens.provenance,
            "tokenizer": tokens.tokenizer,
            "terminal": turn.terminal,
            "status": step_status(turn, reply),
            "error": turn.error,
            "metadata_json": _dumps(metadata),
            "updated_at_ms": turn.updated_at_ms,
            "channel": turn.channel,
            "link_status": assignment.link_status,
            "link_candidate_step_id": assignment.candidate_step_id,
            "prompt_group_inferred": assignment.prompt_group_inferred,
            "prompt_group_closes_at_ms": assignment.prompt_group_closes_at_ms,
        }
        inline = [] if turn.reward is None else [inline_fact(
            step_id, turn.reward, turn.reward_final, INLINE_REWARD_SOURCE[turn.source_kind], turn.source_name,
            turn.updated_at_ms)]
        facts.append(StepFact(step, inline))
    return facts


def step_from_whitebox(record: dict[str, Any], retokenizer: Retokenizer | None) -> StepFact:
    """A white-box step: its position is given, so it needs no linking.

    Its response id is its step id: no engine named the response, and the step id (minted by the
    gateway, routable to its trajectory: ``clawr1.core.routing``) already names exactly this action.
    """
    turn = turn_from_whitebox(record)
    status = ROOT if record["step_index"] == 0 else LINKED
    assignment = Assignment(record["trajectory_id"], record["step_index"], None, status, None,
                            turn.prompt_group_id, turn.prompt_group_size)
    fact = steps_from_turn(turn, [assignment], retokenizer)[0]
    fact.step["response_id"] = fact.step["step_id"]
    return fact
