"""The LLM APIs the proxy recognises, by request path; everything else passes through unrecorded."""

from __future__ import annotations

from clawr1.proxy.apis import anthropic_messages, openai_chat, openai_completions, openai_responses
from clawr1.proxy.apis.base import ApiSpec, Assembled, AssembledChoice

# Order matters: "/chat/completions" must win over "/completions".
APIS: tuple[ApiSpec, ...] = tuple(
    ApiSpec(m.NAME, m.PATH_SUFFIX, m.request_messages, m.assemble, m.assemble_stream)
    for m in (openai_chat, openai_completions, openai_responses, anthropic_messages)
)
BY_NAME = {api.name: api for api in APIS}


def detect_api(method: str, path: str) -> ApiSpec | None:
    """Only POSTs create LLM calls; the path may carry any prefix (``/v1``, ``/openai/v1``...)."""
    if method.upper() != "POST":
        return None
    bare = path.split("?", 1)[0].rstrip("/")
    return next((api for api in APIS if bare.endswith(api.path_suffix)), None)


__all__ = ["APIS", "BY_NAME", "ApiSpec", "Assembled", "AssembledChoice", "detect_api"]
