"""Secrets are forwarded upstream but never recorded: header and query scrubbing for every event.

Matching is deliberately broad (any header or query parameter whose name mentions a key, token,
secret, password, cookie, session, signature or auth, and any header value that looks like a bearer
credential or an API key): recording one header too few costs little, leaking one key costs a lot.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

_SECRET_NAME = re.compile(
    r"auth|key|token(?!s)|secret|passw|cookie|session|signature|credential|^sig$|^x-amz-", re.IGNORECASE
)
_SECRET_VALUE = re.compile(
    r"^\s*(bearer|basic|digest|token)\s+\S|\b(sk|rk|pk)-[A-Za-z0-9_\-]{12,}|\bsk-ant-|\bAIza[0-9A-Za-z_\-]{20,}",
    re.IGNORECASE,
)


def is_secret_header(name: str, value: str = "") -> bool:
    return bool(_SECRET_NAME.search(name) or _SECRET_VALUE.search(value))


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
    """The URL without query parameters that carry credentials (``?key=...``, ``access_token=...``)."""
    parts = urlsplit(url)
    if not parts.query:
        return url
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in pairs if not is_secret_header(k, v)]
    if len(kept) == len(pairs):
        return url
    return urlunsplit(parts._replace(query=urlencode(kept)))
