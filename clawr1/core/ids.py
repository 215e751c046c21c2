"""What an id may hold, one rule wherever an id comes in: the API's bodies, OTLP attributes, the capture
proxy's ``X-Claw-*`` hints.

An id travels on as a Kafka key, an HTTP header (the proxy, the compat port), a path segment of a
dashboard URL and a log line. An id with CR/LF was stored, then answered 404 by the dashboard (a path
segment never matches a line break), and could split a header or a log line; so no id holds a control
character (U+0000-U+001F, U+007F-U+009F) or a line or paragraph separator (U+2028, U+2029).
"""

from __future__ import annotations

import re

ID_MAX = 256
"""Characters an id may have (at least one)."""

_FORBIDDEN = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def id_problem(value: str) -> str | None:
    """Why ``value`` cannot be an id, or None when it can."""
    if not 1 <= len(value) <= ID_MAX:
        return f"an id has 1 to {ID_MAX} characters, this one {len(value)}"
    found = _FORBIDDEN.search(value)
    if found is not None:
        return (f"an id holds no control character or line separator; this one has {found.group()!r} "
                f"at position {found.start()}")
    return None
