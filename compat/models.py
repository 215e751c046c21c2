"""Request and response bodies of the seed gateway (``claw_r1/gateway/models.py``): same field names,
defaults and response shapes, so its clients parse our answers unchanged.

Numbers are as strict and bounded as on our own API (``clawr1.gateway.models``): whatever validates here
always encodes. Unknown fields are refused, as everywhere in Claw-R1: a misspelled field would
otherwise be dropped silently.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StringConstraints

from clawr1.gateway.models import Channel, Index, JsonObject, Long, Real, TokenIds

Uid = Annotated[str, StringConstraints(max_length=256)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class InitTrajectoryRequest(_Body):
    """Optional body of ``/init_trajectory`` (the seed takes none): the GRPO group of the trajectory."""

    prompt_uid: Annotated[str, StringConstraints(pattern=r"^[^/]{1,256}$")] | None = None


class InitTrajectoryResponse(BaseModel):
    trajectory_uid: str
    base_url: str


class RegisterTrajectoryRequest(_Body):
    channel: Channel = "train"
    metadata: JsonObject | None = Field(
        None, description="dataset fields; `policy_version` becomes the trajectory's policy version")


class CompleteTrajectoryRequest(_Body):
    reward: Real | None = None
    channel: Channel | None = Field(None, description="accepted for the seed's clients; a trajectory's "
                                    "channel is the one it was registered with (its steps carry it)")


class Status(BaseModel):
    status: str = "ok"


class StepPayload(_Body):
    """One white-box step exactly as the seed's ``StepPayload``."""

    prompt_ids: TokenIds
    response_ids: TokenIds
    multi_modal_data: JsonObject | None = None
    reward: Real | None = None
    rollout_log_probs: list[Real] | None = None
    routed_experts: Any = None
    trajectory_uid: Uid = ""
    prompt_uid: Uid = ""
    step_index: Index = 0
    policy_version: Long = 0
    is_last: StrictBool = False
    metadata: JsonObject | None = None


class SubmitStepsRequest(_Body):
    steps: list[StepPayload]


class SubmitStepsResponse(BaseModel):
    accepted: int


class GenerateRequest(_Body):
    prompt_ids: Annotated[TokenIds, Field(min_length=1)]
    sampling_params: JsonObject = {}
    image_data: list[Any] | None = None
    video_data: list[Any] | None = None


class GenerateResponse(BaseModel):
    token_ids: list[int]
    log_probs: list[float] | None = None
    stop_reason: str | None = None


class ComputeRewardRequest(_Body):
    prompt_ids: TokenIds
    response_ids: TokenIds
    multi_modal_data: JsonObject | None = None
    num_turns: Index = 2
    extra_fields: JsonObject = {}
    dataset_fields: JsonObject = {}


class ComputeRewardResponse(BaseModel):
    reward_score: float
    reward_extra_info: dict[str, Any] = {}
