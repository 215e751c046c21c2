"""What the gateway reads from ``Settings``: limits, delivery timing, idempotency bounds and its topics.

Role-specific knobs are read with ``Settings.role_setting``
(``CLAWR1_GATEWAY_*`` / ``CLAWR1_IDEMPOTENCY_*`` environment variables) with local defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeVar

from clawr1.core.settings import Settings
from clawr1.core.topics import RAW_EVENTS, RAW_FEEDBACK, RAW_STEPS

MAX_IN_FLIGHT_ENV = "CLAWR1_GATEWAY_MAX_IN_FLIGHT"
DELIVERY_TIMEOUT_ENV = "CLAWR1_GATEWAY_DELIVERY_TIMEOUT_S"
IDEMPOTENCY_TTL_ENV = "CLAWR1_IDEMPOTENCY_TTL_S"
IDEMPOTENCY_MAX_KEYS_ENV = "CLAWR1_IDEMPOTENCY_MAX_KEYS"
IDEMPOTENCY_MAX_BYTES_ENV = "CLAWR1_IDEMPOTENCY_MAX_BYTES"


@dataclass(frozen=True)
class GatewayTopics:
    """Where each kind of submission goes; tests and side-by-side stacks override the names."""

    steps: str = RAW_STEPS.name
    feedback: str = RAW_FEEDBACK.name
    events: str = RAW_EVENTS.name

    def names(self) -> list[str]:
        return [self.steps, self.feedback, self.events]


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
    retry_after_s: int = 1

    @classmethod
    def from_settings(cls, settings: Settings) -> GatewayConfig:
        max_batch = _positive(settings.max_batch_steps, "CLAWR1_MAX_BATCH_STEPS")
        return cls(
            bootstrap=settings.bootstrap_servers,
            registry_url=settings.schema_registry_url,
            topic_partitions=settings.topic_partitions,
            api_keys=settings.api_keys,
            max_request_bytes=_positive(settings.max_request_bytes, "CLAWR1_MAX_REQUEST_BYTES"),
            max_batch=max_batch,
            # A whole batch must always fit, or a maximal batch could never be accepted.
            max_in_flight=max(max_batch, _knob(settings, MAX_IN_FLIGHT_ENV, 20_000)),
            delivery_timeout_s=_knob(settings, DELIVERY_TIMEOUT_ENV, 15.0),
            idempotency_ttl_s=_knob(settings, IDEMPOTENCY_TTL_ENV, 3600.0),
            idempotency_max_keys=_knob(settings, IDEMPOTENCY_MAX_KEYS_ENV, 100_000),
            idempotency_max_bytes=_knob(settings, IDEMPOTENCY_MAX_BYTES_ENV, 64 * 1024 * 1024),
        )


_Number = TypeVar("_Number", int, float)


def _positive(value: _Number, name: str) -> _Number:
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _knob(settings: Settings, name: str, default: _Number) -> _Number:
    return _positive(settings.role_setting(name, default), name)
