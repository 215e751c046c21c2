"""The API's ways in keep secrets out as the capture proxy does: white-box steps (both paths of
``POST /v1/steps``, the compat port's ``/submit_steps``), events, feedback and OTLP turns, with
``clawr1.core.redaction``'s one list of secret names and shapes (docs/security.md).

Ids and names (trajectory, step, group, response, feedback and event ids, agent, model, label, source,
kind) that hold a secret shape become the proxy's stable stand-in (``redact_id``): the same for the
same id, so a step's feedback still finds it. Free text and JSON (messages, reply, tool calls,
metadata, comments, payloads) get ``redact_json``: the JSON rule at any depth, the text rule on every
string. Token ids cannot be redacted without the tokenizer: a step or turn whose prompt or reply text
changed and that holds token ids gets the proxy's capture note ``REDACTED_WITH_TOKEN_IDS`` in its
metadata, so a trainer can drop it.

Records are built from what these return, so ids and content digests derived from content never
hash a secret. Clean input comes back as the same objects: nothing is copied or re-serialized.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from clawr1.core.redaction import REDACTED_WITH_TOKEN_IDS, redact_id, redact_json, redact_tokens

STEP_IDS = frozenset({"step_id", "trajectory_id", "prompt_group_id", "model", "agent"})
"""A white-box step's ids and names; its other text fields are ``STEP_TEXTS``."""
STEP_TEXTS = ("prompt_messages", "response_text", "metadata")
_TOKENIZED = frozenset({"prompt_messages", "response_text", "tool_calls"})
"""Fields the engine's token ids encode: redacting them leaves the secret in the ids."""
FEEDBACK_IDS = frozenset({"feedback_id", "step_id", "response_id", "trajectory_id", "source", "label"})
FEEDBACK_TEXTS = ("comment", "correction")
EVENT_IDS = frozenset({"event_id", "trajectory_id", "step_id", "kind"})
_TURN_IDS = frozenset({"response_id", "prompt_group_id", "model", "agent"})
_TURN_NUMBERS = frozenset({"prompt_token_ids", "response_token_ids", "logprobs"})


def redact_fields(fields: Mapping[str, Any], ids: Iterable[str] = ()) -> dict[str, Any]:
    """Only the fields of ``fields`` that redaction changes, with their new values: ``redact_id`` for
    those named in ``ids``, ``redact_json`` for the others; None stays None."""
    ids = frozenset(ids)
    changes = {}
    for name, value in fields.items():
        if value is None:
            continue
        cleaned = redact_id(value) if name in ids else redact_json(value)
        if cleaned is not value:
            changes[name] = cleaned
    return changes


def with_token_ids_note(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """``metadata`` with the proxy's ``REDACTED_WITH_TOKEN_IDS`` capture note added (after the
    submitter's own ``capture_notes``)."""
    notes = metadata.get("capture_notes")
    kept = notes if isinstance(notes, list) else [] if notes is None else [notes]
    return {**metadata, "capture_notes": [*kept, REDACTED_WITH_TOKEN_IDS]}


def redact_step(fields: Mapping[str, Any], token_ids: bool) -> dict[str, Any]:
    """The changes a white-box step's fields need (``STEP_IDS`` and ``STEP_TEXTS``: an empty dict for a
    clean step); ``token_ids``: the step holds engine token ids (then a redacted prompt or reply adds
    the capture note to its metadata). The fast path and the model path both build their records with
    it, so they keep producing the same bytes."""
    changes = redact_fields(fields, STEP_IDS)
    if token_ids and not _TOKENIZED.isdisjoint(changes):
        changes["metadata"] = with_token_ids_note(changes.get("metadata", fields["metadata"]))
    return changes


def redact_turn(payload: dict[str, Any]) -> dict[str, Any]:
    """A ``turn`` payload (TurnPayload's fields; an OTLP model call's too) with its secrets replaced: ids
    and names by stand-ins, every other field (token ids and logprobs aside) by ``redact_json``, and the
    capture note when its text changed and it holds token ids. ``payload`` itself when clean."""
    walked = {name: value for name, value in payload.items() if name not in _TURN_NUMBERS}
    changes = redact_fields(walked, _TURN_IDS)
    if not changes:
        return payload
    if (payload.get("prompt_token_ids") or payload.get("response_token_ids")) \
            and not _TOKENIZED.isdisjoint(changes):
        changes["metadata"] = with_token_ids_note(changes.get("metadata", payload.get("metadata") or {}))
    return {**payload, **changes}


def redact_payload(kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """An event's payload: a turn's by ``redact_turn``, any other kind's by the JSON rule as a whole."""
    if kind == "turn":
        return redact_turn(payload)
    cleaned: dict[str, Any] = redact_json(payload)
    return cleaned


def redact_components(components: dict[str, float]) -> dict[str, float]:
    """A reward's named components: their names get the token rule (their values are numbers)."""
    if not any(redact_tokens(name) is not name for name in components):
        return components
    return {redact_tokens(name): value for name, value in components.items()}
