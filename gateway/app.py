"""The stack's API process: ingest routes under /v1, /healthz, /openapi.json, plus routers others mount.

``create_app`` builds everything but connects to nothing: the Kafka producer is created in the
lifespan, so importing or building the app is free and a test can build many.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Header, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from clawr1.core.backpressure import PipelineLag
from clawr1.core.envelopes import by_partition, fit, halved
from clawr1.core.settings import Settings
from clawr1.core.topics import RAW_EVENTS, RAW_FEEDBACK, RAW_STEPS
from clawr1.gateway.auth import (
    ANONYMOUS,
    INGEST_KINDS,
    KINDS,
    ROUTE_KINDS,
    FeedbackRefused,
    KeyRing,
    feedback_standing,
    parse_api_keys,
)
from clawr1.gateway.config import GatewayConfig, GatewayTopics
from clawr1.gateway.docs import docs_router
from clawr1.gateway.errors import ApiError, ErrorBody, install_error_handlers
from clawr1.gateway.fastpath import fits_schema, pack_body
from clawr1.gateway.hosts import LoopbackHostMiddleware
from clawr1.gateway.idempotency import IdempotencyConflict, IdempotencyStore
from clawr1.gateway.limits import BodyLimitMiddleware
from clawr1.gateway.models import EVENT_TURN_RULE, Accepted, EventIn, FeedbackIn, Health, StepIn, TurnPayload
from clawr1.gateway.otlp.join import ContentJoin
from clawr1.gateway.otlp.routes import OtlpIngest, otlp_router
from clawr1.gateway.publisher import KafkaPublisher, KafkaUnavailable, OutMessage, RecordTooLarge
from clawr1.gateway.records import Outgoing, curation_only, event_record, feedback_record, step_record
from clawr1.gateway.validation import (
    Check,
    check_event,
    check_feedback,
    check_step,
    parse_json,
    validate_items,
)
from clawr1.schemas.codec import AvroCodec, EncodeError, codec_for, pack_record

log = logging.getLogger(__name__)

# Each part: True when healthy, False when not (yet), or why it is not (a stuck worker's lag, say).
Readiness = Callable[[], dict[str, bool | str]]


@dataclass(frozen=True)
class Ingest:
    """One submission route: what it parses, how it becomes a record and where that goes."""

    kind: str
    model: type[BaseModel]
    check: Check
    to_record: Callable[[Any, str, int], Outgoing]
    schema: str
    summary: str

    def topic(self, topics: GatewayTopics) -> str:
        return str(getattr(topics, self.kind))


INGESTS = (
    Ingest("steps", StepIn, check_step, step_record, RAW_STEPS.schema,
           "Submit white-box steps (one object or a batch)"),
    Ingest("feedback", FeedbackIn, check_feedback, feedback_record, RAW_FEEDBACK.schema,
           "Submit rewards and human feedback for steps, responses or trajectories"),
    Ingest("events", EventIn, check_event, event_record, RAW_EVENTS.schema,
           "Submit live events from black-box services (turns, tool results, user actions)"),
)


@dataclass
class GatewayState:
    config: GatewayConfig
    topics: GatewayTopics
    keys: KeyRing
    idempotency: IdempotencyStore
    codec: AvroCodec
    readiness: Readiness | None
    publisher: KafkaPublisher | None = None
    # The stream worker's lag, sampled while the app runs (None: CLAWR1_MAX_LAG_S is 0).
    backpressure: PipelineLag | None = None
    # Plain white-box steps skip the per-step models (False: the schema is not the one it fills).
    fast_steps: bool = False


def gateway_state(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


_bearer = HTTPBearer(auto_error=False, description="an API key from CLAWR1_API_KEYS (when keys are set)")


def authorizer(keys: KeyRing) -> Callable[..., Any]:
    """Dependency answering the caller's source name once its key may use the matched route
    (``ROUTE_KINDS``; a route missing there is refused to every key). The key is left in
    ``request.state.api_key`` for routes that narrow further (a consume key's own groups). Without
    keys it asks for no credentials, so the published spec declares no security either."""

    async def anonymous() -> str:
        return ANONYMOUS

    async def authenticate(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> str:
        challenge = {"WWW-Authenticate": "Bearer"}
        if credentials is None:
            raise ApiError(401, "unauthorized", "send an API key as `Authorization: Bearer <key>`",
                           headers=challenge)
        key = keys.identify(credentials.credentials)
        if key is None:
            raise ApiError(401, "unauthorized", "the API key is not valid", headers=challenge)
        path = request.scope["route"].path_format
        allowed = ROUTE_KINDS.get(path, frozenset())
        if not key.kinds & allowed:
            needs = f"a key of kind {' or '.join(sorted(allowed))}" if allowed else "a route in ROUTE_KINDS"
            raise ApiError(403, "forbidden",
                           f"the API key of {key.name!r} may not use {path}: it needs {needs}")
        request.state.api_key = key
        return key.name

    return authenticate if keys.enabled else anonymous


def _require_json(request: Request) -> None:
    media = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
    if media != "application/json" and not media.endswith("+json"):
        raise ApiError(415, "unsupported_media_type",
                       f"send the body as application/json (got {media or 'no Content-Type'})")


def admit(state: GatewayState) -> None:
    """429 with Retry-After while the pipeline is behind past ``CLAWR1_MAX_LAG_S``: the caller keeps the
    work and sends it later, instead of the lag and the freshness of what is taken growing without bound."""
    if state.backpressure is None:
        return
    verdict = state.backpressure.verdict()
    if verdict.closed:
        raise ApiError(429, "pipeline_behind", verdict.reason(state.backpressure.bound_s),
                       headers={"Retry-After": str(verdict.retry_after_s)})


def _unavailable(message: str, retry_after_s: int) -> ApiError:
    return ApiError(503, "kafka_unavailable", message, headers={"Retry-After": str(retry_after_s)})


# Bodies above this are parsed and encoded in a worker thread, so one 1000-step batch does not
# hold the event loop (health checks, delivery reports, small requests) for its whole parse.
_INLINE_BODY_BYTES = 64 * 1024


def _encode(state: GatewayState, ingest: Ingest, raw: bytes, source_name: str,
            kinds: frozenset[str]) -> tuple[list[OutMessage], list[str]]:
    """Validate the body and turn it into Kafka messages with their ids; ``ApiError`` on bad input."""
    if ingest.kind == "steps" and state.fast_steps:
        fast = _encode_fast(state, raw, source_name)
        if fast is not None:
            return fast
    items = validate_items(parse_json(raw), ingest.model, ingest.check, state.config.max_batch)
    return encode_items(state, ingest, items, source_name, kinds)


def _encode_fast(state: GatewayState, raw: bytes,
                 source_name: str) -> tuple[list[OutMessage], list[str]] | None:
    """The steps of a plain body through ``clawr1.gateway.fastpath``; None: the model path decides
    (any refusal, its reasons, and anything unusual)."""
    steps = pack_body(raw, source_name, int(time.time() * 1000), state.config.max_batch)
    if steps is None:
        return None
    messages = envelopes(state, state.topics.steps, RAW_STEPS.schema, [(s.key, s.record) for s in steps])
    return messages, [s.step_id for s in steps]


def encode_items(state: GatewayState, ingest: Ingest, items: Sequence[Any], source_name: str,
                 kinds: frozenset[str] = INGEST_KINDS) -> tuple[list[OutMessage], list[str]]:
    """Validated items as Kafka messages with their ids (also the compat port's and the dashboard's way
    in). ``kinds``: the sending key's, which decide what feedback it may send and where it counts."""
    received_at_ms = int(time.time() * 1000)
    if ingest.kind == "feedback":
        outgoing = [feedback_record(item, source_name, received_at_ms,
                                    _standing(kinds, source_name, item, index, len(items)))
                    for index, item in enumerate(items)]
    else:
        outgoing = [ingest.to_record(item, source_name, received_at_ms) for item in items]
    try:
        packed = [(o.key, pack_record(ingest.schema, o.record)) for o in outgoing]
    except (TypeError, OverflowError) as exc:
        raise ApiError(422, "invalid_request",
                       f"record does not match schema {ingest.schema!r}: {exc}") from exc
    return envelopes(state, ingest.topic(state.topics), ingest.schema, packed), [o.id for o in outgoing]


def _standing(kinds: frozenset[str], source_name: str, item: Any, index: int, count: int) -> bool:
    """The item's ``privileged`` (``feedback_standing``); 403 naming the item when the key may not send it."""
    try:
        return feedback_standing(kinds, labelled=item.label is not None, curation_only=curation_only(item))
    except FeedbackRefused as exc:
        which = f"item {index} of this feedback" if count > 1 else "this feedback"
        message = f"the API key of {source_name!r} may not send {which}: {exc}"
        raise ApiError(403, "forbidden", message) from exc


def caller_kinds(request: Request) -> frozenset[str]:
    """The kinds of the key ``authorizer`` admitted; every kind without keys (as today: keyless is local)."""
    key = getattr(request.state, "api_key", None)
    return KINDS if key is None else frozenset(key.kinds)


def envelopes(state: GatewayState, topic: str, schema: str,
              keyed: Sequence[tuple[str, dict[str, Any]]]) -> list[OutMessage]:
    """Packed records (with their Kafka keys) as one envelope per partition of ``topic``, each cut to
    fit Kafka's message size (``clawr1.core.envelopes``); 503 until the topics' partitions are known."""
    if not keyed:
        return []
    if state.publisher is None:
        raise _unavailable("the gateway is starting or stopping", state.config.retry_after_s)
    try:
        partitions = state.publisher.partitions_of(topic)
    except KafkaUnavailable as exc:
        raise _unavailable(str(exc), state.config.retry_after_s) from exc
    encode = partial(_encode_batch, state.codec, schema)
    return [OutMessage(topic, None, value, partition, tuple(records), schema)
            for partition, group in sorted(by_partition(keyed, partitions).items())
            for records, value in fit(group, encode)]


def _encode_batch(codec: AvroCodec, schema: str, records: Sequence[dict[str, Any]]) -> bytes:
    try:
        return codec.encode_batch(schema, list(records))
    except EncodeError as exc:
        raise ApiError(422, "invalid_request", str(exc)) from exc


async def _produce(state: GatewayState, ingest: Ingest, raw: bytes, source_name: str,
                   kinds: frozenset[str]) -> bytes:
    if len(raw) > _INLINE_BODY_BYTES:
        messages, ids = await asyncio.to_thread(_encode, state, ingest, raw, source_name, kinds)
    else:
        messages, ids = _encode(state, ingest, raw, source_name, kinds)
    await publish(state, messages)
    return Accepted(accepted=len(ids), ids=ids).model_dump_json().encode()


async def publish(state: GatewayState, messages: list[OutMessage]) -> None:
    """Produce and wait for the broker's acknowledgement of every message; ``ApiError`` (503, 413)
    when it cannot, 429 while the pipeline is behind (``admit``). An envelope Kafka finds too large is
    sent again in smaller ones: only a record too large on its own is a 413."""
    config = state.config
    admit(state)
    if state.publisher is None:
        raise _unavailable("the gateway is starting or stopping", config.retry_after_s)
    while messages:
        try:
            await state.publisher.publish(messages)
            return
        except KafkaUnavailable as exc:
            raise _unavailable(str(exc), config.retry_after_s) from exc
        except RecordTooLarge as exc:
            messages = _smaller(state, exc)


def _smaller(state: GatewayState, refused: RecordTooLarge) -> list[OutMessage]:
    """The envelopes Kafka refused as too large, each cut in smaller ones; the others of the request
    were acknowledged. ``ApiError``: 413 when one holds a single record, 503 when something else failed
    as well (the client's retry sends the request again)."""
    smaller: list[OutMessage] = []
    for message in refused.messages:
        pieces = halved(message.records, len(message.value),
                        partial(_encode_batch, state.codec, message.schema)) if message.records else None
        if pieces is None:
            raise ApiError(413, "record_too_large", str(refused))
        smaller += [replace(message, value=value, records=tuple(records)) for records, value in pieces]
    if refused.others:
        raise _unavailable(str(refused.others[0]), state.config.retry_after_s)
    return smaller


async def accept(request: Request, ingest: Ingest, source_name: str, idempotency_key: str | None) -> Response:
    """Validate, produce, and answer 202 once Kafka acknowledged; replay the answer for a reused key."""
    state = gateway_state(request)
    admit(state)  # before the body is parsed: refusing costs next to nothing
    _require_json(request)
    raw = await request.body()
    scope = (source_name, ingest.kind, idempotency_key) if idempotency_key else None
    if scope is not None:
        try:
            replay = state.idempotency.claim(scope, hashlib.sha256(raw).hexdigest())
        except IdempotencyConflict as conflict:
            if conflict.reason == "in_flight":
                raise ApiError(409, "idempotency_in_flight", "a request with this Idempotency-Key is still "
                               "running; retry later", headers={"Retry-After": "1"}) from conflict
            raise ApiError(422, "idempotency_mismatch",
                           "this Idempotency-Key was used with a different request body") from conflict
        if replay is not None:
            return Response(replay, 202, media_type="application/json",
                            headers={"Idempotent-Replayed": "true"})
    try:
        body = await _produce(state, ingest, raw, source_name, caller_kinds(request))
    except BaseException:
        if scope is not None:
            state.idempotency.abandon(scope)
        raise
    if scope is not None:
        state.idempotency.finish(scope, body)
    return Response(body, 202, media_type="application/json")


_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in {
        400: "malformed JSON", 401: "missing or invalid API key",
        403: "the key's kinds do not grant this route (or, for feedback, this item)",
        409: "the same Idempotency-Key is still in flight", 413: "body, batch or record too large",
        415: "not application/json", 422: "invalid fields (each named with its reason)",
        429: "the pipeline is behind past CLAWR1_MAX_LAG_S: retry after Retry-After seconds",
        503: "Kafka unavailable or overloaded: retry after Retry-After seconds",
    }.items()
}


def _body_schema(model: type[BaseModel], max_batch: int) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"oneOf": [ref, {"type": "array", "items": ref, "minItems": 1, "maxItems": max_batch}]}


def ingest_router(max_batch: int, keys: KeyRing) -> APIRouter:
    router = APIRouter(prefix="/v1", tags=["ingest"])
    for ingest in INGESTS:
        router.add_api_route(
            f"/{ingest.kind}", _endpoint(ingest, keys), methods=["POST"], status_code=202,
            response_model=Accepted, responses=_ERRORS, summary=ingest.summary,
            openapi_extra={"requestBody": {"required": True, "content": {
                "application/json": {"schema": _body_schema(ingest.model, max_batch)}}}},
        )
    return router


_IDEMPOTENCY_KEY = Header(
    None, alias="Idempotency-Key", min_length=1, max_length=255,
    description="makes a retry a no-op: the same key and body get the first answer back")


def _endpoint(ingest: Ingest, keys: KeyRing) -> Callable[..., Any]:
    authenticated = Depends(authorizer(keys))

    async def endpoint(request: Request, source_name: str = authenticated,
                       idempotency_key: str | None = _IDEMPOTENCY_KEY) -> Response:
        return await accept(request, ingest, source_name, idempotency_key)

    endpoint.__name__ = f"submit_{ingest.kind}"
    return endpoint


async def healthz(request: Request) -> JSONResponse:
    """200 only when Kafka is ready and every part the stack registered says ready."""
    state = gateway_state(request)
    parts = {"kafka": state.publisher is not None and await state.publisher.ready()}
    problems: dict[str, str] = {}
    if state.readiness is not None:
        try:
            for name, ok in state.readiness().items():
                parts[name] = ok is True
                if isinstance(ok, str):
                    problems[name] = ok
        except Exception:
            log.exception("readiness check failed")
            parts["readiness"] = False
    ready = all(parts.values())
    body = Health(status="ok" if ready else "unavailable", parts=parts, problems=problems)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


def _install_openapi(app: FastAPI, models: Sequence[type[BaseModel]]) -> None:
    """Publish the body models the ingest routes parse themselves (see ``accept``)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            for model in models:
                model_schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                components.update(model_schema.pop("$defs", {}))
                components[model.__name__] = model_schema
            components[EventIn.__name__].update(EVENT_TURN_RULE)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings, *, routers: Sequence[APIRouter] = (), readiness: Readiness | None = None,
               public_routers: Sequence[APIRouter] = (),
               topics: GatewayTopics | None = None,
               producer_overrides: dict[str, Any] | None = None,
               pipeline: Mapping[str, Sequence[str]] | None = None) -> FastAPI:
    """The whole API app. With keys set, the routes of ``routers`` need a key of a kind ``ROUTE_KINDS``
    grants them; ``public_routers`` serve no data (the dashboard's page). Without keys only loopback
    ``Host`` names are answered. ``topics`` renames the raw topics (tests); ``producer_overrides`` go
    to librdkafka as they are. ``pipeline``: the consumer groups a step passes through, with their input
    topics, whose lag the backpressure bounds (default: the stream worker's on the raw topics)."""
    config = GatewayConfig.from_settings(settings)
    state = GatewayState(
        config=config,
        topics=topics or GatewayTopics(),
        keys=parse_api_keys(config.api_keys),
        idempotency=IdempotencyStore(config.idempotency_ttl_s, config.idempotency_max_keys,
                                     config.idempotency_max_bytes),
        codec=codec_for(config.registry_url),
        readiness=readiness,
    )
    state.fast_steps = fits_schema()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        publisher = KafkaPublisher(
            config.bootstrap, state.topics.names(), partitions=config.topic_partitions,
            max_in_flight=config.max_in_flight, delivery_timeout_s=config.delivery_timeout_s,
            producer_overrides=producer_overrides)
        await publisher.start()
        state.publisher = publisher
        if config.max_lag_s > 0:
            stages = pipeline or {config.streams_group: state.topics.raw()}
            state.backpressure = PipelineLag(config.bootstrap, stages, config.max_lag_s).start()
        try:
            yield
        finally:
            state.publisher = None
            if state.backpressure is not None:
                await asyncio.to_thread(state.backpressure.stop)
                state.backpressure = None
            otlp.close()
            await publisher.close()

    app = FastAPI(title="Claw-R1 API", version="1",
                  description="Ingest of white-box steps, feedback and service events into Kafka.",
                  lifespan=lifespan, openapi_url="/openapi.json", docs_url=None, redoc_url=None,
                  # No OpenTelemetry is set up in the stack; FastAPI's probe for it costs ~0.2 ms a request.
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.gateway = state
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=config.max_request_bytes)
    if not state.keys.enabled:
        app.add_middleware(LoopbackHostMiddleware)  # outermost: a rebinding page gets nothing, not even 413
    app.include_router(ingest_router(config.max_batch, state.keys))
    join = ContentJoin(config.otlp_join_ttl_s, config.otlp_join_max_bytes)
    otlp = OtlpIngest(lambda messages: publish(state, messages), state.codec, state.topics.events,
                      RAW_EVENTS.schema, config.max_request_bytes, config.max_batch, config.otlp_join_wait_s,
                      max_records=config.otlp_max_records, join=join, admit=partial(admit, state))
    app.include_router(otlp_router(otlp, authorizer(state.keys)))
    app.add_api_route("/healthz", healthz, methods=["GET"], response_model=Health, tags=["health"],
                      responses={503: {"model": Health, "description": "a part is not ready"}})
    # Mounted routers (pool SQL and inserts, dashboard data): with keys set, each route's ROUTE_KINDS.
    for router in routers:
        app.include_router(router, dependencies=[Depends(authorizer(state.keys))])
    for router in public_routers:
        app.include_router(router)
    app.include_router(docs_router(app.title))  # Swagger UI from this process, never a CDN
    _install_openapi(app, [StepIn, FeedbackIn, EventIn, TurnPayload])
    return app
