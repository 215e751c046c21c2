from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from clawr1.core import registry as r
from clawr1.core.settings import (
    Settings,
    config_from,
    env_names,
    load_settings,
    setting_field,
    settings_to_env,
)


def test_defaults_are_the_embedded_local_stack() -> None:
    settings = load_settings({})
    assert settings.proxy_port == 8080 and settings.api_port == 8000 and settings.kafka_port == 9092
    assert settings.data_dir == Path(".clawr1")
    assert settings.manages_kafka
    assert settings.pool_dsn == f"chdb://{Path('.clawr1/pool').resolve()}"
    assert settings.is_embedded_pool


def test_environment_is_typed_and_external_services_are_honoured() -> None:
    settings = load_settings(
        {
            "CLAWR1_KAFKA_BOOTSTRAP": "k1:9092,k2:9092",
            "CLAWR1_CLICKHOUSE_DSN": "http://u:p@ch:8123/db",
            "CLAWR1_API_PORT": "9000",
            "CLAWR1_CAPTURE_TOKEN_IDS": "yes",
        }
    )
    assert settings.bootstrap_servers == "k1:9092,k2:9092" and not settings.manages_kafka
    assert settings.pool_dsn == "http://u:p@ch:8123/db" and not settings.is_embedded_pool
    assert settings.api_port == 9000 and settings.capture_token_ids is True


@pytest.mark.parametrize(
    ("var", "value"), [("CLAWR1_API_PORT", "eighty"), ("CLAWR1_CAPTURE_TOKEN_IDS", "maybe")]
)
def test_malformed_values_fail_fast_with_the_variable_name(var: str, value: str) -> None:
    with pytest.raises(ValueError, match=var):
        load_settings({var: value})


def test_flags_override_environment_and_round_trip_through_env() -> None:
    settings = load_settings({"CLAWR1_PROXY_PORT": "1"}).with_overrides(
        proxy_port=2, upstream=None, data_dir="d"
    )
    assert settings.proxy_port == 2 and settings.upstream == "" and settings.data_dir == Path("d")
    again = load_settings(settings_to_env(settings))
    assert again.proxy_port == 2 and again.data_dir == Path("d").resolve()
    assert set(settings_to_env(Settings())) == set(env_names().values())


def test_role_settings_are_typed_like_their_declaration_and_name_the_variable() -> None:
    settings = load_settings(
        {
            "CLAWR1_SINK_BATCH_ROWS": "10",
            "CLAWR1_SINK_BATCH_SECONDS": "0.5",
            "CLAWR1_SINK_EXIT_AFTER_INSERT": "yes",
            "CLAWR1_SINK_GROUP": "n",
            "CLAWR1_SINK_SESSION_TIMEOUT_MS": "",
        }
    )
    assert settings.role_setting(r.SINK_BATCH_ROWS) == 10
    assert settings.role_setting(r.SINK_BATCH_SECONDS) == 0.5
    assert settings.role_setting(r.SINK_EXIT_AFTER_INSERT) is True
    assert settings.role_setting(r.SINK_GROUP) == "n"
    assert settings.role_setting(r.SINK_SESSION_TIMEOUT_MS) == 10_000  # empty: the default
    assert settings.role_setting(r.SINK_DLQ_TOPIC) == "clawr1.dlq"  # unset: the default
    with pytest.raises(ValueError, match="CLAWR1_SINK_BATCH_ROWS"):
        load_settings({"CLAWR1_SINK_BATCH_ROWS": "many"}).role_setting(r.SINK_BATCH_ROWS)
    with pytest.raises(ValueError, match="CLAWR1_SINK_BATCH_ROWS"):
        Settings(extra={"CLAWR1_SINK_BATCH_ROWS": "many"}).role_setting(r.SINK_BATCH_ROWS)


@dataclass(frozen=True)
class _RoleConfig:
    bootstrap: str
    partitions: int = setting_field(r.TOPIC_PARTITIONS)
    batch_rows: int = setting_field(r.SINK_BATCH_ROWS)
    steps_topic: str = setting_field(r.TOPIC_SUFFIX, lambda suffix: "steps" + suffix)
    fixed: int = 7


def test_a_role_config_reads_each_field_from_the_variable_it_names() -> None:
    """Defaults are the declarations'; shared fields come from Settings, role ones from its extra or an
    environment; a converted field holds its derived value; what is given by name wins."""
    assert (_RoleConfig("k").partitions, _RoleConfig("k").batch_rows) == (4, r.SINK_BATCH_ROWS.default)
    assert _RoleConfig("k").steps_topic == "steps"
    env = {"CLAWR1_TOPIC_PARTITIONS": "8", "CLAWR1_SINK_BATCH_ROWS": "9", "CLAWR1_TOPIC_SUFFIX": ".t1"}
    from_settings = config_from(_RoleConfig, load_settings(env), bootstrap="k")
    assert from_settings == _RoleConfig("k", 8, 9, "steps.t1")
    assert config_from(_RoleConfig, env, bootstrap="k", batch_rows=3) == _RoleConfig("k", 8, 3, "steps.t1")
    with pytest.raises(ValueError, match="CLAWR1_SINK_BATCH_ROWS"):
        config_from(_RoleConfig, {"CLAWR1_SINK_BATCH_ROWS": "many"}, bootstrap="k")
