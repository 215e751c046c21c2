"""Pure mappings between the seed's shapes and ours: steps, forwarded-call headers, engine calls.

No I/O here, so every rule (field renames, where multi-modal data and routed experts go, which
engine fields /generate reads) is tested without a stack.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from clawr1.compat.models import GenerateRequest, GenerateResponse, StepPayload
from clawr1.gateway.errors import FieldError
from clawr1.gateway.models import FeedbackIn, StepIn
from clawr1.gateway.validation import check_step

# Our StepIn field -> the seed's StepPayload field, to name a refused field as the client sent it.
SEED_FIELD = {
    "trajectory_id": "trajectory_uid",
    "prompt_group_id": "prompt_uid",
    "prompt_token_ids": "prompt_ids",
    "response_token_ids": "response_ids",
    "response_logprobs": "rollout_log_probs",
    "terminal": "is_last",
}
# StepPayload fields with no column of their own: kept under these names in the step's metadata.
METADATA_FIELDS = ("multi_modal_data", "routed_experts")
COMPLETE_SOURCE = "complete_trajectory"


@dataclass(frozen=True)
class Problem:
    """One refused field, located as FastAPI locates it (``("body", "steps", 2, "prompt_ids")``)."""

    loc: tuple[str | int, ...]
    msg: str
    type: str

    def detail(self) -> dict[str, Any]:
        return {"loc": list(self.loc), "msg": self.msg, "type": self.type}


class Refused(ValueError):
    """The request is well-formed JSON of the right shape but cannot be stored; ``problems`` say why."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, p.loc))}: {p.msg}" for p in problems))
        self.problems = list(problems)


def _seed_loc(prefix: tuple[str | int, ...], error: FieldError) -> tuple[str | int, ...]:
    head, _, rest = error.field.partition(".")
    return (*prefix, SEED_FIELD.get(head, head), *([rest] if rest else []))


def _metadata(payload: StepPayload, loc: tuple[str | int, ...]) -> dict[str, Any]:
    metadata = dict(payload.metadata or {})
    for name in METADATA_FIELDS:
        value = getattr(payload, name)
        if value is None:
            continue
        if name in metadata:
            raise Refused([Problem((*loc, "metadata", name), f"metadata already has a {name!r} key; "
                                   f"it is where the step's {name} is kept", "conflict")])
        metadata[name] = value
    return metadata


def step_in(payload: StepPayload, channel: str, index: int = 0) -> StepIn:
    """The seed's step as our white-box step (``Refused`` names each field it cannot take)."""
    loc: tuple[str | int, ...] = ("body", "steps", index)
    if not payload.trajectory_uid:
        raise Refused([Problem((*loc, "trajectory_uid"), "a step needs its trajectory_uid", "missing")])
    fields = {
        "trajectory_id": payload.trajectory_uid,
        "step_index": payload.step_index,
        "prompt_group_id": payload.prompt_uid or None,
        "prompt_token_ids": payload.prompt_ids,
        "response_token_ids": payload.response_ids,
        "response_logprobs": payload.rollout_log_probs,
        "reward": payload.reward,
        "terminal": payload.is_last,
        "policy_version": payload.policy_version,
        "channel": channel,
        "metadata": _metadata(payload, loc),
    }
    try:
        step = StepIn.model_validate(fields)
    except ValidationError as exc:  # bounds StepPayload already holds; kept as a guard, never a 500
        raise Refused([Problem((*loc, *(SEED_FIELD.get(str(p), p) for p in e["loc"])), e["msg"], e["type"])
                       for e in exc.errors(include_url=False)]) from exc
    problems = [Problem(_seed_loc(loc, e), e.reason, e.type) for e in check_step(step)]
    if problems:
        raise Refused(problems)
    return step


def steps_in(payloads: Sequence[StepPayload], channel: str) -> list[StepIn]:
    """Every step mapped, or ``Refused`` with the problems of all of them."""
    steps: list[StepIn] = []
    problems: list[Problem] = []
    for index, payload in enumerate(payloads):
        try:
            steps.append(step_in(payload, channel, index))
        except Refused as refused:
            problems.extend(refused.problems)
    if problems:
        raise Refused(problems)
    return steps


def completion_feedback(trajectory_id: str, reward: float | None) -> FeedbackIn:
    """``complete_trajectory`` as trajectory-targeted feedback: the trajectory is complete (its last
    step becomes terminal) and its reward, when given, is the trajectory's final reward."""
    return FeedbackIn(trajectory_id=trajectory_id, reward=reward, final=True, terminal=True,
                      source=COMPLETE_SOURCE)


# -- calls forwarded through the capture proxy -----------------------------------------------------

# Hop-by-hop headers (RFC 9110 7.6.1) and those the relay sets itself.
_NOT_FORWARDED = frozenset({
    "host", "content-length", "connection", "keep-alive", "proxy-authorization", "proxy-authenticate",
    "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade",
})
# X-Claw hints the compat port decides from the path and the registration; the agent's own lose.
_OWN_HINTS = frozenset({"x-claw-trajectory-id", "x-claw-prompt-group-id", "x-claw-policy-version",
                        "x-claw-channel", "x-claw-metadata", "x-claw-source", "x-claw-key"})


@dataclass(frozen=True)
class Registration:
    """What ``register_trajectory`` said about a trajectory, applied to each of its calls."""

    channel: str = "train"
    policy_version: int | None = None
    metadata: Mapping[str, Any] | None = None


def policy_version_of(metadata: Mapping[str, Any] | None) -> int | None:
    """``metadata.policy_version`` as the seed reads it (an int or a decimal string); ``ValueError``
    otherwise."""
    value = (metadata or {}).get("policy_version")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"metadata.policy_version must be an integer, got {value!r}")
    number = int(value)
    if not 0 <= number < 2**63:
        raise ValueError(f"metadata.policy_version must be an integer >= 0, got {number}")
    return number


def forward_headers(headers: Sequence[tuple[str, str]], trajectory_id: str, prompt_group_id: str,
                    registration: Registration, *, drop_authorization: bool) -> list[tuple[str, str]]:
    """The agent's headers for the proxy: hop-by-hop ones dropped, the trajectory's hints added.
    ``drop_authorization``: the agent's Authorization is its Claw-R1 key, not the engine's."""
    out = [(name, value) for name, value in headers
           if name.lower() not in _NOT_FORWARDED | _OWN_HINTS
           and not (drop_authorization and name.lower() == "authorization")]
    out += [("X-Claw-Trajectory-Id", trajectory_id), ("X-Claw-Prompt-Group-Id", prompt_group_id),
            ("X-Claw-Channel", registration.channel)]
    if registration.policy_version is not None:
        out.append(("X-Claw-Policy-Version", str(registration.policy_version)))
    if registration.metadata:
        out.append(("X-Claw-Metadata", json.dumps(registration.metadata, separators=(",", ":"),
                                                  sort_keys=True, ensure_ascii=True)))
    return out


def response_headers(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The engine's answer headers for the agent as their bytes, without hop-by-hop ones (the server
    sets framing)."""
    return [(name.lower(), value) for name, value in headers
            if name.decode("latin-1").lower() not in _NOT_FORWARDED]


# -- /generate ------------------------------------------------------------------------------------

# sampling_params the seed reads itself; the rest go to the engine as they are.
_ENGINE_OWNED = ("prompt", "stream", "n", "echo", "return_token_ids", "logprobs", "model")


class EngineReplyError(ValueError):
    """The engine answered 200 with something /generate cannot turn into exact token ids."""


def generate_payload(request: GenerateRequest, max_tokens: int | None) -> dict[str, Any]:
    """The engine's ``/v1/completions`` body: the token-id prompt, one sample, engine token ids.
    ``max_tokens`` applies when the sampling params give none (the seed's ``response_length``)."""
    params = request.sampling_params
    payload = {k: v for k, v in params.items() if k not in _ENGINE_OWNED}
    payload.update(prompt=request.prompt_ids, n=1, return_token_ids=True, skip_special_tokens=False)
    if max_tokens is not None:
        payload.setdefault("max_tokens", max_tokens)
    payload.setdefault("temperature", 1.0)
    payload.setdefault("top_p", 1.0)
    if params.get("logprobs"):
        payload["logprobs"] = 1
    if params.get("model"):
        payload["model"] = params["model"]
    return payload


def generate_response(reply: Any, want_logprobs: bool) -> GenerateResponse:
    """The engine's completion as the seed's answer, with the engine's own token ids (never text
    re-encoded)."""
    choices = reply.get("choices") if isinstance(reply, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise EngineReplyError("the engine's completion has no choices")
    choice = choices[0]
    token_ids = choice.get("token_ids")
    if not isinstance(token_ids, list) or not all(isinstance(t, int) for t in token_ids):
        raise EngineReplyError("the engine returned no token ids: /generate needs an engine that honours "
                               "vLLM's return_token_ids (ids are never re-encoded from text)")
    log_probs = None
    if want_logprobs:
        logprobs = choice.get("logprobs")
        log_probs = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
        if not isinstance(log_probs, list) or len(log_probs) != len(token_ids):
            raise EngineReplyError(f"the engine returned {len(token_ids)} token ids but "
                                   f"{'no' if not isinstance(log_probs, list) else len(log_probs)} logprobs")
    finish = choice.get("finish_reason")
    return GenerateResponse(token_ids=token_ids, log_probs=log_probs,
                            stop_reason=finish if isinstance(finish, str) else None)
