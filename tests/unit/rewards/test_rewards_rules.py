"""Built-in rule rewards and the HTTP reward-model client (against a real local HTTP handler)."""

from __future__ import annotations

import json

import httpx
import pytest

from clawr1.rewards.http_model import HttpRewardModel, RewardModelError
from clawr1.rewards.loader import RewardFnError, RewardResult, compute_reward, load_reward_fn
from clawr1.rewards.rules import exact_match, extract_answer, format_check, math_answer, normalize_answer


def fields(response: str, truth: object = None, **dataset: object) -> dict[str, object]:
    data = dict(dataset) if truth is None else {"ground_truth": truth, **dataset}
    return {"prompt_ids": [1], "response_ids": [2], "num_turns": 1,
            "extra_fields": {"response_text": response}, "dataset_fields": data}


def test_builtins_load_by_spec_and_follow_the_contract() -> None:
    fn = load_reward_fn("clawr1.rewards.rules:math_answer")
    assert compute_reward(fn, **fields(r"so \boxed{4}", "4")) == RewardResult(1.0, {"pred": "4", "acc": True})


@pytest.mark.parametrize(("response", "truth", "score"), [
    ("Paris", "Paris", 1.0),
    ("  Paris\n", "Paris ", 1.0),
    ("paris", "Paris", 0.0),
])
def test_exact_match(response: str, truth: str, score: float) -> None:
    assert exact_match(**fields(response, truth))["score"] == score


@pytest.mark.parametrize(("response", "truth"), [
    (r"The answer is \boxed{\frac{1}{2}}.", "0.5"),
    (r"\boxed{\dfrac{3}{4}}", r"\frac34"),
    (r"\boxed{-\frac{2}{4}}", "-1/2"),
    ("so x = 1,234.", "1234"),
    ("It costs $18.", "Janet makes ... #### 18"),  # GSM8K's worked solution as the ground truth
    (r"\boxed{\text{(B)}}", "(b)"),
    (r"first \boxed{1}, finally \boxed{2}", "2"),
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt{2}}{2}"),
    ("about 50%", "50"),
])
def test_math_answer_accepts_equal_answers_however_spelled(response: str, truth: str) -> None:
    assert math_answer(**fields(response, truth))["score"] == 1.0


@pytest.mark.parametrize(("response", "truth"), [
    (r"\boxed{2}", "3"),
    ("no number at all", "3"),
    (r"\boxed{1/3}", "0.33"),
])
def test_math_answer_rejects_different_answers(response: str, truth: str) -> None:
    assert math_answer(**fields(response, truth))["score"] == 0.0


def test_math_answer_reads_verl_style_ground_truth() -> None:
    assert math_answer(**fields(r"\boxed{7}", None, reward_model={"ground_truth": "7"}))["score"] == 1.0


def test_answer_helpers() -> None:
    assert extract_answer(r"\boxed{a{b}c} then more") == "a{b}c"
    assert extract_answer("#### 42\n") == "42"
    assert extract_answer("nothing") is None
    assert normalize_answer("0.50") == "1/2" and normalize_answer("1,000,000") == "1000000"
    assert normalize_answer(r"\left( 1, 2 \right)") == "(1,2)"


def test_format_check_default_and_dataset_pattern() -> None:
    assert format_check(**fields("<think>hmm\nok</think> <answer>4</answer>"))["score"] == 1.0
    assert format_check(**fields("<answer>4</answer>"))["score"] == 0.0
    assert format_check(**fields("ANSWER: 4", format_pattern=r"ANSWER: \d+"))["score"] == 1.0


def test_missing_inputs_are_clear_errors_through_the_contract() -> None:
    with pytest.raises(RewardFnError, match="no ground truth"):
        compute_reward(math_answer, **fields(r"\boxed{1}"))
    with pytest.raises(RewardFnError, match=r"extra_fields\['response_text'\]"):
        compute_reward(exact_match, prompt_ids=[], response_ids=[], num_turns=1, extra_fields={},
                       dataset_fields={"ground_truth": "x"})


def model(handler: object, **kwargs: object) -> HttpRewardModel:
    return HttpRewardModel("http://rm.test/score", transport=httpx.MockTransport(handler),  # type: ignore[arg-type]
                           backoff_s=0.0, **kwargs)  # type: ignore[arg-type]


def test_http_model_posts_the_compute_reward_shape_and_reads_the_answer() -> None:
    seen: list[dict[str, object]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append({"auth": request.headers.get("authorization"), **json.loads(request.content)})
        return httpx.Response(200, json={"reward_score": 0.75, "reward_extra_info": {"judge": "ok"}})

    rm = model(handler, api_key="k")
    assert compute_reward(rm, **fields("hi", "x")) == RewardResult(0.75, {"judge": "ok"})
    assert seen == [{"auth": "Bearer k", "prompt_ids": [1], "response_ids": [2], "num_turns": 1,
                     "extra_fields": {"response_text": "hi"}, "dataset_fields": {"ground_truth": "x"}}]


def test_http_model_retries_overload_then_fails_clearly() -> None:
    answers = iter([httpx.Response(503), httpx.Response(200, json={"score": 1.0})])
    assert compute_reward(model(lambda _r: next(answers)), **fields("a")).score == 1.0
    with pytest.raises(RewardFnError, match="answered 400"):
        compute_reward(model(lambda _r: httpx.Response(400, text="bad")), **fields("a"))
    with pytest.raises(RewardFnError, match="no reward_score"):
        compute_reward(model(lambda _r: httpx.Response(200, json={"x": 1})), **fields("a"))
    with pytest.raises(RewardModelError, match="answered 503"):
        model(lambda _r: httpx.Response(503), retries=1)(**fields("a"))  # type: ignore[arg-type]
