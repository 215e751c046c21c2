"""Every name of mitmproxy the proxy reaches past its documented API exists in the installed version with
the parameters it is used with (``clawr1/proxy/mitm_compat.py``): an upgrade that renames or reshapes one
fails here, naming it. And no other module of the project reaches past that API."""

from __future__ import annotations

import ast
import sys
import types
from importlib.metadata import version
from pathlib import Path

import pytest

from clawr1.core import pins
from clawr1.proxy import mitm_compat

ROOT = Path(__file__).resolve().parents[3]
COMPAT = ROOT / "proxy" / "mitm_compat.py"
# mitmproxy's documented modules (its API reference, the addon hooks' objects, options and ctx);
# ``mitmproxy.test`` gives the unit tests their flows.
DOCUMENTED = {"mitmproxy", "mitmproxy.http", "mitmproxy.connection", "mitmproxy.flow", "mitmproxy.tls",
              "mitmproxy.websocket", "mitmproxy.dns", "mitmproxy.proxy.mode_specs",
              "mitmproxy.proxy.server_hooks", "mitmproxy.ctx", "mitmproxy.options", "mitmproxy.exceptions",
              "mitmproxy.master", "mitmproxy.test"}
UPGRADE = (f"clawr1/proxy/mitm_compat.py relies on them: adapt it to the installed mitmproxy "
           f"({version('mitmproxy')}) before upgrading")


def test_every_pinned_name_exists_in_the_installed_mitmproxy() -> None:
    missing = pins.missing_names(mitm_compat.PINNED)
    assert not missing, f"mitmproxy no longer has {missing}: {UPGRADE}"


def test_every_replaced_or_overridden_callable_keeps_its_parameters() -> None:
    changed = pins.changed_signatures(mitm_compat.SIGNATURES)
    assert not changed, f"mitmproxy changed {changed}: {UPGRADE}"


@pytest.fixture
def stub_mode_servers(monkeypatch: pytest.MonkeyPatch) -> str:
    """As if an upgrade renamed ``AsyncioServerInstance.listen`` to ``bind`` and gave it a ``reuse``
    parameter in front."""
    stub = types.ModuleType("mitmproxy_stub_mode_servers")

    class AsyncioServerInstance:
        def bind(self, reuse: bool, host: str, port: int) -> None: ...

        def handle_stream(self, reader: object, writer: object) -> None: ...

    stub.AsyncioServerInstance = AsyncioServerInstance  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, stub.__name__, stub)
    return stub.__name__


def test_a_renamed_name_is_reported(stub_mode_servers: str) -> None:
    pinned = ((stub_mode_servers, "AsyncioServerInstance.listen"),
              (stub_mode_servers, "AsyncioServerInstance.handle_stream"),
              (stub_mode_servers, "Gone.attr"),
              ("no_such_module_anywhere", "Thing.attr"))
    assert pins.missing_names(pinned) == [f"{stub_mode_servers}:AsyncioServerInstance.listen",
                                          f"{stub_mode_servers}:Gone.attr",
                                          "no_such_module_anywhere:Thing.attr"]


def test_a_reshaped_or_renamed_callable_is_reported(stub_mode_servers: str) -> None:
    signatures = {(stub_mode_servers, "AsyncioServerInstance.bind"): ("self", "host", "port"),
                  (stub_mode_servers, "AsyncioServerInstance.listen"): ("self", "host", "port"),
                  (stub_mode_servers, "AsyncioServerInstance.handle_stream"): ("self", "reader")}
    assert pins.changed_signatures(signatures) == [
        f"{stub_mode_servers}:AsyncioServerInstance.bind(self, host, port) is now (self, reuse, host, port)",
        f"{stub_mode_servers}:AsyncioServerInstance.listen(self, host, port) is now (gone)"]


def test_an_annotated_class_attribute_counts_as_present() -> None:
    """``Proxyserver.servers`` is declared by annotation and set per instance."""
    assert not pins.missing_names([("mitmproxy.addons.proxyserver", "Proxyserver.servers")])


def _mitmproxy_imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            from_package = node.module == "mitmproxy"
            names |= {f"mitmproxy.{a.name}" for a in node.names} if from_package else {node.module}
    return {name for name in names if name.split(".")[0] == "mitmproxy"}


def test_only_the_compat_module_imports_mitmproxy_beyond_its_documented_modules() -> None:
    folders = [p for p in ROOT.iterdir() if p.is_dir() and not p.name.startswith(".") and p.name != "clawr1"]
    files = [f for folder in folders for f in folder.rglob("*.py") if ".venv" not in f.parts and f != COMPAT]
    beyond = {f"{f.relative_to(ROOT)}: {name}" for f in files for name in _mitmproxy_imports(f)
              if name not in DOCUMENTED}
    assert not beyond, f"reach mitmproxy's internals through clawr1/proxy/mitm_compat.py: {sorted(beyond)}"
    assert _mitmproxy_imports(COMPAT) - DOCUMENTED, "the compat module is where the internals are imported"
