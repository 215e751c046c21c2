"""Token ids back to text, for the trajectory view: only with the tokenizer that made them.

The pool records a step's tokenizer by identity (``<name>@sha256:<16 hex>``, plus
``+chat_template@...`` when the model's template rendered the turn; ``clawr1.streams.tokenization``).
The dashboard loads the same tokenizer the streams re-tokenize with (``CLAWR1_TOKENIZER``) and decodes a
step's ids only when its identity names that tokenizer file; any other step (engine ids from an unknown
tokenizer, no ids at all) is shown beside its captured text instead, never decoded with a guess.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

TEMPLATE_MARK = "+chat_template@"


def tokenizer_file_identity(identity: str) -> str:
    """The part of a tokenizer identity that names the ``tokenizer.json`` (the template does not change
    which text an id stands for)."""
    return identity.split(TEMPLATE_MARK, 1)[0]


@dataclass(frozen=True)
class TokenDecoder:
    """One loaded ``tokenizers.Tokenizer`` and the identity the streams stamp on the steps it made."""

    tokenizer: Any
    identity: str

    def knows(self, step_tokenizer: str | None) -> bool:
        mine = tokenizer_file_identity(self.identity)
        return bool(step_tokenizer) and tokenizer_file_identity(str(step_tokenizer)) == mine

    def pieces(self, ids: Sequence[int]) -> list[str]:
        """The text of each id on its own (special tokens included: they are part of what was trained)."""
        return list(self.tokenizer.decode_batch([[int(i)] for i in ids], skip_special_tokens=False))

    def text(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False))


def load_decoder(spec: str) -> TokenDecoder | None:
    """The decoder for the tokenizer ``spec`` names (``CLAWR1_TOKENIZER``), or None when none is set. A
    tokenizer that cannot be loaded is logged and left out: the dashboard then shows captured text."""
    if not spec:
        return None
    try:
        from clawr1.streams.tokenization import Retokenizer  # needs the optional `tokenizers` package

        loaded = Retokenizer.load(spec)
    except (ImportError, ValueError) as exc:
        log.warning("the dashboard decodes no token ids: %s", exc)
        return None
    return TokenDecoder(loaded.tokenizer, loaded.identity)
