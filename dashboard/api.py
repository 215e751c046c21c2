"""HTTP face of the dashboard: the page, its assets and the JSON it polls, as one router.

The process that owns the pool mounts it beside the pool router::

    create_app(settings, routers=[pool_router(store), dashboard_router(store)])

The page is plain HTML + JavaScript shipped in ``dashboard/static`` (no build step, no external
assets). It links its assets and calls the API with relative URLs, so it also works when the API sits
behind a path prefix. Pool reads run in the thread pool: a chDB or HTTP query must not block the
event loop that also serves ingest.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from clawr1.consumer_sdk import ConsumerError
from clawr1.dashboard.curation import (
    MAX_CURATED_STEPS,
    PREVIEW_MAX_STEPS,
    CurateRequest,
    curation_feedback,
    preview_batch,
)
from clawr1.dashboard.decoding import TokenDecoder
from clawr1.dashboard.live import LiveBusy, LiveFeed, LiveLimits
from clawr1.dashboard.panels import Dashboard
from clawr1.gateway.app import INGESTS, caller_kinds, encode_items, gateway_state, publish
from clawr1.gateway.auth import ANONYMOUS
from clawr1.gateway.models import FeedbackIn
from clawr1.gateway.validation import parse_json
from clawr1.pool.store import PoolError, PoolStore

STATIC_DIR = Path(__file__).parent / "static"
_MEDIA_TYPES = {".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
ASSETS: dict[str, str] = {
    path.name: _MEDIA_TYPES[path.suffix]
    for path in sorted(STATIC_DIR.iterdir()) if path.suffix in _MEDIA_TYPES
}
"""The only files served under /dashboard/assets (the page's style and its ES modules), listed once at
import: no request can name another path."""

MAX_PAGE = 500
_NO_STORE = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}
# The page runs only its own script, talks only to its own origin and is never framed (clickjacking).
# Inline style attributes stay allowed: the charts size their bars with them.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_PAGE = {**_NO_STORE, "Content-Security-Policy": CONTENT_SECURITY_POLICY, "X-Frame-Options": "DENY",
         "Referrer-Policy": "no-referrer"}
# FastAPI's ``responses=`` type (keys are status codes or "default", values OpenAPI response objects).
_POOL_DOWN: dict[int | str, dict[str, Any]] = {
    503: {"description": "the pool could not answer (ClickHouse's error text)"}}


class StepsPage(BaseModel):
    """One page of the latest-steps table and its filters (``clawr1.dashboard.queries.STEP_FILTERS``)."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(50, ge=1, le=MAX_PAGE)
    offset: int = Field(0, ge=0, le=10**9)
    source_kind: str | None = None
    source_name: str | None = None
    trajectory_id: str | None = None
    prompt_group_id: str | None = None
    policy_version: int | None = Field(None, ge=-(2**63), le=2**63 - 1)
    status: str | None = None
    reward_status: str | None = None
    token_provenance: str | None = None
    ready: bool | None = None
    channel: str | None = None
    engine: str | None = None


class PreviewQuery(BaseModel):
    """Whose next batch to preview: a consumer group, its preset and how it polls."""

    model_config = ConfigDict(extra="forbid")

    group: str = Field(min_length=1, max_length=256)
    preset: str | None = Field(None, min_length=1, max_length=128)
    whole_groups: bool = True
    max_steps: int = Field(PREVIEW_MAX_STEPS, ge=1, le=PREVIEW_MAX_STEPS)
    max_groups: int | None = Field(None, ge=1, le=1000)
    policy_version: int | None = Field(None, ge=0, le=2**63 - 1)


_FEEDBACK = next(ingest for ingest in INGESTS if ingest.kind == "feedback")


async def _read(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return await run_in_threadpool(fn, *args)
    except PoolError as exc:
        raise HTTPException(503, f"the pool could not answer: {exc}") from exc


def _curation(raw: bytes) -> CurateRequest:
    """The body read as every route of the API reads JSON (``parse_json``: its nesting limit, no lone
    surrogate, no NaN), then checked: a lone surrogate in a filter reached the pool and was a 503."""
    try:
        return CurateRequest.model_validate(parse_json(raw))
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from exc


def _found(value: Any, missing: str) -> JSONResponse:
    """``value`` as the answer, or a 404 saying what is ``missing`` when the pool has none."""
    if value is None:
        raise HTTPException(404, missing)
    return JSONResponse(value, headers=_NO_STORE)


def dashboard_page_router() -> APIRouter:
    """The page and its assets. They hold no data, so they are served without a key; the page's
    requests for data carry the key the user gives it when the API asks for one."""
    router = APIRouter(tags=["dashboard"])

    @router.get("/dashboard", response_class=FileResponse, summary="The interactive dashboard page")
    async def page() -> FileResponse:
        return FileResponse(
            STATIC_DIR / "index.html", media_type="text/html; charset=utf-8", headers=_PAGE
        )

    @router.get(
        "/dashboard/assets/{name}",
        response_class=FileResponse,
        summary="The page's script and style",
        responses={404: {"description": "not one of the page's assets"}},
    )
    async def asset(name: str) -> FileResponse:
        media_type = ASSETS.get(name)
        if media_type is None:
            raise HTTPException(404, f"no dashboard asset {name!r}; assets: {', '.join(sorted(ASSETS))}")
        return FileResponse(STATIC_DIR / name, media_type=media_type, headers=_PAGE)

    return router


def dashboard_router(store: PoolStore, decoder: TokenDecoder | None = None,
                     live_limits: LiveLimits | None = None, engines_dir: Path | None = None) -> APIRouter:
    """The data routes over ``store``; a store of its own keeps refreshes from queuing behind the sink.
    ``decoder`` (``clawr1.dashboard.decoding.load_decoder``) lets the trajectory view show the text of
    the token ids that tokenizer made; ``live_limits``: how many live streams a key, and all keys, may
    hold open; ``engines_dir``: where the proxy keeps its engine table, to show the engines' state."""
    board = Dashboard(store, decoder, engines_dir)
    feed = LiveFeed(board.pulse, live_limits or LiveLimits())
    router = APIRouter(tags=["dashboard"])

    @router.get(
        "/v1/dashboard/summary",
        responses=_POOL_DOWN,
        summary="Every panel's data: collection, representation, curation, optimization, consumption",
    )
    async def summary() -> JSONResponse:
        return JSONResponse(await _read(board.summary), headers=_NO_STORE)

    @router.get(
        "/v1/dashboard/steps", responses=_POOL_DOWN, summary="The latest steps, newest first, one page"
    )
    async def steps(page: Annotated[StepsPage, Query()]) -> JSONResponse:
        filters = page.model_dump(exclude_none=True, exclude={"limit", "offset"})
        return JSONResponse(await _read(board.steps, filters, page.limit, page.offset), headers=_NO_STORE)

    @router.get(
        "/v1/dashboard/steps/{step_id:path}",
        summary="One step: prompt, response, tokens, reward, feedback",
        responses={404: {"description": "no step with this id"}, **_POOL_DOWN},
    )
    async def step(step_id: Annotated[str, PathParam(min_length=1, max_length=512)]) -> JSONResponse:
        return _found(await _read(board.step, step_id), f"no step with id {step_id!r}")

    @router.get(
        "/v1/dashboard/trajectories/{trajectory_id:path}",
        summary="A trajectory as its conversation: what each step added, replies, rewards, feedback, tokens",
        responses={404: {"description": "no trajectory with this id"}, **_POOL_DOWN},
    )
    async def trajectory(trajectory_id: Annotated[str, PathParam(min_length=1, max_length=512)]
                         ) -> JSONResponse:
        return _found(await _read(board.trajectory, trajectory_id),
                      f"no trajectory with id {trajectory_id!r}")

    @router.get(
        "/v1/dashboard/prompt-groups/{prompt_group_id:path}",
        summary="A prompt group's rollouts side by side and the prompt they share",
        responses={404: {"description": "no prompt group with this id"}, **_POOL_DOWN},
    )
    async def prompt_group(prompt_group_id: Annotated[str, PathParam(min_length=1, max_length=512)]
                           ) -> JSONResponse:
        return _found(await _read(board.prompt_group, prompt_group_id),
                      f"no prompt group with id {prompt_group_id!r}")

    @router.post(
        "/v1/dashboard/curate", status_code=202,
        summary="Label, grade, exclude or annotate rows or a whole filter, as audited feedback",
        responses={400: {"description": "not JSON as the API reads it"},
                   415: {"description": "not application/json"}, 422: {"description": "invalid curation"},
                   503: {"description": "Kafka or the pool unavailable"}},
        openapi_extra={"requestBody": {"required": True, "content": {
            "application/json": {"schema": CurateRequest.model_json_schema()}}}},
    )
    async def curate(request: Request) -> JSONResponse:
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            raise HTTPException(415, "send the curation as application/json")  # no cross-site form posts
        body = _curation(await request.body())
        step_ids = body.step_ids
        if body.filters is not None:
            try:
                filters = StepsPage(**body.filters).model_dump(exclude_none=True, exclude={"limit", "offset"})
                step_ids = await _read(board.curate_ids, filters, MAX_CURATED_STEPS)
            except (ValidationError, ValueError) as exc:
                raise HTTPException(422, str(exc)) from exc
        key = getattr(request.state, "api_key", None)
        items = [FeedbackIn(**item) for item in curation_feedback(body, step_ids)]
        state = gateway_state(request)
        messages, ids = encode_items(state, _FEEDBACK, items, key.name if key else ANONYMOUS,
                                     caller_kinds(request))
        if messages:
            await publish(state, messages)
        return JSONResponse({"steps": len(step_ids), "accepted": len(ids), "ids": ids,
                             "labels": body.labels_to_set()}, status_code=202, headers=_NO_STORE)

    @router.get(
        "/v1/dashboard/preview",
        responses={**_POOL_DOWN, 422: {"description": "unknown preset or bad filters"}},
        summary="The next poll of a consumer group (preset, whole groups), without committing it",
    )
    async def preview(query: Annotated[PreviewQuery, Query()]) -> JSONResponse:
        try:
            batch = await _read(preview_batch, store, query.group, query.preset, query.whole_groups,
                                query.max_steps, query.max_groups, query.policy_version)
        except ConsumerError as exc:
            raise HTTPException(422, str(exc)) from exc
        return JSONResponse(batch, headers=_NO_STORE)

    @router.get(
        "/v1/dashboard/tree",
        responses={404: {"description": "no such merge scope"}, **_POOL_DOWN},
        summary="A merge scope's prefix tree, packed ribbon, attention-mask thumbnail and savings",
    )
    async def tree(scope_kind: Literal["prompt_group", "trajectory"],
                   scope_id: Annotated[str, Query(min_length=1, max_length=512)]) -> JSONResponse:
        return _found(await _read(board.tree, scope_kind, scope_id),
                      f"no {scope_kind} scope {scope_id!r} in the pool")

    @router.get(
        "/v1/dashboard/live", response_class=StreamingResponse,
        summary="Server-Sent Events: a `pulse` whenever steps, feedback or commits change",
        responses={429: {"description": "the key's, or every key's, cap of open live streams is reached"}},
    )
    async def live(request: Request) -> StreamingResponse:
        """One pulse computation a second, whatever the number of streams (``clawr1.dashboard.live``)."""
        key = getattr(request.state, "api_key", None)
        try:
            events = feed.subscribe(key.name if key else ANONYMOUS)
        except LiveBusy as exc:
            raise HTTPException(429, str(exc)) from exc
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={**_NO_STORE, "X-Accel-Buffering": "no"})

    return router
