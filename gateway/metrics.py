"""The API process's Prometheus face: ``GET /metrics`` and the per-route request counter.

The gateway, pool SQL, dashboard, sink and compat port share the API process, so one route serves
all their metrics (``clawr1.core.metrics``). With API keys set it needs a ``read`` key (it shows traffic
and pool sizes, as the dashboard does); without keys it is served on loopback like every route.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from clawr1.core.metrics import HTTP_REQUESTS

UNMATCHED = "unmatched"


def metrics_router() -> APIRouter:
    router = APIRouter(tags=["metrics"])

    @router.get("/metrics", response_class=Response,
                responses={200: {"content": {CONTENT_TYPE_LATEST: {}},
                                 "description": "Prometheus text exposition format"}})
    async def metrics() -> Response:
        """Every metric of the API process (gateway, pool, sink, compat), for Prometheus to scrape."""
        return Response(await run_in_threadpool(generate_latest, REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return router


class RequestMetrics:
    """Counts answered requests by route template (not path: ids would make unbounded series) and
    status; requests no route matched share one ``unmatched`` label."""

    def __init__(self, app: ASGIApp, app_name: str) -> None:
        self.app = app
        self.app_name = app_name

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            HTTP_REQUESTS.labels(app=self.app_name, route=getattr(route, "path_format", UNMATCHED),
                                 status=str(status)).inc()
