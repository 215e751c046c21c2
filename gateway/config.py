"""What the gateway reads from ``Settings``: limits, delivery timing, idempotency bounds and its topics.

Role-specific knobs (``CLAWR1_GATEWAY_*`` / ``CLAWR1_IDEMPOTENCY_*``) are declared, with their defaults
and checks, in ``clawr1/core/registry.py`` and read with ``Settings.role_setting``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from clawr1.core import registry
from clawr1.core.settings import Settings
from clawr1.core.topics import RAW_EVENTS, RAW_FEEDBACK, RAW_LLM, RAW_STEPS

# The variables' names, for tests that set them in ``Settings.extra``.
MAX_IN_FLIGHT_ENV = registry.GATEWAY_MAX_IN_FLIGHT.name
DELIVERY_TIMEOUT_ENV = registry.GATEWAY_DELIVERY_TIMEOUT_S.name
IDEMPOTENCY_TTL_ENV = registry.IDEMPOTENCY_TTL_S.name
IDEMPOTENCY_MAX_KEYS_ENV = registry.IDEMPOTENCY_MAX_KEYS.name
IDEMPOTENCY_MAX_BYTES_ENV = registry.IDEMPOTENCY_MAX_BYTES.name


@dataclass(frozen=True)
class GatewayTopics:
    """Where each kind of submission goes; tests and side-by-side stacks override the names."""

    steps: str = RAW_STEPS.name
    feedback: str = RAW_FEEDBACK.name
    events: str = RAW_EVENTS.name
    llm: str = RAW_LLM.name  # the proxy's: not written here, but watched for the pipeline's lag

    def names(self) -> list[str]:
        """The topics the gateway writes."""
        return [self.steps, self.feedback, self.events]

    def raw(self) -> list[str]:
        """Every raw topic the stream worker reads: how far behind it is there is the pipeline's lag."""
        return [*self.names(), self.llm]


@dataclass(frozen=True)
class GatewayConfig:
    bootstrap: str
    registry_url: str
    topic_partitions: int
    api_keys: str
    max_request_bytes: int
    max_batch: int
    # Messages produced but not yet acknowledged by the broker, over all requests: the memory bound.
    max_in_flight: int
    # librdkafka's message.timeout.ms: a message not acked by then fails, and the request gets a 503.
    delivery_timeout_s: float
    idempotency_ttl_s: float
    idempotency_max_keys: int
    idempotency_max_bytes: int
    otlp_join_wait_s: float = registry.OTLP_JOIN_WAIT_S.default
    otlp_max_records: int = registry.OTLP_MAX_RECORDS.default
    otlp_join_ttl_s: float = registry.OTLP_JOIN_TTL_S.default
    otlp_join_max_bytes: int = registry.OTLP_JOIN_MAX_BYTES.default
    retry_after_s: int = 1
    # Backpressure (clawr1.core.backpressure): 429 while the worker's group is this far behind (0: never).
    max_lag_s: float = registry.MAX_LAG_S.default
    streams_group: str = registry.STREAMS_APP_ID.default

    @classmethod
    def from_settings(cls, settings: Settings) -> GatewayConfig:
        max_batch = _positive(settings.max_batch_steps, registry.MAX_BATCH_STEPS.name)
        knob = settings.role_setting  # the registry checks that each of these is positive
        return cls(
            bootstrap=settings.bootstrap_servers,
            registry_url=settings.schema_registry_url,
            topic_partitions=settings.topic_partitions,
            api_keys=settings.api_keys,
            max_request_bytes=_positive(settings.max_request_bytes, registry.MAX_REQUEST_BYTES.name),
            max_batch=max_batch,
            # A whole batch must always fit, or a maximal batch could never be accepted.
            max_in_flight=max(max_batch, knob(registry.GATEWAY_MAX_IN_FLIGHT)),
            delivery_timeout_s=knob(registry.GATEWAY_DELIVERY_TIMEOUT_S),
            idempotency_ttl_s=knob(registry.IDEMPOTENCY_TTL_S),
            idempotency_max_keys=knob(registry.IDEMPOTENCY_MAX_KEYS),
            idempotency_max_bytes=knob(registry.IDEMPOTENCY_MAX_BYTES),
            otlp_join_wait_s=knob(registry.OTLP_JOIN_WAIT_S),
            max_lag_s=knob(registry.MAX_LAG_S),
            streams_group=knob(registry.STREAMS_APP_ID),
            otlp_max_records=knob(registry.OTLP_MAX_RECORDS),
            otlp_join_ttl_s=knob(registry.OTLP_JOIN_TTL_S),
            otlp_join_max_bytes=knob(registry.OTLP_JOIN_MAX_BYTES),
        )


_Number = TypeVar("_Number", int, float)


def _positive(value: _Number, name: str) -> _Number:
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value
