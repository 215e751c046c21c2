"""A reward model behind HTTP, usable as any reward function (``clawr1.rewards.http_model:reward_model``).

Wire shape (the seed system's ``/compute_reward``, so a Claw-R1 compat port or any server speaking it
can be the model): ``POST <url>`` with JSON

    {"prompt_ids": [...], "response_ids": [...], "num_turns": n,
     "extra_fields": {...}, "dataset_fields": {...}}

answered by ``{"reward_score": float, "reward_extra_info": {...}}`` (``{"score": float, ...}`` is accepted
too). Transport errors and 5xx/429 answers are retried with backoff (full jitter, at least the model's
Retry-After, at most ``backoff_s * 2**(retries - 1)``); anything else fails the call with a
:class:`RewardModelError`, which the rewarder turns into a dead letter.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import httpx

from clawr1.core.backoff import Backoff, retry_after_s
from clawr1.core.registry import REWARD_MODEL_API_KEY, REWARD_MODEL_TIMEOUT_S, REWARD_MODEL_URL

__all__ = ["HttpRewardModel", "RewardModelError", "reward_model"]

_RETRYABLE = frozenset({408, 425, 429, 500, 502, 503, 504})


class RewardModelError(RuntimeError):
    """The reward model could not be reached or answered something that is not a reward."""


class HttpRewardModel:
    """A callable reward function that asks a model server; thread-safe (one pooled httpx client)."""

    def __init__(self, url: str, *, api_key: str = "", timeout_s: float = 30.0, retries: int = 2,
                 backoff_s: float = 0.5, transport: httpx.BaseTransport | None = None) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"reward model URL must be http(s)://, got {url!r}")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url
        self.retries = retries
        self.backoff = Backoff(backoff_s, backoff_s * 2 ** max(0, retries - 1))
        self._client = httpx.Client(timeout=timeout_s, headers=headers, transport=transport)

    def __call__(self, *, prompt_ids: list[int] | None = None, response_ids: list[int] | None = None,
                 num_turns: int = 1, extra_fields: Mapping[str, Any] | None = None,
                 dataset_fields: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body = {
            "prompt_ids": list(prompt_ids or []),
            "response_ids": list(response_ids or []),
            "num_turns": num_turns,
            "extra_fields": dict(extra_fields or {}),
            "dataset_fields": dict(dataset_fields or {}),
        }
        reply = self._post(body)
        where = f"reward model at {self.url}"
        try:
            data = reply.json()
        except ValueError as exc:
            raise RewardModelError(f"{where} answered non-JSON: {reply.text[:200]!r}") from exc
        if not isinstance(data, Mapping):
            raise RewardModelError(f"{where} answered {type(data).__name__}, not an object")
        score = data.get("reward_score", data.get("score"))
        if score is None:
            raise RewardModelError(f"{where} answered no reward_score: {sorted(data)}")
        extra = data.get("reward_extra_info") or {
            k: v for k, v in data.items() if k not in ("score", "reward_score")}
        return {"score": score, "extra": extra}

    def _post(self, body: dict[str, Any]) -> httpx.Response:
        for attempt in range(self.retries + 1):
            last_try = attempt == self.retries
            retry_after: str | None = None
            try:
                reply = self._client.post(self.url, json=body)
            except httpx.HTTPError as exc:
                if last_try:
                    raise RewardModelError(f"reward model at {self.url} unreachable: {exc}") from exc
            else:
                if reply.status_code < 300:
                    return reply
                if last_try or reply.status_code not in _RETRYABLE:
                    raise RewardModelError(
                        f"reward model at {self.url} answered {reply.status_code}: {reply.text[:200]}")
                retry_after = reply.headers.get("Retry-After")
            time.sleep(self.backoff.delay(attempt + 1, retry_after_s(retry_after)))
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._client.close()


@lru_cache(maxsize=1)
def _from_environment() -> HttpRewardModel:
    url = REWARD_MODEL_URL.read(os.environ)
    if not url:
        raise RewardModelError(f"set {REWARD_MODEL_URL.name} to use clawr1.rewards.http_model:reward_model")
    return HttpRewardModel(
        url,
        api_key=REWARD_MODEL_API_KEY.read(os.environ),
        timeout_s=REWARD_MODEL_TIMEOUT_S.read(os.environ),
    )


def reward_model(**fields: Any) -> dict[str, Any]:
    """``CLAWR1_REWARD_FN=clawr1.rewards.http_model:reward_model``: the model at ``CLAWR1_REWARD_MODEL_URL``
    (optional ``CLAWR1_REWARD_MODEL_API_KEY`` as a Bearer token, ``CLAWR1_REWARD_MODEL_TIMEOUT_S``)."""
    return _from_environment()(**fields)
