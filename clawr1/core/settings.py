"""One settings object for every Claw-R1 process, read from ``CLAWR1_*`` environment variables.

Every process (CLI, proxy, gateway, workers, sink, SDK) reads the same names, so a docker-compose
service and a local ``clawr1 up`` differ only in environment, never in code. Each variable is declared
once in ``clawr1/core/registry.py`` (type, default, help, check, roles); the shared ones are the fields
below, a role's own ones are read with ``settings.role_setting(OPTION)``. An unknown ``CLAWR1_*`` name
is refused by ``load_settings``.

A role's config is a dataclass whose fields name their variable once, ``batch_rows: int =
setting_field(SINK_BATCH_ROWS)`` (the default is the declaration's), and ``config_from(SinkConfig,
settings)`` reads them all; what is derived otherwise (a bootstrap list, a parsed rule) is passed by name.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, overload

from clawr1.core import registry as r
from clawr1.core.registry import (
    ENV_PREFIX,
    REGISTRY,
    Option,
    SettingsError,
    UnknownSettingError,
    check_environment,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = [
    "ENV_PREFIX", "Option", "Settings", "SettingsError", "UnknownSettingError", "T", "check_environment",
    "config_from", "effective_settings", "env_names", "load_settings", "local_kafka_ports", "setting_field",
    "settings_to_env",
]

T = TypeVar("T", str, int, float, bool, Path)
R = TypeVar("R")
C = TypeVar("C", bound="DataclassInstance")
# The key of a config field's metadata that names its variable (and how its value is converted).
_SETTING = "clawr1.setting"


@dataclass(frozen=True)
class Settings:
    """Settings shared by all roles; each field maps to ``CLAWR1_<FIELD NAME IN CAPS>`` (see the registry
    for their help); ``extra`` holds the role variables that were set, read with ``role_setting``."""

    data_dir: Path = r.DATA_DIR.default
    # Empty means: the local stack starts its own broker on kafka_port.
    kafka_bootstrap: str = r.KAFKA_BOOTSTRAP.default
    kafka_port: int = r.KAFKA_PORT.default
    kafka_heap: str = r.KAFKA_HEAP.default
    kafka_nodes: int = r.KAFKA_NODES.default
    # Empty means: the embedded chDB pool under data_dir.
    clickhouse_dsn: str = r.CLICKHOUSE_DSN.default
    # A ClickHouse cluster (server DSN only): migrations create the pool on every node of it.
    clickhouse_cluster: str = r.CLICKHOUSE_CLUSTER.default
    # Analyst SQL on a ClickHouse server: a DSN of the read-only user (pool/server/); empty = the pool DSN.
    sql_dsn: str = r.SQL_DSN.default
    schema_registry_url: str = r.SCHEMA_REGISTRY_URL.default
    api_host: str = r.API_HOST.default
    api_port: int = r.API_PORT.default
    # The seed Claw-R1 gateway's protocol, served by the API process (compat/); 0 = off.
    compat_port: int = r.COMPAT_PORT.default
    proxy_host: str = r.PROXY_HOST.default
    proxy_port: int = r.PROXY_PORT.default
    reverse_port: int = r.REVERSE_PORT.default
    upstream: str = r.UPSTREAM.default
    proxy_auth: str = r.PROXY_AUTH.default
    capture_token_ids: bool = r.CAPTURE_TOKEN_IDS.default
    # Upstreams (host or host:port, comma-separated, * for all) that accept token-id fields;
    # empty means: the reverse-mode upstream.
    token_id_hosts: str = r.TOKEN_ID_HOSTS.default
    api_keys: str = r.API_KEYS.default
    max_request_bytes: int = r.MAX_REQUEST_BYTES.default
    max_batch_steps: int = r.MAX_BATCH_STEPS.default
    tokenizer: str = r.TOKENIZER.default
    topic_partitions: int = r.TOPIC_PARTITIONS.default
    # Prometheus metrics (clawr1/core/metrics.py): the API process serves GET /metrics; the other roles
    # serve a port each on metrics_host (0 = off).
    metrics_host: str = r.METRICS_HOST.default
    proxy_metrics_port: int = r.PROXY_METRICS_PORT.default
    worker_metrics_port: int = r.WORKER_METRICS_PORT.default
    sink_metrics_port: int = r.SINK_METRICS_PORT.default
    rewarder_metrics_port: int = r.REWARDER_METRICS_PORT.default
    extra: dict[str, str] = field(default_factory=dict, compare=False)

    @property
    def bootstrap_servers(self) -> str:
        """The external bootstrap, else every broker the local stack starts."""
        return self.kafka_bootstrap or ",".join(
            f"127.0.0.1:{port}" for port in local_kafka_ports(self.kafka_port, self.kafka_nodes))

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

    def role_setting(self, option: Option[T]) -> T:
        """A role's own variable (gateway, sink, worker, proxy tuning), typed and checked by its
        declaration; unset or empty means its default; a malformed value raises SettingsError naming it."""
        return option.read(self.extra)

    def with_overrides(self, **overrides: object) -> Settings:
        """Apply CLI flags on top of the environment; ``None`` means the flag was not given."""
        given = {k: v for k, v in overrides.items() if v is not None}
        if "data_dir" in given:
            given["data_dir"] = Path(str(given["data_dir"]))
        declared = _shared_by_field()
        for name, value in given.items():  # a flag is checked as its variable is (e.g. --kafka-nodes 0)
            declared[name].validate(value)
        return replace(self, **given)  # type: ignore[arg-type]


def local_kafka_ports(port: int, nodes: int) -> list[int]:
    """The brokers' ports of a local cluster (``broker/launcher.py``): ``port`` and the ones after it."""
    return [port + i for i in range(nodes)]


def _shared_by_field() -> dict[str, Option[Any]]:
    return {o.field: o for o in r.shared_options()}


def env_names() -> dict[str, str]:
    """Environment variable name for each ``Settings`` field (``registry.REGISTRY`` has every name)."""
    return {f.name: ENV_PREFIX + f.name.upper() for f in fields(Settings) if f.name != "extra"}


def load_settings(environ: Mapping[str, str] | None = None) -> Settings:
    """Read settings from the environment. An unknown ``CLAWR1_*`` name, or a malformed or out-of-range
    value, raises SettingsError (a ValueError) naming the variable."""
    env = os.environ if environ is None else environ
    check_environment(env)
    values: dict[str, object] = {}
    for name, declared in _shared_by_field().items():
        raw = env.get(declared.name)
        if raw is not None:
            values[name] = declared.parse(raw)
    extra = {k: v for k, v in env.items() if k in REGISTRY and not REGISTRY[k].shared}
    return Settings(**values, extra=extra)  # type: ignore[arg-type]


def settings_to_env(settings: Settings) -> dict[str, str]:
    """The environment that makes a child process load exactly these settings (the shared fields; role
    variables travel in the parent's environment)."""
    return {o.name: o.to_env(getattr(settings, o.field)) for o in _shared_by_field().values()}


def effective_settings(settings: Settings, environ: Mapping[str, str] | None = None,
                       flags: frozenset[str] = frozenset()) -> list[tuple[Option[Any], Any, str]]:
    """Every registered variable with its effective value and where it came from: ``flag`` (a field in
    ``flags``), ``env`` or ``default``."""
    env = os.environ if environ is None else environ
    rows: list[tuple[Option[Any], Any, str]] = []
    for declared in REGISTRY.values():
        if declared.shared:
            value = getattr(settings, declared.field)
            source = "flag" if declared.field in flags else "env" if declared.name in env else "default"
        else:
            value = settings.role_setting(declared)
            source = "env" if settings.extra.get(declared.name, "") != "" else "default"
        rows.append((declared, value, source))
    return rows


@overload
def setting_field(option: Option[T]) -> T: ...


@overload
def setting_field(option: Option[T], convert: Callable[[T], R]) -> R: ...


def setting_field(option: Option[Any], convert: Callable[[Any], Any] | None = None) -> Any:
    """A config field read from ``option`` by ``config_from`` (through ``convert``, when the field holds
    a derived value); its default is the declaration's, so no default is written twice."""
    default = option.default if convert is None else convert(option.default)
    return field(default=default, metadata={_SETTING: (option, convert)})


def config_from(cls: type[C], source: Settings | Mapping[str, str], **given: Any) -> C:
    """``cls`` with each ``setting_field`` read from ``source``: ``Settings`` (its shared fields, and the
    role variables in ``extra``) or an environment; ``given`` holds the fields derived otherwise."""
    values: dict[str, Any] = {}
    for spec in fields(cls):
        declared = spec.metadata.get(_SETTING)
        if declared is None or spec.name in given:
            continue
        option, convert = declared
        if not isinstance(source, Settings):
            value = option.read(source)
        else:
            value = getattr(source, option.field) if option.shared else source.role_setting(option)
        values[spec.name] = value if convert is None else convert(value)
    return cls(**values, **given)
