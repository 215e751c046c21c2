"""Request and response bodies of the gateway: the HTTP contract, published in ``/openapi.json``.

Numbers and booleans are strict (``"3"``, ``2.5`` or ``true`` is not a token id; ``3.0`` is 3, as
in JSON Schema, because float arrays serialize whole numbers that way) and every int is bounded to
what its Avro field holds, so whatever validates here always encodes. Unknown fields are refused:
a misspelled ``reward_finl`` would otherwise be dropped silently.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StringConstraints,
)
from pydantic.config import JsonDict

from clawr1.core.epoch import MAX_EPOCH_MS
from clawr1.core.ids import ID_MAX, id_problem

AVRO_INT_LIMIT = 2**31
AVRO_LONG_LIMIT = 2**63

# The limits as values too: the steps fast path (gateway/fastpath.py) checks the same ones without a model.
# Ids (ID_MAX, id_problem) follow clawr1.core.ids, the rule of every way in.
NAME_MAX = 128
CHANNEL_PATTERN = r"[A-Za-z0-9_.-]{1,64}"


def _id(value: str) -> str:
    problem = id_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


Id = Annotated[str, StringConstraints(min_length=1, max_length=ID_MAX), AfterValidator(_id)]
Name = Annotated[str, StringConstraints(min_length=1, max_length=NAME_MAX)]
Channel = Annotated[str, StringConstraints(pattern=f"^{CHANNEL_PATTERN}$")]


def _whole(value: Any) -> Any:
    return int(value) if type(value) is float and value.is_integer() else value


def _whole_items(values: Any) -> Any:
    """Converts a token list only when it holds floats: the common all-int list costs one C-speed scan,
    not a Python call per id."""
    if type(values) is list and float in map(type, values):
        return [_whole(v) for v in values]
    return values


# Bounds first, then the float conversion around them, so the schema keeps minimum/exclusiveMaximum.
Index = Annotated[StrictInt, Field(ge=0, lt=AVRO_INT_LIMIT), BeforeValidator(_whole)]
Count = Annotated[StrictInt, Field(ge=1, lt=AVRO_INT_LIMIT), BeforeValidator(_whole)]
Long = Annotated[StrictInt, Field(ge=0, lt=AVRO_LONG_LIMIT), BeforeValidator(_whole)]
# The pool's rule for times (clawr1.core.epoch): one the sink would dead-letter is refused here.
EpochMs = Annotated[StrictInt, Field(ge=0, lt=MAX_EPOCH_MS), BeforeValidator(_whole)]
TokenId = Annotated[StrictInt, Field(ge=0, lt=AVRO_INT_LIMIT)]
TokenIds = Annotated[list[TokenId], BeforeValidator(_whole_items)]
Real = Annotated[StrictFloat, Field(allow_inf_nan=False)]
JsonObject = dict[str, Any]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _given(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema for "``name`` is present and matches ``schema``" (null counts as absent)."""
    return {"required": [name], "properties": {name: schema}}


# The cross-field rules of clawr1.gateway.validation, as far as JSON Schema can say them, so the published
# spec tells clients (and generated tests) what a complete submission is.
_STEP_RULES: JsonDict = {"allOf": [
    {"anyOf": [_given("prompt_token_ids", {"minItems": 1}),
               _given("prompt_messages", {"type": "array", "minItems": 1})]},
    {"anyOf": [_given("response_token_ids", {"minItems": 1}), _given("response_text", {"type": "string"})]},
]}
_FEEDBACK_RULES: JsonDict = {"allOf": [
    {"oneOf": [_given(target, {"type": "string"}) for target in ("step_id", "response_id", "trajectory_id")]},
    {"anyOf": [_given("reward", {"type": "number"}), _given("components", {"minProperties": 1}),
               *(_given(name, {"type": "string"}) for name in ("label", "comment", "correction")),
               _given("terminal", {"const": True})]},
    {"if": _given("terminal", {"const": True}), "then": _given("trajectory_id", {"type": "string"})},
]}
_TURN_RULES: JsonDict = {"anyOf": [_given("response_text", {"type": "string"}),
                         _given("tool_calls", {"type": "array", "minItems": 1})]}
# Merged into the published EventIn by clawr1.gateway.app: pydantic cannot resolve a reference to another
# top-level component from inside a model's own schema.
EVENT_TURN_RULE = {"if": _given("kind", {"const": "turn"}),
                   "then": _given("payload", {"$ref": "#/components/schemas/TurnPayload"})}


class StepIn(_Strict):
    """One step of a white-box agent: the state (prompt), the action (response) and its reward.

    A step needs its prompt (`prompt_token_ids` or `prompt_messages`) and its response
    (`response_token_ids` or `response_text`); `response_logprobs` has one value per response token.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra=_STEP_RULES)

    step_id: Id | None = Field(None, description="omit to get a deterministic id derived from the step's "
                               "source, trajectory, index, prompt and response")
    trajectory_id: Id
    step_index: Index
    prompt_group_id: Id | None = Field(None, description="GRPO group: samples of the same prompt")
    prompt_group_size: Count | None = None
    prompt_token_ids: TokenIds = []
    response_token_ids: TokenIds = []
    response_logprobs: list[Real] | None = None
    prompt_messages: list[JsonObject] | None = Field(None, description="chat messages as sent to the model")
    response_text: str | None = None
    reward: Real | None = None
    reward_final: StrictBool = Field(True, description="false: the reward is provisional, a later "
                                     "feedback or re-submission replaces it")
    terminal: StrictBool = False
    policy_version: Long | None = None
    model: Name | None = None
    agent: Name | None = None
    channel: Channel = Field("train", description="train | val: kept apart in the pool; trainers fetch one")
    metadata: JsonObject = {}


class FeedbackIn(_Strict):
    """A reward or human feedback for exactly one of `step_id`, `response_id`, `trajectory_id`, saying
    something: a reward, components, a label, a comment, a correction or, for a trajectory, `terminal`."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_FEEDBACK_RULES)

    feedback_id: Id | None = Field(None, description="omit to get a deterministic id from the content")
    step_id: Id | None = None
    response_id: Id | None = None
    trajectory_id: Id | None = None
    reward: Real | None = None
    components: dict[Name, Real] = Field({}, description="named parts of the reward")
    final: StrictBool = True
    source: Annotated[str, StringConstraints(max_length=128)] = Field(
        "", description="what produced it: reward_model, human, rule, ...")
    label: Name | None = None
    comment: str | None = None
    correction: str | None = Field(None, description="a human-corrected response")
    terminal: StrictBool = Field(False, description="trajectory feedback only: the trajectory is complete; "
                                 "its highest-index step becomes terminal (as X-Claw-Terminal would make it)")


class EventIn(_Strict):
    """A live event from a black-box service. `kind: turn` events carry a `TurnPayload`."""


    event_id: Id | None = Field(None, description="omit to get a deterministic id from the content")
    kind: Name = Field(description="turn | tool_result | user_action | any other name")
    trajectory_id: Id
    step_id: Id | None = None
    step_index: Index | None = None
    timestamp_ms: EpochMs | None = Field(None, description="epoch milliseconds; default: time of receipt")
    payload: JsonObject = Field({}, description="free-form, except for `turn` events: see TurnPayload")


class Usage(_Strict):
    prompt_tokens: Long | None = None
    completion_tokens: Long | None = None


class TurnPayload(_Strict):
    """The payload of a `turn` event: one model call of a black-box service, normalized into a step.
    It needs the reply: `response_text` or `tool_calls`. Services that hold the engine's token ids
    may add them (`logprobs`: one per response token)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_TURN_RULES)

    prompt_messages: Annotated[list[JsonObject], Field(min_length=1)]
    response_text: str | None = None
    tool_calls: list[JsonObject] | None = None
    response_id: Id | None = Field(None, description="the serving engine's response id")
    prompt_group_id: Id | None = None
    prompt_group_size: Count | None = None
    prompt_token_ids: TokenIds | None = None
    response_token_ids: TokenIds | None = None
    logprobs: list[Real] | None = None
    model: Name | None = None
    agent: Name | None = None
    reward: Real | None = None
    reward_final: StrictBool = True
    terminal: StrictBool = False
    policy_version: Long | None = None
    sampling_params: JsonObject | None = None
    latency_ms: Long | None = None
    usage: Usage | None = None
    metadata: JsonObject = {}


class Accepted(BaseModel):
    accepted: int = Field(description="how many items the broker acknowledged")
    ids: list[str] = Field(description="the id of each item, in request order")


class Health(BaseModel):
    status: str = Field(description="ok | unavailable")
    parts: dict[str, bool]
    problems: dict[str, str] = Field(
        default_factory=dict, description="why a part is not healthy, where known (a stuck worker's lag)")
