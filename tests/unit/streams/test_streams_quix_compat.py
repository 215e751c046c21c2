"""Every name of Quix Streams the worker reaches past its documented examples exists in the installed
version (``clawr1/streams/quix_compat.py``): an upgrade that renames one fails here, naming it."""

from __future__ import annotations

import sys
import types

import pytest

from clawr1.streams import quix_compat


def test_every_pinned_name_exists_in_the_installed_quixstreams() -> None:
    missing = quix_compat.missing_names()
    assert not missing, (f"quixstreams no longer has {missing}: clawr1/streams/quix_compat.py relies on "
                         "them; adapt it to the installed version before upgrading")


def test_a_renamed_name_is_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if an upgrade renamed ``Checkpoint.get_store_transaction``: the check names it."""
    stub = types.ModuleType("quixstreams_stub_checkpoint")

    class Checkpoint:
        def store_transaction(self) -> None: ...

    stub.Checkpoint = Checkpoint  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, stub.__name__, stub)
    pinned = (("quixstreams_stub_checkpoint", "Checkpoint.get_store_transaction"),
              ("quixstreams_stub_checkpoint", "Checkpoint.store_transaction"),
              ("no_such_module_anywhere", "Thing.attr"))
    assert quix_compat.missing_names(pinned) == [
        "quixstreams_stub_checkpoint:Checkpoint.get_store_transaction", "no_such_module_anywhere:Thing.attr"]
