"""The compat port's routes: the seed gateway's seven, with its JSON shapes and status codes.

Served by the API process beside the API (``clawr1 api --compat-port``), sharing its Kafka publisher,
validation and keys: steps and feedback reach Kafka exactly as through ``/v1/steps`` and
``/v1/feedback``. Errors answer in the seed's (FastAPI's) shape: ``{"detail": "<reason>"}``, or for
refused fields ``{"detail": [{"loc", "msg", "type"}]}``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Annotated, Any

import httpx
from fastapi import Depends, FastAPI, Path, Query, Request
from fastapi.responses import JSONResponse
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
from clawr1.compat.registry import Registry
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
from clawr1.core.registry import COMPAT_MAX_TRAJECTORIES, COMPAT_RESPONSE_LENGTH, COMPAT_TIMEOUT_S, REWARD_FN
from clawr1.core.settings import Settings
from clawr1.gateway.app import INGESTS, GatewayState, authorizer, encode_items, publish
from clawr1.gateway.errors import ApiError
from clawr1.gateway.hosts import LoopbackHostMiddleware
from clawr1.gateway.limits import BodyLimitMiddleware
from clawr1.gateway.metrics import RequestMetrics
from clawr1.gateway.models import Channel
from clawr1.rewards import RewardFn, RewardFnError, compute_reward, load_reward_fn

REWARD_FN_ENV = REWARD_FN.name
MAX_TRAJECTORIES_ENV = COMPAT_MAX_TRAJECTORIES.name
TIMEOUT_ENV = COMPAT_TIMEOUT_S.name
RESPONSE_LENGTH_ENV = COMPAT_RESPONSE_LENGTH.name
# The seed's agents call these under their base URL; each is relayed to the same path of the proxy.
AGENT_APIS = ("chat/completions", "completions", "responses", "messages")
_INGEST = {ingest.kind: ingest for ingest in INGESTS}

TrajectoryUid = Annotated[str, Path(min_length=1, max_length=256)]
PromptUid = Annotated[str, Path(min_length=1, max_length=256)]


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

    app.add_exception_handler(ApiError, on_api_error)
    app.add_exception_handler(Refused, on_refused)


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

    async def publish(self, kind: str, items: list[Any], source_name: str) -> int:
        messages, ids = encode_items(self.gateway, _INGEST[kind], items, source_name)
        if messages:
            await publish(self.gateway, messages)
        return len(ids)


def _base_url(request: Request, settings: Settings, trajectory_uid: str, prompt_uid: str) -> str:
    """The per-trajectory base URL on the host and port the client reached (the seed's rule: a
    listen address like 0.0.0.0 is no destination)."""
    host = request.headers.get("host") or f"{settings.api_host}:{settings.compat_port}"
    return f"{request.url.scheme}://{host}/{trajectory_uid}/{prompt_uid}/v1"


def _routes(app: FastAPI, compat: Callable[[], Compat], keys_dependency: Any) -> None:
    auth = Depends(keys_dependency)

    @app.post("/init_trajectory", response_model=InitTrajectoryResponse, tags=["black-box"])
    async def init_trajectory(request: Request, body: InitTrajectoryRequest | None = None,
                              _source: str = auth) -> InitTrajectoryResponse:
        """A new trajectory and its base URL. The seed's agents put their GRPO group (prompt uid) in
        the path; without one the trajectory is its own group (never a shared placeholder)."""
        trajectory_uid = uuid.uuid4().hex
        prompt_uid = (body.prompt_uid if body else None) or trajectory_uid
        base_url = _base_url(request, compat().settings, trajectory_uid, prompt_uid)
        return InitTrajectoryResponse(trajectory_uid=trajectory_uid, base_url=base_url)

    @app.post("/{trajectory_uid}/{prompt_uid}/v1/register_trajectory", response_model=Status,
              tags=["black-box"])
    async def register_trajectory(trajectory_uid: TrajectoryUid, prompt_uid: PromptUid,
                                  body: RegisterTrajectoryRequest | None = None,
                                  _source: str = auth) -> Status:
        """Channel, policy version (``metadata.policy_version``) and metadata for the trajectory's calls."""
        body = body or RegisterTrajectoryRequest()
        try:
            version = policy_version_of(body.metadata)
        except ValueError as exc:
            raise Refused([Problem(("body", "metadata", "policy_version"), str(exc), "int_type")]) from exc
        compat().registry.register(trajectory_uid, Registration(body.channel, version, body.metadata))
        return Status()

    @app.post("/{trajectory_uid}/{prompt_uid}/v1/complete_trajectory", response_model=Status,
              tags=["black-box"])
    async def complete_trajectory(trajectory_uid: TrajectoryUid, prompt_uid: PromptUid,
                                  body: CompleteTrajectoryRequest | None = None,
                                  source: str = auth) -> Status:
        """The episode is over: its last step becomes terminal and its reward the trajectory's final
        reward (one trajectory feedback)."""
        state = compat()
        reward = body.reward if body is not None else None
        await state.publish("feedback", [completion_feedback(trajectory_uid, reward)], source)
        state.registry.forget(trajectory_uid)
        return Status()

    async def relay(request: Request, trajectory_uid: str, prompt_uid: str, api: str) -> StreamingResponse:
        state = compat()
        headers = forward_headers(request.headers.items(), trajectory_uid, prompt_uid,
                                  state.registry.get(trajectory_uid),
                                  drop_authorization=state.gateway.keys.enabled)
        try:
            return await state.relay.forward(f"/v1/{api}", request.url.query, headers, await request.body())
        except RelayUnavailable as exc:
            raise ApiError(503, "relay_unavailable", str(exc)) from exc
        except RelayFailed as exc:
            raise ApiError(502, "relay_failed", str(exc)) from exc

    for api in AGENT_APIS:
        def bind(api: str) -> Callable[..., Any]:
            async def agent_call(request: Request, trajectory_uid: TrajectoryUid, prompt_uid: PromptUid,
                                 _source: str = auth) -> StreamingResponse:
                return await relay(request, trajectory_uid, prompt_uid, api)

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
                  description="The seed Claw-R1 gateway's protocol; see docs/compat.md.",
                  telemetry={"tracing": False, "metrics": False, "logs": False})
    app.state.gateway = gateway  # clawr1.gateway.server.serve checks the bind against its keys
    _install_error_shape(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=gateway.config.max_request_bytes)
    if not gateway.keys.enabled:
        app.add_middleware(LoopbackHostMiddleware)
    _routes(app, compat, authorizer(gateway.keys))
    app.add_middleware(RequestMetrics, app_name="compat")  # served on the API port's /metrics
    return app
