"""One settings object for every Claw-R1 process, read from ``CLAWR1_*`` environment variables.

Every process (CLI, proxy, gateway, workers, sink, SDK) reads the same names, so a docker-compose
service and a local ``clawr1 up`` differ only in environment, never in code.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TypeVar

ENV_PREFIX = "CLAWR1_"
T = TypeVar("T", str, int, float, bool)


def _as_bool(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a boolean: {value!r}")


@dataclass(frozen=True)
class Settings:
    """Settings shared by all roles; each field maps to ``CLAWR1_<FIELD NAME IN CAPS>``."""

    data_dir: Path = Path(".clawr1")
    # Empty means: the local stack starts its own broker on kafka_port.
    kafka_bootstrap: str = ""
    kafka_port: int = 9092
    kafka_heap: str = "512m"
    # Empty means: the embedded chDB pool under data_dir.
    clickhouse_dsn: str = ""
    # Analyst SQL on a ClickHouse server: a DSN of the read-only user (pool/server/); empty = the pool DSN.
    sql_dsn: str = ""
    schema_registry_url: str = ""
    api_host: str = "127.0.0.1"
    api_port: int = 8000
    # The seed Claw-R1 gateway's protocol, served by the API process (compat/); 0 = off.
    compat_port: int = 8100
    proxy_host: str = "127.0.0.1"
    proxy_port: int = 8080
    reverse_port: int = 0
    upstream: str = ""
    proxy_auth: str = ""
    capture_token_ids: bool = False
    # Upstreams (host or host:port, comma-separated, * for all) that accept token-id fields;
    # empty means: the reverse-mode upstream.
    token_id_hosts: str = ""
    api_keys: str = ""
    max_request_bytes: int = 4 * 1024 * 1024
    max_batch_steps: int = 1000
    tokenizer: str = ""
    topic_partitions: int = 4
    # Prometheus metrics (clawr1/core/metrics.py): the API process serves GET /metrics; the other roles
    # serve a port each on metrics_host (0 = off).
    metrics_host: str = "127.0.0.1"
    proxy_metrics_port: int = 0
    worker_metrics_port: int = 0
    sink_metrics_port: int = 0
    rewarder_metrics_port: int = 0
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def bootstrap_servers(self) -> str:
        return self.kafka_bootstrap or f"127.0.0.1:{self.kafka_port}"

    @property
    def manages_kafka(self) -> bool:
        """True when the local stack must start its own broker."""
        return not self.kafka_bootstrap

    @property
    def pool_dsn(self) -> str:
        if self.clickhouse_dsn:
            return self.clickhouse_dsn
        return f"chdb://{(self.data_dir / 'pool').resolve()}"

    @property
    def is_embedded_pool(self) -> bool:
        return self.pool_dsn.startswith("chdb://")

    def role_setting(self, name: str, default: T) -> T:
        """A role's own ``CLAWR1_*`` variable (gateway, sink, worker, proxy tuning), kept in ``extra``
        and parsed like its default; a malformed value fails fast with the variable's name."""
        raw = self.extra.get(name, "")
        if raw == "":
            return default
        try:
            if isinstance(default, bool):
                return _as_bool(raw)
            if isinstance(default, int):
                return int(raw)
            if isinstance(default, float):
                return float(raw)
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from exc
        return raw  # type: ignore[return-value]

    def with_overrides(self, **overrides: object) -> Settings:
        """Apply CLI flags on top of the environment; ``None`` means the flag was not given."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if "data_dir" in given:
            given["data_dir"] = Path(str(given["data_dir"]))
        return replace(self, **given)  # type: ignore[arg-type]


def env_names() -> dict[str, str]:
    """Environment variable name for each setting, for docs and the docker-compose check."""
    return {f.name: ENV_PREFIX + f.name.upper() for f in fields(Settings) if f.name != "extra"}


def load_settings(environ: dict[str, str] | None = None) -> Settings:
    """Read settings from the environment; a malformed value fails fast with the variable's name."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    for f in fields(Settings):
        if f.name == "extra":
            continue
        name = ENV_PREFIX + f.name.upper()
        raw = env.get(name)
        if raw is None:
            continue
        try:
            if f.type in ("int", int):
                values[f.name] = int(raw)
            elif f.type in ("bool", bool):
                values[f.name] = _as_bool(raw)
            elif f.type in ("Path", Path):
                values[f.name] = Path(raw)
            else:
                values[f.name] = raw
        except ValueError as exc:
            raise ValueError(f"{name}: {exc}") from exc
    known = set(env_names().values())
    extra = {k: v for k, v in env.items() if k.startswith(ENV_PREFIX) and k not in known}
    return Settings(**values, extra=extra)  # type: ignore[arg-type]


def settings_to_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a child process load exactly these settings."""
    env: dict[str, str] = {}
    for name, var in env_names().items():
        value = getattr(settings, name)
        if isinstance(value, bool):
            env[var] = "true" if value else "false"
        elif isinstance(value, Path):
            env[var] = str(value.resolve())
        else:
            env[var] = str(value)
    return env
