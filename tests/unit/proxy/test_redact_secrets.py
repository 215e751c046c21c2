"""Secrets placed anywhere in a captured call (header values under innocent names, query parameters,
URL userinfo and path, secret-named JSON fields at any depth of request and response, inside prompt
and reply text) never reach the bytes produced to Kafka; ordinary content is left alone."""

from __future__ import annotations

import json
import string
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clawr1.core.redaction import (
    REDACTED,
    REDACTED_WITH_TOKEN_IDS,
    SECRET_TOKEN,
    _redact_value,
    is_secret_field,
    might_hold_token,
    redact_headers,
    redact_id,
    redact_text,
    redact_url,
)
from clawr1.proxy.hints import Hints
from clawr1.proxy.record import CapturedCall, build_record
from clawr1.schemas.codec import codec_for

ALNUM = string.ascii_letters + string.digits
UPPER_DIGITS = string.ascii_uppercase + string.digits
B64URL = ALNUM + "-_"


def chars(alphabet: str, size: int, max_size: int | None = None) -> st.SearchStrategy[str]:
    return st.text(alphabet, min_size=size, max_size=size if max_size is None else max_size)


def joined(*parts: st.SearchStrategy[str] | str) -> st.SearchStrategy[str]:
    return st.tuples(*(st.just(p) if isinstance(p, str) else p for p in parts)).map("".join)


@dataclass(frozen=True)
class Secret:
    placed: str
    """What the agent sent or got."""
    needle: str
    """What must not survive (for ``Bearer x``, the credential ``x``)."""


# Secret-shaped tokens as their issuers mint them.
TOKENS = st.one_of(
    joined("sk-", chars(B64URL, 20, 60)),
    joined("sk-proj-", chars(B64URL, 40, 80)),
    joined("sk-ant-api03-", chars(B64URL, 40, 95)),
    joined("hf_", chars(ALNUM, 34)),
    joined(st.sampled_from(["ghp_", "gho_", "ghu_", "ghs_", "ghr_"]), chars(ALNUM, 36)),
    joined("github_pat_", chars(ALNUM, 22), "_", chars(ALNUM, 59)),
    joined("glpat-", chars(B64URL, 20)),
    joined(st.sampled_from("abposr").map(lambda c: f"xox{c}-"), chars(string.digits, 10, 13), "-",
           chars(ALNUM, 24)),
    joined(st.sampled_from(["AKIA", "ASIA"]), chars(UPPER_DIGITS, 16)),
    joined("AIza", chars(B64URL, 35)),
    joined("eyJ", chars(B64URL, 10, 40), ".eyJ", chars(B64URL, 10, 80), ".", chars(B64URL, 0, 43)),
)
SHAPED = st.one_of(
    TOKENS.map(lambda token: Secret(token, token)),
    joined(chars(ALNUM + "._~+/-", 15, 40), st.sampled_from(string.digits))
    .map(lambda cred: Secret(f"Bearer {cred}", cred)),
)
# A value whose only sign of being secret is the name it is stored under. Always has a capital, so it
# cannot collide with the lower-case filler text or the hex ids of the record.
OPAQUE = joined(st.sampled_from(string.ascii_uppercase), chars(UPPER_DIGITS, 9, 30))
SECRET_FIELDS = ["api_key", "apiKey", "token", "access_token", "refresh_token", "client_secret", "password",
                 "secret", "x-api-key", "privateKey", "id_token", "authorization"]
FILLER = st.text(string.ascii_lowercase + " ", max_size=30)
SEPARATORS = st.sampled_from([" ", "\n", "\"", "'", "(", ": ", "=", ", ", "`", "<", "/"])


def in_text(secret: Secret) -> st.SearchStrategy[str]:
    return joined(FILLER, SEPARATORS, secret.placed, SEPARATORS, FILLER)


def nested(key: str, value: str, depth: int) -> Any:
    """``{key: value}`` under ``depth`` levels of objects and lists."""
    node: Any = {key: value, "note": "kept"}
    for level in range(depth):
        node = {f"level{level}": node} if level % 2 == 0 else [node]
    return node


@st.composite
def captured_calls(draw: st.DrawFn) -> tuple[CapturedCall, list[str]]:
    """One chat call with secrets in every place a client or server puts them, and their needles."""
    needles: list[str] = []

    def shaped() -> Secret:
        secret = draw(SHAPED)
        needles.append(secret.needle)
        return secret

    def opaque() -> str:
        value = draw(OPAQUE)
        needles.append(value)
        return value

    header = (draw(st.sampled_from(["X-Note", "X-Request-Tag", "Accept-Language"])), shaped().placed)
    user = quote(draw(FILLER.filter(bool)))
    userinfo = f"{user}:{quote(opaque(), safe='')}@" if draw(st.booleans()) else ""
    query = urlencode([("q", shaped().placed), (draw(st.sampled_from(["code", "access_token", "key",
                                                                        "client_secret", "sig"])), opaque())])
    path_token = draw(TOKENS)  # URL-safe as minted
    needles.append(path_token)
    url = f"https://{userinfo}api.example:8443/v1/{path_token}/chat/completions?{query}"
    metadata = nested(draw(st.sampled_from(SECRET_FIELDS)), opaque(), draw(st.integers(0, 4)))
    request = {
        "model": "m",
        "max_tokens": 7,
        "messages": [{"role": "system", "content": draw(in_text(shaped()))},
                     {"role": "user", "content": draw(in_text(shaped()))}],
        "metadata": metadata,
    }
    response = {
        "id": "c1", "model": "m", "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        "choices": [{"index": 0, "finish_reason": "stop", "message": {
            "role": "assistant", "content": draw(in_text(shaped()))}}],
        "service": nested(draw(st.sampled_from(SECRET_FIELDS)), opaque(), draw(st.integers(0, 3))),
    }
    call = CapturedCall(
        flow_id="flow-1", api="openai.chat", method="POST", url=url, upstream="https://api.example:8443",
        request_headers=(header, ("Content-Type", "application/json")),
        request_body=json.dumps(request).encode(), hints=Hints(), streamed=False, status=200,
        response_headers=(("x-served-by", shaped().placed), ("content-type", "application/json")),
        response_body=json.dumps(response).encode(), response_encoding="", engine_body=None, injection=None,
        started=1.0, first_byte=1.5, finished=2.0, captured_at=2.0,
    )
    return call, needles


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(captured_calls())
def test_no_secret_placed_anywhere_reaches_the_produced_bytes(case: tuple[CapturedCall, list[str]]) -> None:
    call, needles = case
    _, record = build_record(call, "proxy-test")
    produced = codec_for().encode("raw_llm_call", record)
    for needle in needles:
        assert needle.encode() not in produced, needle
    assert REDACTED.encode() in produced


@settings(max_examples=300, deadline=None)
@given(SHAPED, SEPARATORS, SEPARATORS)
def test_secret_shaped_tokens_are_replaced_in_plain_text(secret: Secret, before: str, after: str) -> None:
    text = f"my key is{before}{secret.placed}{after} do not share"
    assert secret.needle not in redact_text(text)
    assert redact_text(text).startswith("my key is") and redact_text(text).endswith("do not share")


@settings(max_examples=300, deadline=None)
@given(SHAPED, SEPARATORS, SEPARATORS, st.sampled_from([str, str.upper, str.lower, str.swapcase]))
def test_the_prefilter_never_hides_a_token(secret: Secret, before: str, after: str, case: Any) -> None:
    text = case(f"x{before}{secret.placed}{after}y")
    if SECRET_TOKEN.search(text):
        assert might_hold_token(text)


JSON_VALUES = st.one_of(FILLER, SHAPED.flatmap(in_text), OPAQUE, st.integers(), st.text(max_size=20))
JSON_KEYS = st.one_of(st.sampled_from(SECRET_FIELDS + ["content", "role", "max_tokens", "note"]),
                      st.text(max_size=12))
JSON_BODIES = st.recursive(JSON_VALUES, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(JSON_KEYS, inner, max_size=4)), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(JSON_KEYS, JSON_BODIES, max_size=5), st.booleans())
def test_json_bodies_are_redacted_as_by_a_full_walk(body: dict[str, Any], ascii_only: bool) -> None:
    """The fast path (returning the text unchanged) is taken only when a full walk changes nothing,
    whatever the escapes (``ensure_ascii`` writes non-ASCII, and could write anything, as \\u)."""
    text = json.dumps(body, ensure_ascii=ascii_only)
    assert json.loads(redact_text(text)) == _redact_value(body)


def test_escaped_secrets_in_json_are_redacted() -> None:
    token = "sk-" + "a1" * 12
    spelled = "".join(f"\\u{ord(c):04x}" for c in token)  # every character as a \\u escape
    assert token not in json.loads(redact_text('{"content": "' + spelled + '"}'))["content"]
    after_newline = json.dumps({"content": "line\n" + token})  # raw text reads ...\\nsk-...
    assert token not in redact_text(after_newline)
    assert json.loads(redact_text('{"api\\u005fkey": "opaque"}')) == {"api_key": REDACTED}


@pytest.mark.parametrize("name", SECRET_FIELDS + [
    "clientSecret", "AWS_SECRET_ACCESS_KEY", "new_password", "github_token", "session_token", "session_id",
    "clientsecret", "X-Pwd", "X-Pass", "X-Passcode", "X-Sig", "X-OTP", "X-Creds", "X-Private", "X-Access",
    "X-JWT", "pwd", "pass", "passcode", "otp", "private", "key", "AWSACCESSKEYID"])
def test_secret_field_names(name: str) -> None:
    assert is_secret_field(name)


@pytest.mark.parametrize("name", ["max_tokens", "max_completion_tokens", "prompt_cache_key", "stop_token",
                                  "top_k", "keys", "token_ids", "key_points", "code", "token_type", "author",
                                  "passage", "keyword", "public_key", "x-ratelimit-remaining-tokens"])
def test_ordinary_field_names_are_not_secret(name: str) -> None:
    assert not is_secret_field(name)


def test_ordinary_content_is_kept_byte_for_byte() -> None:
    body = json.dumps({
        "model": "m", "max_tokens": 5, "prompt_cache_key": "user-42",
        "messages": [{"role": "user", "content": "A Bearer token goes in the Authorization header; ask-me "
                                                 "about risk-management-framework and sk-learn."}],
        "tools": [{"type": "function", "function": {"name": "login", "parameters": {
            "type": "object", "properties": {"password": {"type": "string"}, "token": {"type": "string"}}}}}],
    }, indent=1)
    assert redact_text(body) is body


def test_secret_named_fields_are_replaced_and_the_rest_kept() -> None:
    body = {"model": "m", "metadata": {"apiKey": "opaque-1", "auth": {"refresh_token": "opaque-2"},
                                       "retries": 3, "password": "", "private": False, "token": None},
            "messages": [{"role": "user", "content": "call me with hf_" + "a1" * 17}]}
    assert json.loads(redact_text(json.dumps(body))) == {
        "model": "m", "metadata": {"apiKey": REDACTED, "auth": REDACTED, "retries": 3, "password": "",
                                   "private": False, "token": None},
        "messages": [{"role": "user", "content": f"call me with {REDACTED}"}]}


def test_urls_lose_userinfo_credential_parameters_and_path_tokens() -> None:
    url = ("https://bob:hunter2@host:8443/bot/xoxb-1234567890-abcdefghij/send"
           "?code=oauth-code&state=s1&access_token=t&key=k&alt=sse")
    assert redact_url(url) == f"https://host:8443/bot/{REDACTED}/send?state=s1&alt=sse"
    assert redact_url("http://h/v1/chat/completions") == "http://h/v1/chat/completions"


def test_secret_values_under_innocent_header_names_are_dropped() -> None:
    jwt = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"
    headers = [("X-Note", jwt), ("X-Trace", "glpat-abcdefghij0123456789"), ("X-Id", "AKIAABCDEFGHIJKLMNOP"),
               ("X-Request-Id", "req-123"), ("Accept", "application/json")]
    assert redact_headers(headers) == {"x-request-id": "req-123", "accept": "application/json"}


def test_records_with_engine_token_ids_say_their_text_was_redacted() -> None:
    messages = [{"role": "user", "content": "hi"}]
    response = {"id": "c1", "model": "m", "prompt_token_ids": [1, 2],
                "choices": [{"index": 0, "finish_reason": "stop", "token_ids": [3],
                             "message": {"role": "assistant", "content": "ghp_" + "x1" * 18}}]}
    call = CapturedCall(
        flow_id="f", api="openai.chat", method="POST", url="http://h/v1/chat/completions", upstream="http://h",
        request_headers=(), request_body=json.dumps({"model": "m", "messages": messages}).encode(),
        hints=Hints(), streamed=False, status=200, response_headers=(),
        response_body=json.dumps(response).encode(), response_encoding="", engine_body=None, injection=None,
        started=1.0, first_byte=1.5, finished=2.0, captured_at=2.0,
    )
    _, record = build_record(call, "p")
    assert record["choices"][0]["text"] == REDACTED
    assert REDACTED_WITH_TOKEN_IDS in record["capture_notes"]


# -- issue 25, finding 5: the placements that got through ---------------------------------------------

SECRET_HEADER_NAMES = ["X-Pwd", "X-Pass", "X-Passcode", "X-Sig", "X-OTP", "X-Creds", "X-Private",
                       "X-Access", "X-JWT", "X-Api-Key", "X-Session", "Cookie"]
SECRET_PARAMS = ["pwd", "pass", "passcode", "otp", "private", "key", "api_key", "client_secret", "sig",
                 "token"]


def json_value(secret: str, shape: str) -> Any:
    """The secret as a string, in a list, in an object under an innocent name, or as a number."""
    return {"string": secret, "list": [secret], "object": {"value": secret}, "nested": {"pass": secret},
            "deep": [{"x": [secret]}]}[shape]


@st.composite
def placements(draw: st.DrawFn) -> tuple[CapturedCall, list[str]]:
    """One captured call with a secret placed where the attacker of issue 25 put them, and what must not
    reach Kafka: neither the secret nor its percent-encoding, in the message key or value."""
    opaque = draw(OPAQUE)
    token = draw(TOKENS.filter(lambda t: "-" in t or "_" in t))
    needles = [opaque, token]
    encoded = token.replace("-", "%2D").replace("_", "%5F")
    headers = [(draw(st.sampled_from(SECRET_HEADER_NAMES)), opaque),
               ("X-Forwarded-User", f"{draw(st.sampled_from(['u', 'bob', 'svc-1']))}:{opaque}"),
               (token, "1"),  # a key used as a header name
               ("X-Note", encoded)]
    separator = draw(st.sampled_from(["&", ";"]))
    query = separator.join(["alt=sse", f"{draw(st.sampled_from(SECRET_PARAMS))}={quote(opaque)}",
                            f"q={quote(encoded)}"])
    url = f"https://api.example/v1/{encoded}/chat/completions?{query}"
    field = draw(st.sampled_from(SECRET_FIELDS + ["auth", "pwd", "pass", "private", "session"]))
    document = {"model": "m", "messages": [{"role": "user", "content": f"use {encoded} please"}],
                "metadata": nested(field, json_value(opaque, draw(st.sampled_from(
                    ["string", "list", "object", "nested", "deep"]))), draw(st.integers(0, 3)))}
    kind = draw(st.sampled_from(["bom", "trailing", "ndjson", "form", "multipart"]))
    text = json.dumps(document)
    body = {
        "bom": "\ufeff" + text,
        "trailing": text + draw(st.sampled_from(["\x00garbage", " }", "\n{", "]"])),
        "ndjson": text + "\n" + json.dumps({"api_key": opaque}) + "\n",
        "form": f"model=m&{draw(st.sampled_from(SECRET_PARAMS))}={quote(opaque)}&note={quote(encoded)}",
        "multipart": ("--b0undary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n"
                      f"--b0undary\r\nContent-Disposition: form-data; name=\"{field}\"\r\n\r\n{opaque}\r\n"
                      "--b0undary--\r\n"),
    }[kind]
    call = CapturedCall(
        flow_id="flow-25", api="openai.chat", method="POST", url=url, upstream="https://api.example",
        request_headers=tuple(headers), request_body=body.encode(), hints=Hints(trajectory_id=token),
        streamed=False, status=200, response_headers=(("content-type", "application/json"),),
        response_body=json.dumps({"id": "c", "choices": [], "auth": {"token": opaque}}).encode(),
        response_encoding="", engine_body=None, injection=None,
        started=1.0, first_byte=1.5, finished=2.0, captured_at=2.0,
    )
    return call, needles


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(placements())
def test_no_placement_of_issue_25_reaches_kafka(case: tuple[CapturedCall, list[str]]) -> None:
    call, needles = case
    key, record = build_record(call, "proxy-test")
    produced = codec_for().encode("raw_llm_call", record)
    for needle in needles:
        for spelled in {needle, quote(needle, safe=""), needle.replace("-", "%2D").replace("_", "%5F")}:
            assert spelled.encode() not in produced, (spelled, record)
            assert spelled not in key, key
    assert record["trajectory_id"] == key and key.startswith("[REDACTED:")


def test_secret_ids_get_a_stable_stand_in() -> None:
    token = "sk-proj-" + "Ab1" * 12
    assert redact_id(token) == redact_id(token) != redact_id(token + "x")
    assert token not in redact_id(token) and redact_id("traj-7") == "traj-7"


def test_bodies_are_redacted_whatever_their_framing() -> None:
    assert json.loads(redact_text('\ufeff{"api_key": "S1", "n": 1}')) == {"api_key": REDACTED, "n": 1}
    assert redact_text('{"pwd": "S2"} trailing') == f'{{"pwd": "{REDACTED}"}} trailing'
    assert redact_text("grant_type=x&client_secret=S3;pass=S4") == \
        f"grant_type=x&client_secret={REDACTED}&pass={REDACTED}"
    multipart = ('--b\r\nContent-Disposition: form-data; name="api_key"\r\n\r\nS5\r\n'
                 '--b\r\nContent-Disposition: form-data; name="q"\r\n\r\nkept\r\n--b--\r\n')
    assert "S5" not in redact_text(multipart) and "kept" in redact_text(multipart)
    tools = json.dumps({"tools": [{"parameters": {"type": "object",
                                                  "properties": {"password": {"type": "string"}}}}]})
    assert redact_text(tools) is tools


def test_headers_and_query_parameters_of_issue_25() -> None:
    headers = [(name, "S6") for name in SECRET_HEADER_NAMES] + [
        ("X-Forwarded-User", "u:Secret-S7x"), ("sk-proj-" + "Zz9" * 10, "1"), ("Host", "api.example:8443"),
        ("X-Request-Id", "req-1"), ("X-Claw-Source", "agent:" + "0" * 64)]
    assert redact_headers(headers) == {"host": "api.example:8443", "x-request-id": "req-1"}
    url = "https://h/v1/sk%2Dproj%2D" + "Ab1" * 10 + "/x?a=1;key=S8&pwd=S9&passcode=1&otp=2&private=3&b=2"
    assert redact_url(url) == f"https://h/v1/{REDACTED}/x?a=1&b=2"


# -- names read as words: case, separators, digits and plurals aside ------------------------------------

MISSED_NAMES = ["sessionid", "jsessionid", "SESSID", "PHPSESSID", "csrfmiddlewaretoken", "tokens",
                "passcodes", "authz", "sid", "passwords", "api_keys", "refresh_tokens", "Password2",
                "api-key-1"]
MISSED_HEADERS = ["X-Sessionid", "X-Authz", "X-Tokens", "X-Passcodes", "X-Sid", "X-CSRFToken"]
MISSED_QUERY = ["pwd2", "authz", "sessionid", "tokens", "sid"]


@pytest.mark.parametrize("name", MISSED_NAMES + MISSED_HEADERS + MISSED_QUERY)
def test_secret_names_in_any_spelling(name: str) -> None:
    assert is_secret_field(name)


@pytest.mark.parametrize("name", ["max_tokens", "max_new_tokens", "prompt_tokens", "cached_tokens",
                                  "cache_read_input_tokens", "x-ratelimit-limit-tokens",
                                  "prompt_tokens_details", "possession", "considerations", "sides", "keys",
                                  "sha256", "v2"])
def test_counts_of_tokens_and_look_alikes_are_not_secret(name: str) -> None:
    assert not is_secret_field(name)


def test_the_names_the_proxy_missed_are_redacted_in_every_placement() -> None:
    document = {name: f"S-{name}" for name in MISSED_NAMES}
    redacted = json.loads(redact_text(json.dumps(document)))
    assert redacted == dict.fromkeys(MISSED_NAMES, REDACTED)
    form = "&".join(f"{name}=F-{name}" for name in MISSED_NAMES) + "&q=kept"
    assert redact_text(form) == "&".join(f"{name}={REDACTED}" for name in MISSED_NAMES) + "&q=kept"
    headers = [(name, "H-opaque") for name in MISSED_HEADERS] + [("X-Request-Id", "r1")]
    assert redact_headers(headers) == {"x-request-id": "r1"}
    url = "https://h/v1/x?" + "&".join(f"{name}=Q-{name}" for name in MISSED_QUERY) + "&alt=sse"
    assert redact_url(url) == "https://h/v1/x?alt=sse"


def test_properties_are_a_schemas_only_in_a_schema_of_an_object() -> None:
    tool = {"type": "object", "properties": {"password": {"type": "string"}, "auth": {
        "type": "object", "properties": {"token": {"type": "string", "description": "kept"}}}}}
    schema = json.dumps({"tools": [{"type": "function", "function": {"name": "login", "parameters": tool}}]})
    assert redact_text(schema) is schema
    not_a_schema = {"metadata": {"properties": {"password": "S1", "sessionid": "S2", "token": ["S3"]}},
                    "profile": {"type": "user", "properties": {"api_key": {"value": "S4"}}},
                    "typed": {"type": "object", "properties": {"password": "S5"}}}
    assert json.loads(redact_text(json.dumps(not_a_schema))) == {
        "metadata": {"properties": {"password": REDACTED, "sessionid": REDACTED, "token": REDACTED}},
        "profile": {"type": "user", "properties": {"api_key": REDACTED}},
        "typed": {"type": "object", "properties": {"password": REDACTED}}}


def test_the_completions_logprobs_keep_their_tokens() -> None:
    logprobs = {"tokens": ["h", "i"], "token_logprobs": [-1, -2]}
    reply = json.dumps({"choices": [{"text": "hi", "logprobs": logprobs}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
    assert redact_text(reply) is reply
