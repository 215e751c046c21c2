"""mitmproxy addons, one per concern; ``build_addons`` gives them in the order their hooks must run."""

from __future__ import annotations

import ssl
from collections.abc import Callable

from clawr1.gateway.auth import KeyRing
from clawr1.proxy.addons.capture import Capture
from clawr1.proxy.addons.engines import EngineRouter
from clawr1.proxy.addons.hints import ClawHints
from clawr1.proxy.addons.token_ids import TokenIdCapture
from clawr1.proxy.record import CapturedCall
from clawr1.proxy.token_ids import TokenIdPolicy


def build_addons(submit: Callable[[CapturedCall], None], token_ids: TokenIdPolicy | None,
                 upstream_verify: ssl.SSLContext | bool = True, relay_secret: bytes = b"",
                 router: EngineRouter | None = None, keys: KeyRing | None = None) -> list[object]:
    """Hints first (they may refuse a call), the engine router next (the rollout hint picks the engine
    the token-id policy then looks at), token-id injection next (it must see the response before
    the capture reads what the agent got), capture last. ``token_ids`` None: no injection at all;
    ``upstream_verify`` is how a retry without injected fields trusts the upstream; ``relay_secret``
    checks the compat port's seal on the caller's name; ``router`` spreads the reverse port's calls;
    ``keys``: the stack's API keys, when hints need a credential."""
    addons: list[object] = [ClawHints(relay_secret, keys)]
    if router is not None:
        addons.append(router)
    if token_ids is not None:
        addons.append(TokenIdCapture(token_ids, upstream_verify))
    addons.append(Capture(submit))
    return addons


__all__ = ["Capture", "ClawHints", "EngineRouter", "TokenIdCapture", "build_addons"]
