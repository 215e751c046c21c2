"""Secrets are forwarded upstream but never recorded: scrubbing for every captured call.

The rule (docs/security.md):

- **Headers** and **query parameters** whose name mentions a key, token, secret, password, cookie,
  session, signature, credential or auth (and OAuth's ``code``) are dropped, and so is any whose
  value looks like a credential. Matching is deliberately broad: recording one header too few costs
  little, leaking one key costs a lot.
- **URL userinfo** (``user:pass@host``) is dropped.
- **Secret-shaped tokens** (``SECRET_TOKEN``: OpenAI/Anthropic ``sk-``, Hugging Face ``hf_``,
  GitHub ``ghp_``/``gho_``/``github_pat_``, GitLab ``glpat-``, Slack ``xox?-``, AWS ``AKIA``, Google
  ``AIza``, Stripe, JWTs, ``Bearer`` credentials, PEM private keys) are replaced by ``[REDACTED]``
  wherever they appear: URL path, bodies, prompt and reply text. They are never useful training data.
- **Secret-named JSON fields** (``api_key``, ``apiKey``, ``token``, ``access_token``, ``password``,
  ``client_secret``, ...; ``is_secret_field``) get ``[REDACTED]`` as value when that value is a
  string or number, at any depth of a JSON body, request and response. Objects under such names
  (a tool's parameter schema ``{"password": {"type": "string"}}``) are walked, not replaced.
  Text inside strings is not parsed as JSON: tool-call arguments are the model's output and keep
  their words unless a secret-shaped token is in them.

A body that needed no change is kept byte for byte; one that did is re-serialized JSON.

Cost: every string first goes through ``might_hold_token``, a case-insensitive substring test for what
every ``SECRET_TOKEN`` alternative must contain (``sk-``, ``hf_``, ``eyj``, ``bearer``, ...), about 15x
cheaper than the full pattern; only a hit runs it. A JSON body whose raw text has no such anchor and
no ``\\u`` escape (which could spell one) and no secret-named key over a scalar is returned as it
came, without building a redacted copy (bench/bench_proxy.py, CPU per call).
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

REDACTED = "[REDACTED]"
REDACTED_WITH_TOKEN_IDS = "secrets redacted from the text; the engine token ids still encode them"

_SECRET_NAME = re.compile(
    r"auth|key|token(?!s)|secret|passw|cookie|session|signature|credential|^sig$|^code$|^x-amz-",
    re.IGNORECASE,
)
_CREDENTIAL_SCHEME = re.compile(r"^\s*(bearer|basic|digest|token)\s+\S", re.IGNORECASE)
# A token starts where no other token character precedes it: "risk-…" or "ask-…" are words.
_START = r"(?<![A-Za-z0-9_-])"
SECRET_TOKEN = re.compile(
    "|".join([
        _START + r"(?:sk|rk)-[A-Za-z0-9_-]{20,}",                     # OpenAI, Anthropic (sk-ant-…)
        _START + r"[sr]k_(?:live|test)_[A-Za-z0-9]{16,}",              # Stripe
        _START + r"hf_[A-Za-z0-9]{30,}",                               # Hugging Face
        _START + r"gh[pousr]_[A-Za-z0-9]{30,}",                        # GitHub tokens
        _START + r"github_pat_[A-Za-z0-9_]{30,}",                      # GitHub fine-grained
        _START + r"glpat-[A-Za-z0-9_-]{20,}",                          # GitLab
        _START + r"xox[abposr]-[A-Za-z0-9-]{10,}",                     # Slack
        _START + r"(?:AKIA|ASIA)[A-Z0-9]{16}",                         # AWS access key ids
        _START + r"AIza[0-9A-Za-z_-]{30,}",                            # Google API keys
        _START + r"eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*",  # JWT, maybe unsigned
        r"(?i:\bbearer)\s+(?=[A-Za-z0-9._~+/-]*[0-9])[A-Za-z0-9._~+/-]{16,}=*",  # a credential, not prose
        r"-----BEGIN[A-Z ]*PRIVATE KEY-----[\s\S]*?-----END[A-Z ]*PRIVATE KEY-----",
    ])
)
_SECRET_FIELD = re.compile(
    r"(?:^|_)(?:api_?key|apikey|secret|secret_key|client_secret|password|passwd|passphrase|private_key"
    r"|access_key(?:_id)?|credentials?|authorization|cookie|(?:access|refresh|id|auth|session|bearer"
    r"|oauth|api|csrf|app|bot|service|personal_access|github|gitlab|gh|hf|slack)_token)$"
    r"|^(?:token|auth|pwd|code_verifier)$"
)
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# Lower-cased substrings every SECRET_TOKEN alternative contains; none present means no match.
_TOKEN_ANCHORS = ("sk-", "rk-", "sk_", "rk_", "hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_",
                  "glpat-", "xox", "akia", "asia", "aiza", "eyj", "bearer", "private key")


def might_hold_token(text: str) -> bool:
    """False only when ``SECRET_TOKEN`` cannot match ``text`` (a necessary-condition prefilter)."""
    return any(map(text.lower().__contains__, _TOKEN_ANCHORS))


@functools.lru_cache(maxsize=4096)
def is_secret_field(name: str) -> bool:
    """``api_key``, ``apiKey``, ``X-Api-Key``, ``refresh_token``, ``client_secret``, ``password``, ...
    but not ``max_tokens``, ``prompt_cache_key`` or ``stop_token``."""
    return bool(_SECRET_FIELD.search(_CAMEL.sub("_", name).lower().replace("-", "_")))


def is_secret_header(name: str, value: str = "") -> bool:
    return bool(_SECRET_NAME.search(name) or _CREDENTIAL_SCHEME.search(value) or SECRET_TOKEN.search(value))


def redact_tokens(text: str) -> str:
    """``text`` with every secret-shaped token replaced by ``[REDACTED]``."""
    return SECRET_TOKEN.sub(REDACTED, text) if might_hold_token(text) else text


def redact_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Header map for the record: names lower-cased, repeated headers joined, secrets dropped."""
    kept: dict[str, str] = {}
    for name, value in headers:
        if is_secret_header(name, value):
            continue
        key = name.lower()
        kept[key] = f"{kept[key]}, {value}" if key in kept else value
    return kept


def redact_url(url: str) -> str:
    """The URL without userinfo, credential query parameters (``?key=``, ``access_token=``, ``code=``)
    and secret-shaped tokens in its path."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        kept = [(k, v) for k, v in pairs if not is_secret_header(k, v)]
        if len(kept) != len(pairs):
            parts = parts._replace(query=urlencode(kept))
    return redact_tokens(urlunsplit(parts))


def _is_scalar(item: Any) -> bool:
    return isinstance(item, str | int | float) and not isinstance(item, bool) and item != ""


def _redact_value(value: Any) -> Any:
    if isinstance(value, str):
        return redact_tokens(value)
    if isinstance(value, list):
        return [_redact_value(item) for item in value]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            secret = _is_scalar(item) and is_secret_field(key)
            out[redact_tokens(key)] = REDACTED if secret else _redact_value(item)
        return out
    return value


def _has_secret_field(value: Any) -> bool:
    """Whether ``_redact_value`` would replace a field's value somewhere in ``value``."""
    if isinstance(value, list):
        for item in value:
            if _has_secret_field(item):
                return True
    elif isinstance(value, dict):
        for key, item in value.items():
            if (_is_scalar(item) and is_secret_field(key)) or _has_secret_field(item):
                return True
    return False


def redact_text(text: str) -> str:
    """A body or text field: JSON (object or array) gets the field and token rules, other text the
    token rule; unchanged text is returned as it was."""
    if text.lstrip()[:1] in ("{", "["):
        try:
            parsed = json.loads(text)
        except ValueError:
            pass
        else:
            # Escapes only ever stand for one character outside every anchor, except \\u which can
            # spell any: without it, an anchor-free raw text has anchor-free strings and keys.
            if "\\u" not in text and not might_hold_token(text) and not _has_secret_field(parsed):
                return text
            cleaned = _redact_value(parsed)
            return text if cleaned == parsed else json.dumps(cleaned, ensure_ascii=False)
    return redact_tokens(text)


# Fields the schema types as numbers (ids, logprobs: thousands of items, no text to redact), and
# headers (redacted already).
_NUMBERS = frozenset({"prompt_token_ids", "token_ids", "logprobs"})
_NOT_WALKED = _NUMBERS | {"request_headers", "response_headers"}


def redact_record(record: dict[str, Any]) -> dict[str, Any]:
    """Every text field of a ``raw_llm_call`` record (bodies, prompt, reply, errors) through
    ``redact_text``; headers and URL are expected redacted already. Engine token ids cannot be
    redacted without the model's tokenizer: a record with both gets ``REDACTED_WITH_TOKEN_IDS`` in
    its capture notes, so a trainer can drop it."""

    seen: dict[str, str] = {}  # the response body and assembled response are often the same text

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            if value not in seen:
                seen[value] = redact_text(value)
            return seen[value]
        if isinstance(value, list):
            return [walk(item) for item in value]
        if isinstance(value, dict):
            return {key: item if key in _NUMBERS else walk(item) for key, item in value.items()}
        return value

    redacted = {key: value if key in _NOT_WALKED else walk(value) for key, value in record.items()}
    if redacted != record and (record.get("prompt_token_ids") or any(
            c.get("token_ids") for c in record.get("choices", []))):
        redacted["capture_notes"] = [*redacted.get("capture_notes", []), REDACTED_WITH_TOKEN_IDS]
    return redacted
