"""Every use of mitmproxy beyond its documented addon API, in one place, pinned by a test.

mitmproxy documents its event hooks and the objects they get (``mitmproxy.http``, ``mitmproxy.connection``,
the hook data of ``mitmproxy.proxy.server_hooks``), its options and its ``ctx``. The capture proxy needs
more, and takes it only here:

- an embedded master with just the addons its two modes need (``capture_master``): ``default_addons()``
  would load thirty, scripting and playback among them; the ones kept are mitmproxy's own addon classes,
  in mitmproxy's order;
- several proxy processes on one port (``listen_with_reuse_port``): mitmproxy 11 has no option for
  SO_REUSEPORT, so its TCP listener ``AsyncioServerInstance.listen`` is replaced;
- whether every mode listens, and closing the listeners on the way out (``listen_failures``,
  ``stop_listening``): the proxyserver addon's ``servers``;
- proxy authentication that reads ``Proxy-Authorization`` in reverse mode too (``proxy_auth_header_class``):
  the proxyauth addon with its ``authenticate_http`` overridden, through that module's helpers;
- mitmproxy's content decoder (``decode_content``) and its CA store (``ca_store``, one CA per data dir).

The master this module assembles is run and shut down by ``clawr1.proxy.runner`` (``Master.run``,
``Master.shutdown``, pinned here too).

``tests/unit/proxy/test_proxy_mitm_compat.py`` checks that every name in ``PINNED`` exists in the
installed mitmproxy and that the replaced or overridden callables in ``SIGNATURES`` keep their parameters,
so an upgrade that renames or reshapes one fails there, naming it; and that no other module of the
project imports mitmproxy beyond its documented modules.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mitmproxy.net import encoding

from clawr1.core.pins import Pin

if TYPE_CHECKING:
    from mitmproxy import options
    from mitmproxy.master import Master

# (module, attribute path) this module relies on; see the module doc.
PINNED: tuple[Pin, ...] = (
    ("mitmproxy.addons.core", "Core"),
    ("mitmproxy.addons.strip_dns_https_records", "StripDnsHttpsRecords"),
    ("mitmproxy.addons.disable_h2c", "DisableH2C"),
    ("mitmproxy.addons.proxyserver", "Proxyserver.servers"),
    ("mitmproxy.addons.proxyserver", "Servers.update"),
    ("mitmproxy.addons.dns_resolver", "DnsResolver"),
    ("mitmproxy.addons.next_layer", "NextLayer"),
    ("mitmproxy.addons.tlsconfig", "TlsConfig"),
    ("mitmproxy.addons.update_alt_svc", "UpdateAltSvc"),
    ("mitmproxy.addons.proxyauth", "ProxyAuth.validator"),
    ("mitmproxy.addons.proxyauth", "ProxyAuth.authenticate_http"),
    ("mitmproxy.addons.proxyauth", "parse_http_basic_auth"),
    ("mitmproxy.addons.proxyauth", "make_auth_required_response"),
    ("mitmproxy.proxy.mode_servers", "AsyncioServerInstance.listen"),
    ("mitmproxy.proxy.mode_servers", "AsyncioServerInstance.handle_stream"),
    ("mitmproxy.proxy.mode_servers", "ServerInstance.is_running"),
    ("mitmproxy.proxy.mode_servers", "ServerInstance.last_exception"),
    ("mitmproxy.proxy.mode_specs", "ProxyMode.full_spec"),
    ("mitmproxy.net.encoding", "decode"),
    ("mitmproxy.certs", "CertStore.from_store"),
    ("mitmproxy.master", "Master.run"),
    ("mitmproxy.master", "Master.shutdown"),
)

# Callables replaced or overridden here, or called with positional arguments: their leading parameters.
SIGNATURES: dict[Pin, tuple[str, ...]] = {
    ("mitmproxy.proxy.mode_servers", "AsyncioServerInstance.listen"): ("self", "host", "port"),
    ("mitmproxy.proxy.mode_servers", "ServerInstance.__init__"): ("self", "mode"),
    ("mitmproxy.addons.proxyauth", "ProxyAuth.authenticate_http"): ("self", "f"),
    ("mitmproxy.addons.proxyauth", "parse_http_basic_auth"): ("s",),
    ("mitmproxy.addons.proxyauth", "make_auth_required_response"): ("is_proxy",),
    ("mitmproxy.net.encoding", "decode"): ("encoded", "encoding"),
    ("mitmproxy.certs", "CertStore.from_store"): ("path", "basename", "key_size"),
}

# mitmproxy's master and addons are imported by the functions that use them: the emitter process imports
# this module for ``decode_content`` only, and loading the proxy there would cost it 0.3 s and 700 modules.


def capture_master(opts: options.Options, guards: Sequence[object], addons: Sequence[object]) -> Master:
    """A master with mitmproxy's addons for the explicit and reverse modes, authentication by
    ``Proxy-Authorization`` in both (``ProxyAuthHeader``); ``guards`` run before the proxy server's
    hooks, ``addons`` after mitmproxy's own."""
    from mitmproxy.addons import (
        core,
        disable_h2c,
        dns_resolver,
        next_layer,
        proxyserver,
        strip_dns_https_records,
        tlsconfig,
        update_alt_svc,
    )
    from mitmproxy.master import Master

    master = Master(opts)
    master.addons.add(
        core.Core(),
        strip_dns_https_records.StripDnsHttpsRecords(),
        disable_h2c.DisableH2C(),
        proxy_auth_header_class()(),
        *guards,
        proxyserver.Proxyserver(),
        dns_resolver.DnsResolver(),
        next_layer.NextLayer(),
        tlsconfig.TlsConfig(),
        update_alt_svc.UpdateAltSvc(),
        *addons,
    )
    return master


def listen_failures(master: Master) -> list[str]:
    """``mode: reason`` for each mode not listening (once the proxy server has tried them all)."""
    servers = master.addons.get("proxyserver").servers
    return [f"{s.mode.full_spec}: {s.last_exception or 'not listening'}" for s in servers if not s.is_running]


async def stop_listening(master: Master) -> None:
    """Close every listener (mitmproxy's own shutdown leaves them to the event loop's end)."""
    await master.addons.get("proxyserver").servers.update([])


def listen_with_reuse_port() -> None:
    """Replace mitmproxy's TCP listener by one that sets SO_REUSEPORT, in this process only (never
    with one process, so a second proxy on a taken port still fails)."""

    from mitmproxy.proxy.mode_servers import AsyncioServerInstance

    async def listen(self: AsyncioServerInstance[Any], host: str, port: int) -> list[asyncio.Server]:
        return [await asyncio.start_server(self.handle_stream, host, port, reuse_port=True)]

    AsyncioServerInstance.listen = listen  # type: ignore[method-assign,assignment]


def ca_store(directory: Path, basename: str, key_size: int) -> None:
    """Create the CA in ``directory`` unless it is there (``<basename>-ca-cert.pem`` and its key)."""
    from mitmproxy.certs import CertStore

    CertStore.from_store(directory, basename, key_size)


def decode_content(body: bytes, content_encoding: str) -> bytes:
    """A body as sent (gzip, deflate, br, zstd, identity), decoded; ValueError when it is not (also for
    a text codec named as the encoding, e.g. "utf-8", which mitmproxy decodes to str)."""
    decoded = encoding.decode(body, content_encoding)
    if not isinstance(decoded, bytes):
        raise ValueError(f"{content_encoding!r} is not a content encoding")
    return decoded


@functools.cache
def proxy_auth_header_class() -> type:
    """The proxyauth addon, reading ``Proxy-Authorization`` in reverse mode too (made on first use, as the
    addon's module loads all of mitmproxy's addons).

    The stock addon authenticates reverse-proxy clients with ``Authorization``, which is where the
    agent's API key travels to the upstream; here every mode uses ``Proxy-Authorization`` (agents on
    the base URL send it as a default header), so the key passes through untouched.
    """
    from mitmproxy import http
    from mitmproxy.addons import proxyauth

    class ProxyAuthHeader(proxyauth.ProxyAuth):
        def authenticate_http(self, f: http.HTTPFlow) -> bool:
            assert self.validator
            credentials = f.request.headers.get("Proxy-Authorization", "")
            try:
                _, user, password = proxyauth.parse_http_basic_auth(credentials)
                valid = self.validator(user, password)
            except ValueError:
                valid = False
            if valid:
                f.metadata["proxyauth"] = (user, password)
                del f.request.headers["Proxy-Authorization"]
                return True
            f.response = proxyauth.make_auth_required_response(is_proxy=True)
            return False

    return ProxyAuthHeader
