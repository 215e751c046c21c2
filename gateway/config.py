"""What the gateway reads from ``Settings``: limits, delivery timing, idempotency bounds and its topics.

Role-specific knobs (``CLAWR1_GATEWAY_*`` / ``CLAWR1_IDEMPOTENCY_*``) are declared, with their defaults
and checks, in ``clawr1/core/registry.py``; each field names the variable it is read from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from clawr1.core import registry
from clawr1.core.settings import Settings, config_from, setting_field
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
    registry_url: str = setting_field(registry.SCHEMA_REGISTRY_URL)
    topic_partitions: int = setting_field(registry.TOPIC_PARTITIONS)
    api_keys: str = setting_field(registry.API_KEYS)
    max_request_bytes: int = setting_field(registry.MAX_REQUEST_BYTES)
    max_batch: int = setting_field(registry.MAX_BATCH_STEPS)
    # Messages produced but not yet acknowledged by the broker, over all requests: the memory bound.
    max_in_flight: int = setting_field(registry.GATEWAY_MAX_IN_FLIGHT)
    # librdkafka's message.timeout.ms: a message not acked by then fails, and the request gets a 503.
    delivery_timeout_s: float = setting_field(registry.GATEWAY_DELIVERY_TIMEOUT_S)
    idempotency_ttl_s: float = setting_field(registry.IDEMPOTENCY_TTL_S)
    idempotency_max_keys: int = setting_field(registry.IDEMPOTENCY_MAX_KEYS)
    idempotency_max_bytes: int = setting_field(registry.IDEMPOTENCY_MAX_BYTES)
    otlp_join_wait_s: float = setting_field(registry.OTLP_JOIN_WAIT_S)
    otlp_max_records: int = setting_field(registry.OTLP_MAX_RECORDS)
    otlp_join_ttl_s: float = setting_field(registry.OTLP_JOIN_TTL_S)
    otlp_join_max_bytes: int = setting_field(registry.OTLP_JOIN_MAX_BYTES)
    retry_after_s: int = 1
    # Backpressure (clawr1.core.backpressure): 429 while the worker's group is this far behind (0: never).
    max_lag_s: float = setting_field(registry.MAX_LAG_S)
    streams_group: str = setting_field(registry.STREAMS_APP_ID)

    @classmethod
    def from_settings(cls, settings: Settings) -> GatewayConfig:
        """The role variables' checks are the registry's; the two shared limits are checked here."""
        max_batch = _positive(settings.max_batch_steps, registry.MAX_BATCH_STEPS.name)
        return config_from(
            cls, settings, bootstrap=settings.bootstrap_servers, max_batch=max_batch,
            max_request_bytes=_positive(settings.max_request_bytes, registry.MAX_REQUEST_BYTES.name),
            # A whole batch must always fit, or a maximal batch could never be accepted.
            max_in_flight=max(max_batch, settings.role_setting(registry.GATEWAY_MAX_IN_FLIGHT)),
        )


_Number = TypeVar("_Number", int, float)


def _positive(value: _Number, name: str) -> _Number:
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value
