"""The reward-function contract: ``module:function`` specs and the float-or-dict return shape."""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Iterator

import numpy as np
import pytest

from clawr1.rewards.loader import RewardFnError, RewardResult, compute_reward, load_reward_fn


@pytest.fixture
def user_module() -> Iterator[types.ModuleType]:
    module = types.ModuleType("clawr1_test_user_rewards")

    def length_reward(response_ids: list[int], **_: object) -> float:
        return float(len(response_ids))

    class Scorers:
        @staticmethod
        def nested(**_: object) -> dict[str, object]:
            return {"score": 1, "acc": True}

    module.length_reward = length_reward  # type: ignore[attr-defined]
    module.Scorers = Scorers  # type: ignore[attr-defined]
    module.NOT_CALLABLE = 3  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_load_resolves_module_function_and_dotted_attributes(user_module: types.ModuleType) -> None:
    fn = load_reward_fn("clawr1_test_user_rewards:length_reward")
    assert compute_reward(fn, response_ids=[1, 2, 3]) == RewardResult(score=3.0, extra={})
    nested = load_reward_fn(" clawr1_test_user_rewards:Scorers.nested ")
    assert compute_reward(nested) == RewardResult(score=1.0, extra={"acc": True})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_colon_here", "must look like 'module:function'"),
        (":fn", "must look like 'module:function'"),
        ("module:", "must look like 'module:function'"),
        ("clawr1_no_such_module_xyz:fn", "cannot import module 'clawr1_no_such_module_xyz'"),
        ("clawr1_test_user_rewards:missing", "has no attribute 'missing'"),
        ("clawr1_test_user_rewards:NOT_CALLABLE", "is a int, not a callable"),
    ],
)
def test_load_errors_name_what_is_wrong(user_module: types.ModuleType, spec: str, message: str) -> None:
    with pytest.raises(RewardFnError, match=message.replace("(", r"\(")):
        load_reward_fn(spec)


def test_returns_are_normalized() -> None:
    assert compute_reward(lambda **_: 0.5) == RewardResult(0.5, {})
    assert compute_reward(lambda **_: 2) == RewardResult(2.0, {})
    assert compute_reward(lambda **_: np.float32(0.25)).score == 0.25
    result = compute_reward(lambda **_: {"score": 1.0, "acc": 1, "reward_extra_info": {"pred": "4"}})
    assert result == RewardResult(1.0, {"acc": 1, "pred": "4"})


def test_fields_arrive_as_keyword_arguments() -> None:
    seen: dict[str, object] = {}

    def fn(**fields: object) -> float:
        seen.update(fields)
        return 0.0

    fields = {
        "prompt_ids": [1],
        "response_ids": [2],
        "num_turns": 1,
        "extra_fields": {},
        "dataset_fields": {"a": 1},
    }
    compute_reward(fn, **fields)
    assert seen == fields


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1.0", "must be a number, got str"),
        (None, "must be a number, got NoneType"),
        (True, "must be a number, got bool"),
        (math.nan, "must be finite"),
        ({"reward": 1.0}, "returned a dict without 'score'"),
        ({"score": "high"}, r"\['score'\] must be a number"),
    ],
)
def test_anything_else_is_a_clear_error(value: object, message: str) -> None:
    with pytest.raises(RewardFnError, match=message):
        compute_reward(lambda **_: value)


def test_an_exception_inside_the_function_is_wrapped_with_its_cause() -> None:
    def broken(**_: object) -> float:
        raise KeyError("ground_truth")

    with pytest.raises(RewardFnError, match="raised KeyError") as info:
        compute_reward(broken)
    assert isinstance(info.value.__cause__, KeyError)
