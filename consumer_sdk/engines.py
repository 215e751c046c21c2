"""The capture proxy's engine routes, for a trainer that updates the policy's weights while agents run::

    from clawr1.consumer_sdk import EngineControl

    with EngineControl("http://127.0.0.1:8081") as engines:   # the proxy's reverse port
        for row in engines.list():
            engines.drain(row["engine"])          # no new calls; returns once its calls are done
            ...                                   # load the new weights into that engine
            engines.resume(row["engine"], policy_version=7)

Steps the engine serves after ``resume`` carry that policy version. The key (``api_key``, else
``CLAWR1_API_KEY``) needs the ``operate`` kind when the stack has keys; ``proxy_authorization`` is the
``Proxy-Authorization`` value when the proxy requires proxy authentication. See docs/proxy.md.
"""

from __future__ import annotations

import os
from types import TracebackType
from typing import Any

import httpx

from clawr1.consumer_sdk.errors import PoolRequestError, PoolUnavailable
from clawr1.consumer_sdk.transport import API_KEY_ENV, reason_of

DRAIN_TIMEOUT_S = 60.0


class EngineControl:
    def __init__(self, proxy_url: str, api_key: str | None = None, proxy_authorization: str | None = None,
                 timeout: float = 30.0) -> None:
        api_key = api_key or os.environ.get(API_KEY_ENV) or None
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        if proxy_authorization:
            headers["Proxy-Authorization"] = proxy_authorization
        self._url = proxy_url.rstrip("/")
        self._http = httpx.Client(base_url=self._url, headers=headers, timeout=timeout, trust_env=False)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None,
              timeout: float | None = None) -> Any:
        try:
            reply = self._http.request(method, path, json=body,
                                       timeout=timeout if timeout is not None else httpx.USE_CLIENT_DEFAULT)
        except httpx.TransportError as exc:
            raise PoolUnavailable(f"the capture proxy at {self._url} did not answer: {exc!r}") from exc
        if not reply.is_success:
            raise PoolRequestError(f"the capture proxy refused {method} {path} with HTTP "
                                   f"{reply.status_code}: {reason_of(reply)}", status=reply.status_code)
        return reply.json()

    def list(self) -> list[dict[str, Any]]:
        """Each engine: ``engine``, ``state`` (serving, draining, out), ``in_flight``, ``served``,
        ``failures``, ``policy_version``, ``rollouts``."""
        return list(self._call("GET", "/v1/engines")["engines"])

    def drain(self, engine: str, timeout_s: float = DRAIN_TIMEOUT_S) -> dict[str, Any]:
        """Stop new calls to ``engine``; answers once its calls in flight are done (``drained`` true) or
        after ``timeout_s`` with ``in_flight`` saying how many remain."""
        return dict(self._call("POST", "/v1/engines/drain", {"engine": engine, "timeout_s": timeout_s},
                               timeout=timeout_s + 30.0))

    def resume(self, engine: str, policy_version: int | None = None) -> dict[str, Any]:
        """``engine`` serves again; with ``policy_version``, its later steps carry that version."""
        body = {"engine": engine, "policy_version": policy_version}
        return dict(self._call("POST", "/v1/engines/resume", body))

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> EngineControl:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()
