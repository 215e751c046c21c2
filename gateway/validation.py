"""Turn a request body into validated items, or an ``ApiError`` that names each bad field and why.

Pydantic checks each field on its own; the rules that tie fields together (one logprob per response
token, exactly one feedback target, the payload of a turn) are small functions here, so every
rejection reads the same way: a field path, a reason, a type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from clawr1.core.json_depth import MAX_JSON_DEPTH, JsonTooDeep, check_depth, too_deep
from clawr1.gateway.errors import ApiError, FieldError, field_errors, field_path
from clawr1.gateway.models import EventIn, FeedbackIn, StepIn, TurnPayload
from clawr1.gateway.records import compact_json

M = TypeVar("M", bound=BaseModel)
Check = Callable[[Any], list[FieldError]]
MAX_REPORTED_ERRORS = 50


def load_json(raw: str | bytes, what: str = "the JSON") -> Any:
    """JSON as every way in parses it: nested at most ``MAX_JSON_DEPTH`` levels, measured on the text
    before the parser sees it (``JsonTooDeep``, a ``ValueError``; Python's own parser went ~900 deep, then
    raised ``RecursionError``), by pydantic-core's parser, no ``NaN``/``Infinity``. The compat port and
    the OTLP routes parse with this too."""
    check_depth(raw, what)
    return from_json(raw, allow_inf_nan=False)


def parse_json(raw: bytes) -> Any:
    """The body's JSON, nested at most ``MAX_JSON_DEPTH`` levels (the limit of every way in)."""
    if not raw.strip():
        raise ApiError(400, "malformed_json", "the request body is empty; send a JSON object or array")
    try:
        return load_json(raw, "the request body")
    except JsonTooDeep as exc:
        raise ApiError(400, "malformed_json", str(exc)) from exc
    except ValueError as exc:
        raise ApiError(400, "malformed_json", f"the request body is not valid JSON: {exc}") from exc


def parse_items(raw: bytes, model: type[M], check: Check, max_batch: int) -> list[M]:
    """One object or a non-empty list of at most ``max_batch`` objects of ``model``."""
    return validate_items(parse_json(raw), model, check, max_batch)


def validate_items(body: Any, model: type[M], check: Check, max_batch: int) -> list[M]:
    """``parse_items`` of a body already parsed by ``parse_json``."""
    batch = isinstance(body, list)
    items = body if batch else [body]
    if batch and not items:
        raise ApiError(422, "invalid_request", "the batch is empty",
                       [FieldError(field="", reason="send at least one item", type="too_short")])
    if len(items) > max_batch:
        raise ApiError(413, "batch_too_large",
                       f"a batch of {len(items)} items exceeds the limit of {max_batch} (max_batch_steps)")
    parsed: list[M] = []
    problems: list[FieldError] = []
    for index, item in enumerate(items):
        prefix: list[str | int] = [index] if batch else []
        try:
            value = model.model_validate(item)
        except ValidationError as exc:
            details = [{**e, "loc": (*prefix, *e["loc"])} for e in exc.errors(include_url=False)]
            problems.extend(field_errors(details))
            continue
        problems.extend(_prefixed(check(value), prefix))
        parsed.append(value)
    if problems:
        shown = problems[:MAX_REPORTED_ERRORS]
        more = f" (first {len(shown)} shown)" if len(problems) > len(shown) else ""
        raise ApiError(422, "invalid_request", f"{len(problems)} invalid field(s){more}", shown)
    return parsed


def _prefixed(errors: list[FieldError], prefix: Sequence[str | int]) -> list[FieldError]:
    if not prefix:
        return errors
    head = field_path(prefix)
    return [e.model_copy(update={"field": head + ("." + e.field if e.field else "")}) for e in errors]


def _json_problems(fields: dict[str, Any]) -> list[FieldError]:
    """Free-form JSON must serialize to standard JSON (numbers like 1e999 overflow to infinity)."""
    problems = []
    for name, value in fields.items():
        try:
            compact_json(value)
        except ValueError:
            problems.append(FieldError(field=name, reason="contains a number that is not finite",
                                       type="finite_number"))
    return problems


def _deep_arguments(calls: Any, field: str) -> list[FieldError]:
    """Tool-call arguments are JSON in a string, which the streams parse: held to the nesting limit of
    every body (past it they raised RecursionError there, and the step was dead-lettered)."""
    if not isinstance(calls, list):
        return []
    return [FieldError(field=f"{field}[{index}].function.arguments", type="too_deep",
                       reason=f"nests deeper than {MAX_JSON_DEPTH} levels")
            for index, call in enumerate(calls)
            if isinstance(call, dict) and isinstance(function := call.get("function"), dict)
            and isinstance(arguments := function.get("arguments"), str) and too_deep(arguments)]


def message_problems(messages: Sequence[Any] | None, field: str) -> list[FieldError]:
    """What the streams could not read in chat ``messages``: tool-call arguments nested too deep."""
    return [problem for index, message in enumerate(messages or []) if isinstance(message, dict)
            for problem in _deep_arguments(message.get("tool_calls"), f"{field}[{index}].tool_calls")]


def check_step(step: StepIn) -> list[FieldError]:
    problems = []
    if step.response_logprobs is not None and len(step.response_logprobs) != len(step.response_token_ids):
        problems.append(FieldError(
            field="response_logprobs",
            reason=f"has {len(step.response_logprobs)} values but response_token_ids has "
                   f"{len(step.response_token_ids)}; give one logprob per response token",
            type="length_mismatch"))
    if not step.prompt_token_ids and not step.prompt_messages:
        problems.append(FieldError(
            field="prompt_token_ids", type="missing",
            reason="a step needs its prompt: give prompt_token_ids or prompt_messages"))
    if not step.response_token_ids and step.response_text is None:
        problems.append(FieldError(
            field="response_token_ids", type="missing",
            reason="a step needs its response: give response_token_ids or response_text"))
    return problems + _json_problems({"metadata": step.metadata, "prompt_messages": step.prompt_messages}) \
        + message_problems(step.prompt_messages, "prompt_messages")


FEEDBACK_TARGETS = ("step_id", "response_id", "trajectory_id")


def check_feedback(feedback: FeedbackIn) -> list[FieldError]:
    problems = []
    targets = [name for name in FEEDBACK_TARGETS if getattr(feedback, name) is not None]
    if len(targets) != 1:
        given = ", ".join(targets) or "none"
        problems.append(FieldError(field="step_id", type="target",
                                   reason=f"give exactly one target: step_id, response_id or trajectory_id "
                                          f"(given: {given})"))
    says_nothing = feedback.reward is None and not feedback.components and not feedback.terminal and all(
        value is None for value in (feedback.label, feedback.comment, feedback.correction))
    if says_nothing:
        problems.append(FieldError(field="reward", type="missing",
                                   reason="the feedback is empty: give reward, components, label, comment, "
                                          "correction or terminal"))
    if feedback.terminal and feedback.trajectory_id is None:
        problems.append(FieldError(field="terminal", type="target",
                                   reason="terminal marks a trajectory complete: give trajectory_id"))
    return problems


def check_event(event: EventIn) -> list[FieldError]:
    problems = _json_problems({"payload": event.payload})
    if event.kind != "turn" or problems:
        return problems
    try:
        turn = TurnPayload.model_validate(event.payload)
    except ValidationError as exc:
        details = [{**e, "loc": ("payload", *e["loc"])} for e in exc.errors(include_url=False)]
        return field_errors(details)
    problems = message_problems(turn.prompt_messages, "payload.prompt_messages") + \
        _deep_arguments(turn.tool_calls, "payload.tool_calls")
    if turn.response_text is None and not turn.tool_calls:
        problems.append(FieldError(field="payload.response_text", type="missing",
                                   reason="a turn needs the reply: give response_text or tool_calls"))
    if turn.logprobs is not None and len(turn.logprobs) != len(turn.response_token_ids or []):
        problems.append(FieldError(
            field="payload.logprobs", type="length_mismatch",
            reason=f"has {len(turn.logprobs)} values but payload.response_token_ids has "
                   f"{len(turn.response_token_ids or [])}; give one logprob per response token"))
    return problems
