"""mitmproxy addons, one per concern; ``build_addons`` gives them in the order their hooks must run."""

from __future__ import annotations

from collections.abc import Callable

from proxy.addons.capture import Capture
from proxy.addons.hints import ClawHints
from proxy.addons.token_ids import TokenIdCapture
from proxy.record import CapturedCall


def build_addons(submit: Callable[[CapturedCall], None], capture_token_ids: bool) -> list[object]:
    """Hints first (they may refuse a call), token-id injection next (it must see the response before
    the capture reads what the agent got), capture last."""
    addons: list[object] = [ClawHints()]
    if capture_token_ids:
        addons.append(TokenIdCapture())
    addons.append(Capture(submit))
    return addons


__all__ = ["Capture", "ClawHints", "TokenIdCapture", "build_addons"]
