"""Validated submissions -> Avro records with deterministic ids and their Kafka keys.

Ids the client leaves out are derived from content, so a request retried without an
Idempotency-Key, or replayed after a restart, still names the same logical item and the streams /
pool deduplicate it by id. A step's id covers its identity (source, trajectory, position, prompt,
response), not its reward: re-submitting a step with a final reward updates that step. Its
``content_digest`` covers everything, so the streams can tell a pure duplicate from an update.

Step and event ids are *routable* (``clawr1.core.routing.routable_id``, homed at the trajectory id,
their Kafka key): feedback naming one reaches its step's partition without an index entry. Feedback
ids stay UUIDv5 (nothing is routed by them).
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import uuid
from array import array
from dataclasses import dataclass
from typing import Any

from clawr1.core.routing import routable_id
from clawr1.gateway.models import EventIn, FeedbackIn, StepIn, TurnPayload
from clawr1.gateway.redacting import (
    EVENT_IDS,
    FEEDBACK_IDS,
    FEEDBACK_TEXTS,
    STEP_IDS,
    STEP_TEXTS,
    redact_components,
    redact_fields,
    redact_payload,
    redact_step,
)

ID_NAMESPACE = uuid.UUID("6f1d2c1e-5b0a-4c55-9a36-2f0b7c1e8d42")


@dataclass(frozen=True)
class Outgoing:
    """One record to produce: its id (answered to the client), Kafka key and Avro record."""

    id: str
    key: str
    record: dict[str, Any]


_CANONICAL = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False)


def compact_json(value: Any) -> str:
    """Canonical JSON (sorted keys, no spaces); raises ValueError on non-finite numbers. (One encoder
    for every call: ``json.dumps`` with options builds a new one each time.)"""
    return _CANONICAL.encode(value)


def uuid5_of(data: bytes) -> str:
    """RFC 4122 name-based UUID (v5) of raw bytes (``uuid.uuid5`` takes only text on Python 3.11)."""
    return str(uuid.UUID(bytes=hashlib.sha1(ID_NAMESPACE.bytes + data).digest()[:16], version=5))


def deterministic_id(*parts: Any) -> str:
    return uuid5_of(compact_json(list(parts)).encode())


def packed_bytes(packed: array) -> bytes:
    """Little-endian items, length first: hashing a 2k-token step this way costs microseconds, where
    JSON-serializing it costs a millisecond."""
    if sys.byteorder == "big":
        packed = array(packed.typecode, packed)
        packed.byteswap()
    return struct.pack("<I", len(packed)) + packed.tobytes()


def identity_bytes(source_name: str, trajectory_id: str, step_index: int, prompt_messages: Any,
                   response_text: str | None, prompt_ids: bytes, response_ids: bytes) -> bytes:
    """Who, where in which trajectory, seeing what, doing what: not the reward or the metadata.
    Token ids come as ``packed_bytes``; the steps fast path builds the same bytes without a model."""
    head = compact_json(["step", source_name, trajectory_id, step_index, prompt_messages, response_text])
    return head.encode() + prompt_ids + response_ids


def digest_of(identity: bytes, rest: dict[str, Any], logprobs: array | None) -> str:
    """A step's content digest: its identity, every other field but its id, then its logprobs."""
    digest = hashlib.sha256(identity)
    digest.update(compact_json(rest).encode() + packed_bytes(array("d") if logprobs is None else logprobs))
    digest.update(b"" if logprobs is None else b"logprobs")
    return digest.hexdigest()


def step_identity(step: StepIn, source_name: str) -> bytes:
    return identity_bytes(source_name, step.trajectory_id, step.step_index, step.prompt_messages,
                          step.response_text, packed_bytes(array("i", step.prompt_token_ids)),
                          packed_bytes(array("i", step.response_token_ids)))


def content_digest(step: StepIn, source_name: str) -> str:
    rest = step.model_dump(exclude={"step_id", "prompt_token_ids", "response_token_ids", "response_logprobs"})
    logprobs = None if step.response_logprobs is None else array("d", step.response_logprobs)
    return digest_of(step_identity(step, source_name), rest, logprobs)


def redacted_step(step: StepIn) -> StepIn:
    """``step`` with its secrets replaced (``clawr1.gateway.redacting``); itself when clean."""
    changes = redact_step({name: getattr(step, name) for name in (*STEP_IDS, *STEP_TEXTS)},
                          token_ids=bool(step.prompt_token_ids or step.response_token_ids))
    return step.model_copy(update=changes) if changes else step


def step_record(step: StepIn, source_name: str, received_at_ms: int) -> Outgoing:
    """The step's record, its secrets replaced first: its ids and digest never hash a secret."""
    step = redacted_step(step)
    step_id = step.step_id or routable_id(step.trajectory_id, step_identity(step, source_name))
    record = {
        "step_id": step_id,
        "trajectory_id": step.trajectory_id,
        "step_index": step.step_index,
        "prompt_group_id": step.prompt_group_id,
        "prompt_group_size": step.prompt_group_size,
        "prompt_token_ids": step.prompt_token_ids,
        "response_token_ids": step.response_token_ids,
        "response_logprobs": step.response_logprobs,
        "prompt_messages": None if step.prompt_messages is None else compact_json(step.prompt_messages),
        "response_text": step.response_text,
        "reward": step.reward,
        "reward_final": step.reward_final,
        "terminal": step.terminal,
        "policy_version": step.policy_version,
        "model": step.model,
        "agent": step.agent,
        "source_name": source_name,
        "metadata_json": compact_json(step.metadata),
        "received_at_ms": received_at_ms,
        "content_digest": content_digest(step, source_name),
        "channel": step.channel,
    }
    return Outgoing(step_id, step.trajectory_id, record)


def feedback_target(feedback: FeedbackIn) -> tuple[str, str]:
    """(target_kind, target_id); validation guarantees exactly one target is set."""
    for kind, value in (("step", feedback.step_id), ("response", feedback.response_id),
                        ("trajectory", feedback.trajectory_id)):
        if value is not None:
            return kind, value
    raise ValueError("feedback without a target")


def curation_only(feedback: FeedbackIn) -> bool:
    """Says nothing but labels and a comment: what curation writes, on any step."""
    return feedback.reward is None and not feedback.components and feedback.correction is None \
        and not feedback.terminal


def feedback_record(feedback: FeedbackIn, source_name: str, received_at_ms: int,
                    privileged: bool = False) -> Outgoing:
    """``privileged``: the sender may give feedback on trajectories other sources created
    (``clawr1.gateway.auth.feedback_standing``); it never enters the id. Secrets are replaced first."""
    changes = redact_fields({name: getattr(feedback, name) for name in (*FEEDBACK_IDS, *FEEDBACK_TEXTS)},
                            FEEDBACK_IDS)
    components = redact_components(feedback.components)
    if components is not feedback.components:
        changes["components"] = components
    if changes:
        feedback = feedback.model_copy(update=changes)
    # terminal enters the id only when set, so feedback without it keeps the ids it always had.
    excluded = {"feedback_id"} if feedback.terminal else {"feedback_id", "terminal"}
    feedback_id = feedback.feedback_id or deterministic_id(
        "feedback", source_name, feedback.model_dump(exclude=excluded))
    target_kind, target_id = feedback_target(feedback)
    record = {
        "feedback_id": feedback_id,
        "target_kind": target_kind,
        "target_id": target_id,
        "reward": feedback.reward,
        "components": feedback.components,
        "final": feedback.final,
        "source": feedback.source,
        "source_name": source_name,
        "label": feedback.label,
        "comment": feedback.comment,
        "correction": feedback.correction,
        "received_at_ms": received_at_ms,
        "terminal": feedback.terminal,
        "privileged": privileged,
    }
    return Outgoing(feedback_id, target_id, record)


def event_payload(event: EventIn) -> dict[str, Any]:
    """A turn's payload as validated (``3.0`` -> ``3``, only the fields given), so the streams read
    exactly the documented TurnPayload; any other kind's payload as sent."""
    if event.kind != "turn":
        return event.payload
    return TurnPayload.model_validate(event.payload).model_dump(mode="json", exclude_unset=True)


def event_record(event: EventIn, source_name: str, received_at_ms: int) -> Outgoing:
    """The event's record, its secrets replaced first (its payload as validated, then redacted)."""
    validated = event_payload(event)
    payload = redact_payload(event.kind, validated)
    changes = redact_fields({name: getattr(event, name) for name in EVENT_IDS}, EVENT_IDS)
    if payload is not validated:
        changes["payload"] = payload
    if changes:
        event = event.model_copy(update=changes)
    event_id = event.event_id or routable_id(event.trajectory_id, compact_json(
        ["event", source_name, event.model_dump(exclude={"event_id"})]).encode())
    record = {
        "event_id": event_id,
        "kind": event.kind,
        "trajectory_id": event.trajectory_id,
        "step_id": event.step_id,
        "step_index": event.step_index,
        "timestamp_ms": received_at_ms if event.timestamp_ms is None else event.timestamp_ms,
        "payload_json": compact_json(payload),
        "source_name": source_name,
        "received_at_ms": received_at_ms,
        "source_kind": "blackbox_service",
    }
    return Outgoing(event_id, event.trajectory_id, record)
