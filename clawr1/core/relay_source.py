"""Who called, carried from the compat port to the capture proxy and trusted only when sealed.

The compat port relays an agent's call through the proxy's reverse port, and the step it becomes
should name the API key that made it (``source_name``), not the proxy. Anyone who can reach the proxy
could send a header saying so, so the name travels sealed: ``X-Claw-Source: <name>:<HMAC>``, the
HMAC over the name and the trajectory id with a secret both processes hold (``CLAWR1_RELAY_SECRET``,
else a random one kept in ``<data dir>/relay-secret``, which ``clawr1 up``'s roles share). The proxy
records the name only when the seal is right, so a header an agent writes itself names no one, and a
sealed header copied from elsewhere names its key for that one trajectory only.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from pathlib import Path
from urllib.parse import quote, unquote

from clawr1.core.registry import RELAY_SECRET
from clawr1.core.settings import Settings

SOURCE_HEADER = "X-Claw-Source"
SECRET_FILE = "relay-secret"


def relay_secret(settings: Settings) -> bytes:
    """``CLAWR1_RELAY_SECRET``, else the data dir's secret (made once, mode 0600, by whichever process
    needs it first: a link, never an overwrite, so two processes starting together agree)."""
    configured = settings.role_setting(RELAY_SECRET)
    if configured:
        return configured.encode()
    path = settings.data_dir.resolve() / SECRET_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        draft = path.with_name(f".{SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}")
        draft.touch(mode=0o600)
        draft.write_text(secrets.token_hex(32))
        try:
            os.link(draft, path)
        except FileExistsError:
            pass
        finally:
            draft.unlink()
    return Path(path).read_text().strip().encode()


def _mac(secret: bytes, name: str, trajectory_id: str) -> str:
    return hmac.new(secret, f"{name}\x00{trajectory_id}".encode(), hashlib.sha256).hexdigest()


def seal(secret: bytes, name: str, trajectory_id: str) -> str:
    """The header value naming ``name`` as the caller for ``trajectory_id`` (ASCII, whatever the name)."""
    return f"{quote(name, safe='')}:{_mac(secret, name, trajectory_id)}"


def unseal(secret: bytes, value: str, trajectory_id: str) -> str | None:
    """The name ``value`` carries when its seal is right for ``trajectory_id``, else None."""
    quoted, _, mac = value.strip().rpartition(":")
    name = unquote(quoted)
    if not name or not hmac.compare_digest(mac, _mac(secret, name, trajectory_id)):
        return None
    return name
