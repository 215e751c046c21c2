"""Proxy authentication that leaves the agent's ``Authorization`` header alone in every mode."""

from __future__ import annotations

from mitmproxy import http
from mitmproxy.addons import proxyauth


class ProxyAuthHeader(proxyauth.ProxyAuth):
    """mitmproxy's proxyauth, reading ``Proxy-Authorization`` in reverse mode too.

    The stock addon authenticates reverse-proxy clients with ``Authorization``, which is where the
    agent's API key travels to the upstream; here every mode uses ``Proxy-Authorization`` (agents on
    the base URL send it as a default header), so the key passes through untouched.
    """

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
