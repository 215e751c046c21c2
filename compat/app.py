"""The compat port's routes: the seed gateway's seven, with its JSON shapes and status codes.

Served by the API process beside the API (``clawr1 api --compat-port``), sharing its Kafka publisher,
validation and keys: steps and feedback reach Kafka exactly as through ``/v1/steps`` and
``/v1/feedback``. Errors answer in the seed's (FastAPI's) shape: ``{"detail": "<reason>"}``, or for
refused fields ``{"detail": [{"loc", "msg", "type"}]}``.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from typing import Annotated, Any
from urllib.parse import urlsplit

import httpx
from fastapi import Depends, FastAPI, HTTPException, Path, Query, Request, Response
from fastapi.exception_handlers import request_validation_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.responses import StreamingResponse

from clawr1.compat.engines import EngineFailed, EngineRefused, Engines, NoEngine, parse_engines
from clawr1.compat.models import (
    CompleteTrajectoryRequest,
    ComputeRewardRequest,
    ComputeRewardResponse,
    GenerateRequest,
    GenerateResponse,
    InitTrajectoryRequest,
    InitTrajectoryResponse,
    RegisterTrajectoryRequest,
    Status,
    SubmitStepsRequest,
    SubmitStepsResponse,
)
from clawr1.compat.registry import NotOwner, Registry
from clawr1.compat.relay import Relay, RelayFailed, RelayUnavailable
from clawr1.compat.steps import (
    EngineReplyError,
    Problem,
    Refused,
    Registration,
    completion_feedback,
    forward_headers,
    generate_payload,
    generate_response,
    policy_version_of,
    steps_in,
)
from clawr1.core.registry import (
    COMPAT_MAX_METADATA_BYTES,
    COMPAT_MAX_TRAJECTORIES,
    COMPAT_PUBLIC_URL,
    COMPAT_RESPONSE_LENGTH,
    COMPAT_TIMEOUT_S,
    REWARD_FN,
    SettingsError,
)
from clawr1.core.relay_source import SOURCE_HEADER, relay_secret, seal
from clawr1.core.settings import Settings
from clawr1.gateway.app import INGESTS, GatewayState, authorizer, encode_items, publish
from clawr1.gateway.docs import docs_router
from clawr1.gateway.errors import ApiError
from clawr1.gateway.hosts import LoopbackHostMiddleware
from clawr1.gateway.limits import BodyLimitMiddleware
from clawr1.gateway.metrics import RequestMetrics
from clawr1.gateway.models import Channel
from clawr1.gateway.validation import parse_json
from clawr1.rewards import RewardFn, RewardFnError, compute_reward, load_reward_fn

REWARD_FN_ENV = REWARD_FN.name
MAX_TRAJECTORIES_ENV = COMPAT_MAX_TRAJECTORIES.name
TIMEOUT_ENV = COMPAT_TIMEOUT_S.name
RESPONSE_LENGTH_ENV = COMPAT_RESPONSE_LENGTH.name
# The seed's agents call these under their base URL; each is relayed to the same path of the proxy.
AGENT_APIS = ("chat/completions", "completions", "responses", "messages")
_INGEST = {ingest.kind: ingest for ingest in INGESTS}

# Ids travel on as X-Claw headers and Kafka keys: visible ASCII only (no space, CR, LF, NUL or
# non-ASCII letters), at most 256 characters; a path id breaking this is a 400 naming it.
UID_PATTERN = "^[!-~]{1,256}$"
TrajectoryUid = Annotated[str, Path(pattern=UID_PATTERN, description="visible ASCII, 1 to 256 characters")]
PromptUid = Annotated[str, Path(pattern=UID_PATTERN, description="visible ASCII, 1 to 256 characters")]
_WILDCARD_HOSTS = {"", "0.0.0.0", "::", "[::]"}


def _detail(status: int, detail: Any, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


def _install_error_shape(app: FastAPI) -> None:
    """Our errors in the seed's shape (FastAPI's own 404/405/422 already are)."""

    async def on_api_error(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        return _detail(exc.status, exc.message, exc.headers)

    async def on_refused(_request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Refused)
        return _detail(422, [p.detail() for p in exc.problems])

    async def on_not_owner(_request: Request, exc: Exception) -> JSONResponse:
        return _detail(403, str(exc))

    async def on_invalid(request: Request, exc: Exception) -> Response:
        """A malformed id in the path is a bad request (400), not a body the route could not take."""
        assert isinstance(exc, RequestValidationError)
        errors = exc.errors()
        if errors and all(error["loc"][0] == "path" for error in errors):
            named = ", ".join(f"{error['loc'][-1]}: {error['msg']}" for error in errors)
            return _detail(400, f"malformed id in the path ({named}): ids are 1 to 256 visible ASCII "
                           "characters (no spaces, control characters or non-ASCII letters)")
        return await request_validation_exception_handler(request, exc)

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(Refused, on_refused)
    app.add_exception_handler(NotOwner, on_not_owner)
    app.add_exception_handler(RequestValidationError, on_invalid)


class _BoundedJsonRequest(Request):
    """JSON bodies parsed as on the API (``parse_json``: the same nesting limit, no NaN), so the compat
    port takes no document the API would refuse (Python's own parser went ~900 levels deep)."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            try:
                self._json = parse_json(await self.body())
            except ApiError as exc:
                raise HTTPException(exc.status, exc.message) from exc
        return self._json


class _BoundedJsonRoute(APIRoute):
    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def bounded(request: Request) -> Response:
            return await handler(_BoundedJsonRequest(request.scope, request.receive))

        return bounded


class Compat:
    """What the routes share: the API's gateway state, registrations, the relay, engines, reward fn."""

    def __init__(self, settings: Settings, gateway: GatewayState, client: httpx.AsyncClient,
                 registry: Registry, reward_fn: RewardFn | None) -> None:
        self.settings = settings
        self.gateway = gateway
        self.registry = registry
        self.relay = Relay(settings, client)
        self.engines = Engines(parse_engines(settings.upstream), client)
        self.reward_fn = reward_fn
        response_length = settings.role_setting(COMPAT_RESPONSE_LENGTH)
        self.max_tokens = response_length or None
        self.max_metadata_bytes = settings.role_setting(COMPAT_MAX_METADATA_BYTES)
        self.public_url = public_url(settings)
        self.relay_secret = relay_secret(settings)

    async def publish(self, kind: str, items: list[Any], source_name: str) -> int:
        messages, ids = encode_items(self.gateway, _INGEST[kind], items, source_name)
        if messages:
            await publish(self.gateway, messages)
        return len(ids)


def public_url(settings: Settings) -> str:
    """Where agents reach this port: ``CLAWR1_COMPAT_PUBLIC_URL``, else the listening address (loopback
    for a wildcard one). Never the request's ``Host``, which the caller chooses and the agent then trusts."""
    configured = settings.role_setting(COMPAT_PUBLIC_URL).strip().rstrip("/")
    if configured:
        parts = urlsplit(configured)
        if parts.scheme not in {"http", "https"} or not parts.hostname or parts.query or parts.fragment:
            raise SettingsError(f"{COMPAT_PUBLIC_URL.name} must be http(s)://host[:port][/prefix], "
                                f"got {configured!r}")
        return configured
    host = settings.api_host.strip("[]")
    host = "127.0.0.1" if host in _WILDCARD_HOSTS else f"[{host}]" if ":" in host else host
    return f"http://{host}:{settings.compat_port}"


def _metadata_bytes(metadata: Any) -> int:
    return len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode())


def _routes(app: FastAPI, compat: Callable[[], Compat], keys_dependency: Any) -> None:
    auth = Depends(keys_dependency)

    @app.post("/init_trajectory", response_model=InitTrajectoryResponse, tags=["black-box"])
    async def init_trajectory(body: InitTrajectoryRequest | None = None,
                              source: str = auth) -> InitTrajectoryResponse:
        """A new trajectory, owned by the calling key, and its base URL (under ``CLAWR1_COMPAT_PUBLIC_URL``).
        The seed's agents put their GRPO group (prompt uid) in the path; without one the trajectory is its
        own group (never a shared placeholder)."""
        state = compat()
        trajectory_uid = uuid.uuid4().hex
        prompt_uid = (body.prompt_uid if body else None) or trajectory_uid
        state.registry.claim(trajectory_uid, source)
        return InitTrajectoryResponse(trajectory_uid=trajectory_uid,
                                      base_url=f"{state.public_url}/{trajectory_uid}/{prompt_uid}/v1")

    @app.post("/{trajectory_uid}/{prompt_uid}/v1/register_trajectory", response_model=Status,
              tags=["black-box"])
    async def register_trajectory(trajectory_uid: TrajectoryUid, prompt_uid: PromptUid,
                                  body: RegisterTrajectoryRequest | None = None,
                                  source: str = auth) -> Status:
        """Channel, policy version (``metadata.policy_version``) and metadata for the trajectory's calls;
        only the key that owns the trajectory may set them."""
        state = compat()
        body = body or RegisterTrajectoryRequest()
        limit = state.max_metadata_bytes
        if body.metadata is not None and (size := _metadata_bytes(body.metadata)) > limit:
            raise ApiError(413, "metadata_too_large", f"the metadata is {size} bytes of compact JSON, over "
                           f"the limit of {limit} ({COMPAT_MAX_METADATA_BYTES.name})")
        try:
            version = policy_version_of(body.metadata)
        except ValueError as exc:
            raise Refused([Problem(("body", "metadata", "policy_version"), str(exc), "int_type")]) from exc
        state.registry.register(trajectory_uid, Registration(body.channel, version, body.metadata), source)
        return Status()

    @app.post("/{trajectory_uid}/{prompt_uid}/v1/complete_trajectory", response_model=Status,
              tags=["black-box"])
    async def complete_trajectory(trajectory_uid: TrajectoryUid, prompt_uid: PromptUid,
                                  body: CompleteTrajectoryRequest | None = None,
                                  source: str = auth) -> Status:
        """The episode is over: its last step becomes terminal and its reward the trajectory's final
        reward (one trajectory feedback). Only the key that owns the trajectory may complete it."""
        state = compat()
        state.registry.claim(trajectory_uid, source)
        reward = body.reward if body is not None else None
        await state.publish("feedback", [completion_feedback(trajectory_uid, reward)], source)
        return Status()

    async def relay(request: Request, trajectory_uid: str, prompt_uid: str, api: str,
                    source: str) -> StreamingResponse:
        state = compat()
        headers = forward_headers(request.headers.items(), trajectory_uid, prompt_uid,
                                  state.registry.claim(trajectory_uid, source),
                                  drop_authorization=state.gateway.keys.enabled)
        headers.append((SOURCE_HEADER, seal(state.relay_secret, source, trajectory_uid)))
        try:
            return await state.relay.forward(f"/v1/{api}", request.url.query, headers, await request.body())
        except RelayUnavailable as exc:
            raise ApiError(503, "relay_unavailable", str(exc)) from exc
        except RelayFailed as exc:
            raise ApiError(502, "relay_failed", str(exc)) from exc

    for api in AGENT_APIS:
        def bind(api: str) -> Callable[..., Any]:
            async def agent_call(request: Request, trajectory_uid: TrajectoryUid, prompt_uid: PromptUid,
                                 source: str = auth) -> StreamingResponse:
                return await relay(request, trajectory_uid, prompt_uid, api, source)

            agent_call.__name__ = "relay_" + api.replace("/", "_")
            agent_call.__doc__ = f"The agent's /v1/{api} call, captured by the proxy with the path's ids."
            return agent_call

        app.add_api_route(f"/{{trajectory_uid}}/{{prompt_uid}}/v1/{api}", bind(api), methods=["POST"],
                          tags=["black-box"], response_class=StreamingResponse)

    @app.post("/submit_steps", response_model=SubmitStepsResponse, tags=["white-box"])
    async def submit_steps(body: SubmitStepsRequest, source: str = auth,
                           channel: Annotated[Channel, Query()] = "train") -> SubmitStepsResponse:
        """The seed's steps as white-box steps; answered once Kafka acknowledged them all."""
        state = compat()
        limit = state.gateway.config.max_batch
        if len(body.steps) > limit:
            raise ApiError(413, "batch_too_large", f"a batch of {len(body.steps)} steps exceeds the limit "
                           f"of {limit} (max_batch_steps)")
        steps = await asyncio.to_thread(steps_in, body.steps, channel)
        for trajectory_id in dict.fromkeys(step.trajectory_id for step in steps):
            state.registry.claim(trajectory_id, source)
        return SubmitStepsResponse(accepted=await state.publish("steps", steps, source))

    @app.post("/generate", response_model=GenerateResponse, tags=["white-box"])
    async def generate(body: GenerateRequest, _source: str = auth) -> GenerateResponse:
        """One completion of a token-id prompt with the engine's own ids (and logprobs when asked)."""
        state = compat()
        for name in ("image_data", "video_data"):
            if getattr(body, name):
                raise Refused([Problem(("body", name), "multi-modal input is not supported: /generate sends "
                                       "the token-id prompt to the engine's /v1/completions", "unsupported")])
        try:
            reply = await state.engines.complete(generate_payload(body, state.max_tokens))
            return generate_response(reply, want_logprobs=bool(body.sampling_params.get("logprobs")))
        except NoEngine as exc:
            raise ApiError(503, "no_engine", str(exc)) from exc
        except EngineRefused as exc:
            raise ApiError(exc.status, "engine_error", str(exc)) from exc
        except (EngineFailed, EngineReplyError) as exc:
            raise ApiError(502, "engine_failed", str(exc)) from exc

    @app.post("/compute_reward", response_model=ComputeRewardResponse, tags=["reward"])
    async def compute_reward_route(body: ComputeRewardRequest, _source: str = auth) -> ComputeRewardResponse:
        """``CLAWR1_REWARD_FN`` called with the request's fields as keyword arguments."""
        fn = compat().reward_fn
        if fn is None:
            raise ApiError(503, "no_reward_fn", f"no reward function is configured: set {REWARD_FN_ENV}="
                           "module:function in the API process's environment")
        fields = body.model_dump(exclude={"multi_modal_data"})
        if body.multi_modal_data is not None:
            fields["multi_modal_data"] = body.multi_modal_data
        try:
            result = await asyncio.to_thread(compute_reward, fn, **fields)
        except RewardFnError as exc:
            raise ApiError(500, "reward_fn_failed", str(exc)) from exc
        return ComputeRewardResponse(reward_score=result.score, reward_extra_info=result.extra)


def create_compat_app(settings: Settings, gateway: GatewayState) -> FastAPI:
    """The compat app over the API app's ``gateway`` state (its publisher exists while the API runs).
    A ``CLAWR1_REWARD_FN`` that cannot be loaded fails here, at start-up, not on the first call."""
    spec = settings.role_setting(REWARD_FN)
    reward_fn = load_reward_fn(spec) if spec else None
    parse_engines(settings.upstream)  # a malformed CLAWR1_UPSTREAM fails at start-up too
    public_url(settings)  # and so does a malformed CLAWR1_COMPAT_PUBLIC_URL
    holder: dict[str, Compat] = {}

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        timeout = settings.role_setting(COMPAT_TIMEOUT_S)
        registry = Registry(settings.data_dir.resolve() / "compat" / "registrations.sqlite3",
                            settings.role_setting(COMPAT_MAX_TRAJECTORIES))
        client = httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), trust_env=False,
                                   limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100))
        holder["compat"] = Compat(settings, gateway, client, registry, reward_fn)
        try:
            yield
        finally:
            holder.clear()
            await client.aclose()
            registry.close()

    def compat() -> Compat:
        return holder["compat"]

    app = FastAPI(title="Claw-R1 compat port", version="1", lifespan=lifespan,
                  description="The seed Claw-R1 gateway's protocol; see docs/compat.md.", docs_url=None,
                  redoc_url=None, telemetry={"tracing": False, "metrics": False, "logs": False})
    app.router.route_class = _BoundedJsonRoute
    app.state.gateway = gateway  # clawr1.gateway.server.serve checks the bind against its keys
    _install_error_shape(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=gateway.config.max_request_bytes)
    if not gateway.keys.enabled:
        app.add_middleware(LoopbackHostMiddleware)
    _routes(app, compat, authorizer(gateway.keys))
    app.include_router(docs_router(app.title))
    app.add_middleware(RequestMetrics, app_name="compat")  # served on the API port's /metrics
    return app
