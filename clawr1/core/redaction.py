"""Secrets are forwarded upstream but never recorded: scrubbing for every captured call and every other
way in that stores what an agent sent (the proxy's records, OTLP content).

The rule (docs/security.md), one list of secret *names* and one of secret *shapes*, applied the same
way wherever a name meets a value:

- **Secret names** (``is_secret_name``): a name whose words (case, camelCase, separators and digits
  aside: ``X-Api-Key``, ``apiKey``, ``API_KEY2`` all read ``api key``; plurals as their singular) hold
  one of ``SECRET_WORDS`` (password, pwd, pass, passcode, otp, secret, creds, cookie, sig, signature,
  jwt, auth, authz, private, session, sid, csrf, ...), ends in ``token``, ``key`` or ``access`` (or is
  ``tokens`` alone), or spells a credential without separators (``accesstoken``, ``clientsecret``,
  ``jsessionid``, ``csrfmiddlewaretoken``); a few ordinary names are not (``max_tokens``,
  ``token_ids``, ``prompt_cache_key``, ``stop_token``, ``public_key``). It decides, identically, for
  **header** names, **query** and **form** parameters (``&`` or ``;`` separated), **multipart** parts
  and **JSON** fields at any depth: a header or query parameter so named is dropped, a form or
  multipart value or a JSON field's value is replaced by ``[REDACTED]``, whatever its type (a string,
  a number, a list, an object; not ``true``/``null``), except a property of a JSON schema of an object
  (a tool's ``{"type": "object", "properties": {"password": {"type": "string"}}}`` stays; a
  ``properties`` anywhere else exempts nothing) and the completions API's ``logprobs.tokens``.
  OAuth's ``code`` is secret in URLs only: elsewhere ``code`` is a tool's input.
- **Secret shapes** (``SECRET_TOKEN``: OpenAI/Anthropic ``sk-``, Hugging Face ``hf_``, GitHub
  ``ghp_``/``gho_``/``github_pat_``, GitLab ``glpat-``, Slack ``xox?-``, AWS ``AKIA``, Google ``AIza``,
  Stripe, JWTs, ``Bearer`` credentials, PEM private keys, a URL's ``user:password@`` in text) are
  replaced wherever they appear: URL path,
  bodies, prompt and reply text, JSON keys, ids; also when percent-encoded (``sk%2Dproj%2D...``). A
  header or parameter whose value (percent-decoded) holds one, is a credential (``Bearer ...``,
  ``Basic ...``) or, for a header, reads ``user:password``, is dropped whatever its name, and so is
  one whose *name* holds one.
- **URL userinfo** (``user:pass@host``) is dropped.
- Bodies: every JSON document in a text is found (behind a byte-order mark, between other bytes,
  one per line); the rest of the text gets the shape rule, form and multipart bodies the name rule.

A body that needed no change is kept byte for byte; one that did is re-serialized JSON.

Cost: every string first goes through ``might_hold_token``, a case-insensitive substring test for what
every ``SECRET_TOKEN`` alternative must contain (``sk-``, ``hf_``, ``eyj``, ``bearer``, a ``%`` escape,
...), about 15x cheaper than the full pattern; only a hit runs it, and its answers are remembered for
the texts seen lately (a conversation's earlier turns come back in every call). A JSON body none of whose
parsed strings and keys holds such an anchor and with no secret-named key over a value is returned as it
came, without building a redacted copy (bench/bench_proxy.py, bench/bench_record.py).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import unquote, unquote_plus, urlsplit, urlunsplit

from cachetools import LRUCache

from clawr1.core.json_depth import MAX_JSON_DEPTH, too_deep

REDACTED = "[REDACTED]"
REDACTED_WITH_TOKEN_IDS = "secrets redacted from the text; the engine token ids still encode them"
TOO_DEEP = f"[REDACTED: JSON nested deeper than {MAX_JSON_DEPTH} levels]"
"""What a text holding JSON nested past ``MAX_JSON_DEPTH`` becomes: its fields cannot be read one by one,
so its secret-named fields could not be found."""
TOO_DEEP_NOTE = f"a text with JSON nested deeper than {MAX_JSON_DEPTH} levels was not kept: {TOO_DEEP}"

SECRET_WORDS = frozenset({
    "password", "passwd", "passphrase", "passcode", "pwd", "pass", "otp", "totp", "secret", "credential",
    "creds", "cookie", "sig", "signature", "jwt", "apikey", "auth", "authz", "authn", "authorization",
    "authentication", "bearer", "private", "session", "sid", "csrf", "xsrf",
})
"""A name holding one of these words, or its plural, is secret (``X-Pwd``, ``new_password``,
``x-session-id``, ``passcodes``, ``X-Authz``, ``sid``)."""
SECRET_LAST_WORDS = frozenset({"token", "key", "access"})
"""... and so is one ending in one of these (``api_key``, ``refresh_token``, ``X-Access``); ``tokens``
ends a secret name only alone (``X-Tokens``): ``max_tokens``, ``x-ratelimit-remaining-tokens`` count
a model's tokens."""
_SECRET_SQUASHED = ("password", "passwd", "secret", "apikey", "accesstoken", "authtoken", "refreshtoken",
                    "apitoken", "accesskey", "privatekey", "credential", "cookie", "signature", "bearer",
                    "authorization", "sessionid", "sessid", "csrf", "xsrf")
"""... or spelling a credential without separators (``clientsecret``, ``AWSACCESSKEYID``, ``jsessionid``,
``PHPSESSID``, ``csrfmiddlewaretoken``)."""
_PLURAL = SECRET_WORDS | {"token"}
"""Words whose plural reads as they do (``keys`` stays a list of names, ``key`` alone is secret)."""
NOT_SECRET = frozenset({
    "stop_token", "eos_token", "bos_token", "pad_token", "unk_token", "sep_token", "cls_token", "mask_token",
    "prompt_cache_key", "cache_key", "public_key", "idempotency_key", "partition_key", "sort_key",
    "primary_key", "foreign_key",
})
"""Names that read secret but hold none (a tokenizer's special tokens, OpenAI's ``prompt_cache_key``)."""
URL_ONLY_SECRETS = frozenset({"code"})
"""OAuth's authorization ``code`` in a redirect URL; in JSON ``code`` is a tool's program."""
_NEVER_RECORDED = frozenset({"x-claw-source"})
"""The compat port's seal on the caller's name (clawr1.core.relay_source): read by the proxy, never kept."""
_JSON_VALUED = frozenset({"x-claw-metadata"})
"""Headers whose value is a JSON document the streams read into a step (an agent's or a compat
registration's metadata): the value gets the field rule, as any other JSON the pool keeps."""

_CREDENTIAL_SCHEME = re.compile(r"^\s*(bearer|basic|digest|token)\s+\S", re.IGNORECASE)
# ``user:password`` as a header value (X-Forwarded-User: u:S); a port (host:8080) or a time is not.
_USER_PASSWORD = re.compile(r"^[^\s:/@]{1,64}:(?=[^\s:]*[A-Za-z])[^\s:]{6,}$")
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
        r"(?<=://)[^\s/?#@:]+:[^\s/?#@]+(?=@)",                      # a URL's user:password@ in text
    ])
)
# A run of URL characters holding a percent escape: decoded, it may spell a token (sk%2Dproj%2D...).
_ENCODED_RUN = re.compile(r"[A-Za-z0-9._~+%-]*%[0-9A-Fa-f]{2}[A-Za-z0-9._~+%-]*")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# Separators, and digits (``pwd2``, ``password_1``): a name's words are its runs of letters.
_NOT_LETTERS = re.compile(r"[^a-z]+")
# Lower-cased substrings every SECRET_TOKEN alternative contains, and the percent escape that may hide
# one; none present means no match.
_TOKEN_ANCHORS = ("sk-", "rk-", "sk_", "rk_", "hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_",
                  "glpat-", "xox", "akia", "asia", "aiza", "eyj", "bearer", "private key", "://", "%")
_FORM = re.compile(r"[\w.%+~\[\]-]+=[^&;\s]*(?:[&;][\w.%+~\[\]-]+=[^&;\s]*)*")
_MULTIPART_PART = re.compile(
    r'(content-disposition:[^\r\n]*?\bname="([^"]*)"[^\r\n]*\r?\n(?:[^\r\n]+\r?\n)*\r?\n)(.*?)(?=\r?\n--)',
    re.IGNORECASE | re.DOTALL)
# Where a JSON object or array may start: ``raw_decode`` fails anywhere else (``{`` before anything but a
# key or ``}``, ``[`` before no value), so code full of braces costs a scan, not an exception a brace.
_JSON_START = re.compile(r"\{(?=\s*[\"}])|\[(?=\s*[\]\[{\"\-0-9tfn])")
_OBJECT_START = re.compile(r"\{(?=\s*\")")
# Lower-cased substrings every secret name contains (a token in a name has a _TOKEN_ANCHORS one).
_NAME_ANCHORS = ("pass", "pwd", "otp", "secret", "cred", "cookie", "sig", "jwt", "key", "auth", "bearer",
                 "private", "session", "sid", "csrf", "xsrf", "token", "access", "amz")
_DECODER = json.JSONDecoder()


def _has_anchor(lowered: str, anchors: tuple[str, ...]) -> bool:
    return any(map(lowered.__contains__, anchors))


class _RecentVerdicts:
    """A text predicate's answers for the texts it saw lately: short texts by count, long ones within a
    budget of characters held.

    An agent's every call carries its conversation so far: without them every call scanned all of it
    again, ~40 passes over the text, where the turns earlier calls sent now cost a lookup. Texts longer
    than a sixteenth of the budget are scanned each time (they would evict the rest). Thread-safe."""

    def __init__(self, predicate: Callable[[str], bool], budget_chars: int) -> None:
        self._predicate = predicate
        self._short = functools.lru_cache(maxsize=16384)(predicate)
        self._budget = budget_chars
        # text -> (verdict, its length): the budget counts the texts' characters.
        self._verdicts: LRUCache[str, tuple[bool, int]] = LRUCache(budget_chars, getsizeof=_length)
        self._lock = threading.Lock()

    def __call__(self, text: str) -> bool:
        if len(text) <= _SHORT:
            return self._short(text)
        if len(text) > self._budget // 16:
            return self._predicate(text)
        with self._lock:
            held = self._verdicts.get(text)
        if held is not None:
            return held[0]
        verdict = self._predicate(text)
        with self._lock:
            self._verdicts[text] = (verdict, len(text))
        return verdict


def _length(held: tuple[bool, int]) -> int:
    return held[1]


_SHORT = 256
"""Texts up to this long are remembered by count (16,384 of them: 4M characters at most)."""

might_hold_token = _RecentVerdicts(lambda text: _has_anchor(text.lower(), _TOKEN_ANCHORS), 8 << 20)
"""False only when ``SECRET_TOKEN`` cannot match a text nor its percent-decoding (a necessary-condition
prefilter); the answers are remembered for the texts seen lately (~12M characters in all)."""


def _might_name_a_secret(lowered: str) -> bool:
    """False only when no secret name can be in the (lower-cased) text."""
    return any(map(lowered.__contains__, _NAME_ANCHORS))


def _singular(word: str) -> str:
    return word[:-1] if word.endswith("s") and word[:-1] in _PLURAL else word


@functools.lru_cache(maxsize=8192)
def is_secret_name(name: str) -> bool:
    """The one rule for names of headers, query, form and multipart parameters and JSON fields. A name
    is read as its words whatever its spelling: case, camelCase, separators and digits aside
    (``X-Api-Key``, ``apiKey``, ``API_KEY2`` all read ``api key``), plurals as their singular."""
    words = [word for word in _NOT_LETTERS.split(_CAMEL.sub("_", name).lower()) if word]
    if len(words) > 1 and words[0] == "x":
        words = words[1:]
    if not words or "_".join(words) in NOT_SECRET:
        return False
    if words[0] == "amz" or SECRET_TOKEN.search(name):
        return True
    counted = len(words) > 1 and words[-1] == "tokens"  # max_tokens: a number of the model's tokens
    words = [_singular(word) for word in words]
    if (words[-1] in SECRET_LAST_WORDS and not counted) or any(word in SECRET_WORDS for word in words):
        return True
    squashed = "".join(words)
    return any(part in squashed for part in _SECRET_SQUASHED)


# The JSON rule's name, kept for its callers.
is_secret_field = is_secret_name


def _holds_token(text: str) -> bool:
    if not might_hold_token(text):
        return False
    return bool(SECRET_TOKEN.search(text) or ("%" in text and SECRET_TOKEN.search(unquote(text))))


def is_secret_value(value: str) -> bool:
    """A value to drop whatever its name: a secret-shaped token (percent-decoded too) or a credential."""
    return bool(_CREDENTIAL_SCHEME.search(value)) or _holds_token(value)


def is_secret_header(name: str, value: str = "") -> bool:
    lowered = name.lower()
    return (lowered in _NEVER_RECORDED or is_secret_name(name) or is_secret_value(value)
            or bool(_USER_PASSWORD.match(value.strip())))


def _redact_encoded(match: re.Match[str]) -> str:
    run = match.group(0)
    return REDACTED if SECRET_TOKEN.search(unquote(run)) else run


def redact_tokens(text: str) -> str:
    """``text`` with every secret-shaped token (also one spelled with percent escapes) replaced by
    ``[REDACTED]``."""
    if not might_hold_token(text):
        return text
    text = SECRET_TOKEN.sub(REDACTED, text)
    return _ENCODED_RUN.sub(_redact_encoded, text) if "%" in text else text


def redact_id(value: str) -> str:
    """An id (a trajectory hint, a Kafka key) that holds a secret becomes a stable stand-in, the same for
    the same id, so its calls still group together: never the secret, never one shared value."""
    if not _holds_token(value):
        return value
    return f"{REDACTED[:-1]}:{hashlib.sha256(value.encode()).hexdigest()[:24]}]"


def redact_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Header map for the record: names lower-cased, repeated headers joined, secrets dropped."""
    kept: dict[str, str] = {}
    for name, value in headers:
        if is_secret_header(name, value):
            continue
        key = name.lower()
        if key in _JSON_VALUED:
            value = redact_text(value)
        kept[key] = f"{kept[key]}, {value}" if key in kept else value
    return kept


def _parameters(text: str) -> Iterator[tuple[str, str, str]]:
    """``(raw segment, name, value)`` of a query or form text, split at ``&`` and ``;`` alike."""
    for segment in re.split(r"[&;]", text):
        name, _, value = segment.partition("=")
        yield segment, unquote_plus(name), unquote_plus(value)


def _secret_parameter(name: str, value: str, url: bool) -> bool:
    return (is_secret_name(name) or (url and name.lower() in URL_ONLY_SECRETS) or is_secret_value(value)
            or _holds_token(name))


def redact_url(url: str) -> str:
    """The URL without userinfo, credential query parameters (``?key=``, ``;pwd=``, ``access_token=``,
    ``code=``) and secret-shaped tokens in its path (percent-encoded ones included)."""
    parts = urlsplit(url)
    if parts.username is not None or parts.password is not None:
        parts = parts._replace(netloc=parts.netloc.rpartition("@")[2])
    if parts.query:
        segments = list(_parameters(parts.query))
        kept = [raw for raw, name, value in segments if not _secret_parameter(name, value, url=True)]
        if len(kept) != len(segments):
            parts = parts._replace(query="&".join(kept))
    return redact_tokens(urlunsplit(parts))


def _redact_form(text: str) -> str:
    """A form body (``a=1&api_key=S``): secret-named or secret-valued parameters get ``[REDACTED]``."""
    segments = list(_parameters(text))
    out = [f"{raw.partition('=')[0]}={REDACTED}" if _secret_parameter(name, value, url=False) else raw
           for raw, name, value in segments]
    return redact_tokens("&".join(out) if out != [raw for raw, _, _ in segments] else text)


def _redact_multipart(text: str) -> str:
    def part(match: re.Match[str]) -> str:
        return match.group(1) + REDACTED if is_secret_name(match.group(2)) else match.group(0)

    return _MULTIPART_PART.sub(part, text)


_SCHEMA_PROPERTIES = "properties"
"""A JSON schema's ``properties``: the parent of names that are a tool's parameters, not values."""
_NOT_SECRET_UNDER = frozenset({("logprobs", "tokens")})
"""(parent, name) pairs that read secret but hold none: the completions API's logprobs list its text
pieces as ``tokens``."""


def _properties_parent(holder: dict[str, Any]) -> str:
    """The parent the value of ``holder``'s ``properties`` is judged under: a schema's properties only
    where ``holder`` is a JSON schema of an object (``"type": "object"``); elsewhere
    (``{"properties": {"password": "S"}}``) its fields are judged as any others. Callers test the key
    first, sparing a call for every other key of a conversation."""
    kind = holder.get("type")
    return _SCHEMA_PROPERTIES if kind == "object" or (isinstance(kind, list) and "object" in kind) else ""


def _is_hidden(key: str, item: Any, parent: str | None) -> bool:
    """Whether a field's value is replaced: a secret name over anything but ``true``/``false``/``null``/
    empty, except a schema's property (an object: ``{"password": {"type": "string"}}``)."""
    return is_secret_name(key) and not (
        (parent == _SCHEMA_PROPERTIES and isinstance(item, dict)) or (parent, key) in _NOT_SECRET_UNDER
        or item is None or isinstance(item, bool) or item in ("", [], {}))


_PARENTS_THAT_MATTER = frozenset({_SCHEMA_PROPERTIES} | {parent for parent, _ in _NOT_SECRET_UNDER})


def _redact_value(value: Any, parent: str | None = None) -> Any:
    if isinstance(value, str):
        return redact_tokens(value)
    if isinstance(value, list | tuple):
        return [_redact_value(item, parent) for item in value]
    if isinstance(value, dict):
        return {redact_tokens(key): REDACTED if _is_hidden(key, item, parent)
                else _redact_value(item, key if key != _SCHEMA_PROPERTIES else _properties_parent(value))
                for key, item in value.items()}
    return value


def _needs_redaction(value: Any, parent: str | None = None, clean: set[int] | None = None) -> bool:
    """Whether ``_redact_value`` could change anything in ``value``: a string or key that might hold a
    token, or a secret-named field. Judged on the parsed strings, escapes decoded. ``clean``: the ids of
    objects found to need nothing (under no parent that matters: a schema's ``properties``, a logprobs),
    to which this adds those it finds: a request's prompt messages are the request's own objects. Its
    caller keeps every object it names alive, so no id there is reused."""
    if isinstance(value, str):
        return might_hold_token(value)
    if isinstance(value, dict):
        remember = clean if parent not in _PARENTS_THAT_MATTER else None
        if remember is not None and id(value) in remember:
            return False
        for key, item in value.items():  # loops, not any(): a conversation has thousands of fields
            if might_hold_token(key) or _is_hidden(key, item, parent) or _needs_redaction(
                    item, key if key != _SCHEMA_PROPERTIES else _properties_parent(value), clean):
                return True
        if remember is not None:
            remember.add(id(value))
    elif isinstance(value, list | tuple):  # a caller's parsed value may hold tuples (redact_text)
        for item in value:
            if _needs_redaction(item, parent, clean):
                return True
    return False


def _redact_json(text: str, parsed: Any, clean: set[int] | None = None) -> str:
    if not _needs_redaction(parsed, None, clean):
        return text
    cleaned = _redact_value(parsed)
    return text if cleaned == parsed else json.dumps(cleaned, ensure_ascii=False)


def _redact_documents(text: str) -> str:
    """Every JSON object or array in ``text`` gets the field rule, the bytes around them the token rule
    (a byte-order mark, trailing bytes, one document per line, JSON inside a log line); ``TOO_DEEP``
    where they nest past the limit. A text with no token anchor and no escape that could spell one has
    no token to find: only its objects are read (for their secret-named fields; an array's objects are
    found on their own), and its other bytes are kept as they are."""
    if too_deep(text):
        return TOO_DEEP
    tokens = might_hold_token(text) or "\\u" in text or "\\/" in text
    out: list[str] = []
    position = 0
    for start in (_JSON_START if tokens else _OBJECT_START).finditer(text):
        if start.start() < position:
            continue
        try:
            parsed, end = _DECODER.raw_decode(text, start.start())
        except ValueError:
            continue
        between = text[position:start.start()]
        out += [redact_tokens(between) if tokens else between, _redact_json(text[start.start():end], parsed)]
        position = end
    if not out:
        return redact_tokens(text)
    out.append(redact_tokens(text[position:]) if tokens else text[position:])
    joined = "".join(out)
    return text if joined == text else joined


def redact_text(text: str, parsed: dict[str, Any] | list[Any] | None = None,
                clean: set[int] | None = None) -> str:
    """A body or text field: JSON gets the field and token rules, a form or multipart body the name rule,
    other text the token rule; unchanged text is returned as it was. ``parsed``: the object or array
    ``json.loads`` gives for the text (white space and a byte-order mark around it aside), when the
    caller has read it already: an agent's request is its whole conversation, read once; ``clean``:
    ``_needs_redaction``'s, for objects of ``parsed``. JSON nested past ``MAX_JSON_DEPTH`` cannot be
    read field by field: such a text becomes ``TOO_DEEP``."""
    body = text.strip().lstrip("\ufeff")
    if body[:1] in ("{", "["):  # a JSON body is judged on its parsed strings (see _RecentVerdicts)
        if parsed is None:
            if too_deep(body):
                return TOO_DEEP
            with contextlib.suppress(ValueError):
                parsed = json.loads(body)
        if parsed is not None:
            cleaned = _redact_json(body, parsed, clean)
            return text if cleaned is body else cleaned
    json_like = "{" in text or "[" in text
    lowered = text.lower()
    if json_like and "\\u" not in text and "\\/" not in text and not might_hold_token(text) \
            and not _might_name_a_secret(lowered):
        json_like = False  # no anchor, no escape that could spell one, no secret name: nothing to find
    if "=" in body and _FORM.fullmatch(body):
        cleaned = _redact_form(body)
        return text if cleaned is body else cleaned  # white space around a clean form text stays
    if "content-disposition" in lowered[:4096]:
        return _redact_documents(_redact_multipart(text))
    return _redact_documents(text) if json_like else redact_tokens(text)


def _structured_is_clean(text: str) -> bool:
    return redact_text(text) == text


_structured_verdicts = _RecentVerdicts(_structured_is_clean, 8 << 20)


def text_is_clean(text: str) -> bool:
    """Whether ``redact_text`` keeps a text as it is, remembered for the texts seen lately (a white-box
    step's prompt holds its conversation so far, each earlier turn again). A text with no ``{``, ``[`` or
    ``=`` holds no JSON, form or multipart part: only the token rule applies, and its prefilter's
    verdict is remembered already."""
    if "{" in text or "[" in text or "=" in text:
        return _structured_verdicts(text)
    return not might_hold_token(text) or redact_tokens(text) == text


@functools.lru_cache(maxsize=8192)
def _key_needs_look(key: str) -> bool:
    """Whether a JSON key may hold a token or name a secret (then its field is judged in full)."""
    return might_hold_token(key) or is_secret_name(key)


def _needs_json_rule(value: Any) -> bool:
    """Whether ``redact_json`` could change anything in ``value``; iterative, allocating next to nothing
    (a white-box step's conversation is walked on every request: this is its cost on clean text)."""
    if isinstance(value, str):
        return not text_is_clean(value)
    pending: list[tuple[Any, str | None]] = [(value, None)]
    while pending:
        item, parent = pending.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                if _key_needs_look(key) and (might_hold_token(key) or _is_hidden(key, child, parent)):
                    return True
                if isinstance(child, str):
                    if not text_is_clean(child):
                        return True
                elif isinstance(child, _CONTAINERS):
                    pending.append((child, key if key != _SCHEMA_PROPERTIES else _properties_parent(item)))
        elif isinstance(item, _CONTAINERS):
            for child in item:
                if isinstance(child, str):
                    if not text_is_clean(child):
                        return True
                elif isinstance(child, _CONTAINERS):
                    pending.append((child, parent))
    return False


_CONTAINERS = (dict, list)


def redact_json(value: Any) -> Any:
    """A parsed JSON value (messages, metadata, a payload, a text) as a record's own fields are kept:
    a secret-named field's value is ``[REDACTED]`` at any depth (the JSON rule, schemas' properties
    exempt), every key gets the token rule and every string ``redact_text`` (JSON inside a string,
    tool-call arguments, gets the field rule too). ``value`` itself, not a copy, when nothing needs a
    change. Iterative, so ``redact_text`` has the whole stack for what a string holds."""
    if not _needs_json_rule(value):
        return value

    pending: list[tuple[Any, Any, str | None]] = []

    def copy(item: Any, parent: str | None) -> Any:
        if isinstance(item, str):
            return item if text_is_clean(item) else redact_text(item)
        if isinstance(item, dict | list):
            out: Any = {} if isinstance(item, dict) else []
            pending.append((item, out, parent))
            return out
        return item

    root = copy(value, None)
    while pending:
        source, target, parent = pending.pop()
        if isinstance(target, dict):
            for key, item in source.items():
                hidden = _is_hidden(key, item, parent)
                below = key if key != _SCHEMA_PROPERTIES else _properties_parent(source)
                target[redact_tokens(key)] = REDACTED if hidden else copy(item, below)
        else:
            target.extend(copy(item, parent) for item in source)
    return value if root == value else root


# Fields the schema types as numbers (ids, logprobs: thousands of items, no text to redact), and
# headers (redacted already).
_NUMBERS = frozenset({"prompt_token_ids", "token_ids", "logprobs"})
_NOT_WALKED = _NUMBERS | {"request_headers", "response_headers"}


def redact_record(record: dict[str, Any],
                  parsed: dict[str, dict[str, Any] | list[Any]] | None = None) -> dict[str, Any]:
    """Every text field of a ``raw_llm_call`` record (bodies, prompt, reply, errors) through
    ``redact_text``; headers and URL are expected redacted already. Engine token ids cannot be
    redacted without the model's tokenizer: a record with both gets ``REDACTED_WITH_TOKEN_IDS`` in
    its capture notes, so a trainer can drop it. ``parsed``: for top-level text fields the builder
    read as JSON, their value (``redact_text``'s ``parsed``); objects two of them share are judged once
    (a request and its prompt's messages)."""

    seen: dict[str, str] = {}  # the response body and assembled response are often the same text
    clean: set[int] = set()  # of objects in ``parsed``, which holds them all alive meanwhile
    for key, value in (parsed or {}).items():
        text = record[key]
        if text not in seen:
            seen[text] = redact_text(text, value, clean)

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
    if TOO_DEEP in seen.values():
        redacted["capture_notes"] = [*redacted.get("capture_notes", []), TOO_DEEP_NOTE]
    return redacted
