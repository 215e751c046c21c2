"""The registry of CLAWR1_* variables: typed parsing, checks, unknown names, masking, one set of defaults."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from clawr1.core import registry as r
from clawr1.core.settings import (
    Settings,
    SettingsError,
    UnknownSettingError,
    effective_settings,
    env_names,
    load_settings,
)


@pytest.mark.parametrize(
    ("var", "value"),
    [
        ("CLAWR1_API_PORT", "eighty"),  # shared int
        ("CLAWR1_CAPTURE_TOKEN_IDS", "maybe"),  # shared bool
        ("CLAWR1_SINK_BATCH_ROWS", "many"),  # role int
        ("CLAWR1_SINK_BATCH_SECONDS", "soon"),  # role float
        ("CLAWR1_UPSTREAM_INSECURE", "perhaps"),  # role bool
        ("CLAWR1_DEMO_AGENTS", "two"),
    ],
)
def test_a_malformed_value_is_refused_at_load_naming_the_variable(var: str, value: str) -> None:
    with pytest.raises(SettingsError, match=var):
        load_settings({var: value})


def test_types_are_parsed_as_declared() -> None:
    assert r.DATA_DIR.parse("/d") == Path("/d")
    assert r.SINK_BATCH_SECONDS.parse("2") == 2.0 and isinstance(r.SINK_BATCH_SECONDS.parse("2"), float)
    assert r.REWARD_SKIP_REWARDED.parse("off") is False and r.REWARD_SKIP_REWARDED.parse("ON") is True
    assert r.READY_RULE.parse("tokens") == "tokens"
    assert r.SINK_BATCH_ROWS.read({}) == 5000
    assert r.SINK_BATCH_ROWS.read({"CLAWR1_SINK_BATCH_ROWS": ""}) == 5000


def test_checks_run_at_load_and_on_read_with_the_variable_name() -> None:
    with pytest.raises(SettingsError, match="CLAWR1_GATEWAY_MAX_IN_FLIGHT must be positive, got 0"):
        load_settings({"CLAWR1_GATEWAY_MAX_IN_FLIGHT": "0"})
    # Settings built in code (tests) skip load_settings: the read checks too.
    with pytest.raises(ValueError, match="CLAWR1_IDEMPOTENCY_TTL_S must be positive"):
        Settings(extra={"CLAWR1_IDEMPOTENCY_TTL_S": "-1"}).role_setting(r.IDEMPOTENCY_TTL_S)


def test_an_unknown_name_is_refused_with_the_closest_known_one() -> None:
    with pytest.raises(UnknownSettingError) as caught:
        load_settings({"CLAWR1_SINK_BACTH_ROWS": "1", "CLAWR1_API_PORT": "1"})
    message = str(caught.value)
    assert "CLAWR1_SINK_BACTH_ROWS" in message and "did you mean CLAWR1_SINK_BATCH_ROWS?" in message
    with pytest.raises(UnknownSettingError, match="CLAWR1_ZZZ, CLAWR1_ZZZZ"):
        load_settings({"CLAWR1_ZZZZ": "", "CLAWR1_ZZZ": ""})  # all of them, even empty; no guess for these
    with pytest.raises(UnknownSettingError, match="did you mean CLAWR1_PROXY_PORT"):
        r.lookup("CLAWR1_PROXY_PROT")
    # Other variables are none of Claw-R1's business.
    assert load_settings({"CLAWR1": "x", "MY_CLAWR1_THING": "y", "PATH": "/bin"}) == Settings()


def test_role_variables_land_in_extra_and_shared_ones_in_fields() -> None:
    settings = load_settings({"CLAWR1_API_PORT": "1", "CLAWR1_SINK_GROUP": "g", "OTHER": "o"})
    assert settings.api_port == 1 and settings.extra == {"CLAWR1_SINK_GROUP": "g"}


def test_shared_options_are_exactly_the_settings_fields_with_their_types_and_defaults() -> None:
    declared = {o.field: o for o in r.shared_options()}
    settings_fields = [f for f in fields(Settings) if f.name != "extra"]
    assert [f.name for f in settings_fields] == list(declared)
    for f in settings_fields:
        assert f.type in (declared[f.name].type.__name__, declared[f.name].type), f.name
        assert f.default == declared[f.name].default, f.name
    assert set(env_names().values()) == {o.name for o in r.shared_options()}


def test_every_declaration_is_well_formed() -> None:
    for name, opt in r.REGISTRY.items():
        assert name == opt.name and name.startswith("CLAWR1_") and name.upper() == name
        assert opt.type in (str, int, float, bool, Path) and isinstance(opt.default, opt.type)
        assert opt.help and "\n" not in opt.help and opt.roles
        assert opt.check is None or opt.check(opt.default) is None, f"{name}: its default fails its check"
    with pytest.raises(ValueError, match="declared twice"):
        r.option("API_PORT", int, 1, "again")


def test_role_modules_take_their_defaults_from_the_registry() -> None:
    from clawr1.demo.tasks import DemoConfig
    from clawr1.streams.readiness import DEFAULT_RULE

    assert r.READY_RULE.default == DEFAULT_RULE
    demo = DemoConfig()
    for f in fields(DemoConfig):
        opt = r.REGISTRY[f"CLAWR1_DEMO_{f.name.upper()}"]
        assert opt.type is type(getattr(demo, f.name)) and opt.default == getattr(demo, f.name), f.name


@pytest.mark.parametrize(
    ("opt", "value", "shown"),
    [
        (r.API_KEYS, "alice:s3cret", "****"),
        (r.API_KEYS, "@/etc/clawr1/keys", "@/etc/clawr1/keys"),  # a file's path is no secret
        (r.API_KEYS, "", ""),
        (r.CLICKHOUSE_DSN, "http://u:pw@ch:8123/db", "http://u:****@ch:8123/db"),
        (r.SCHEMA_REGISTRY_URL, "http://registry:8081", "http://registry:8081"),
        (r.PROXY_AUTH, "u:p", "****"),
        (r.REWARD_MODEL_API_KEY, "sk-1", "****"),
        (r.API_PORT, 8000, "8000"),
        (r.CAPTURE_TOKEN_IDS, True, "true"),
    ],
)
def test_secrets_are_masked_when_shown(opt: r.Option, value: object, shown: str) -> None:
    assert opt.show(value) == shown


def test_effective_settings_name_each_source() -> None:
    env = {"CLAWR1_API_PORT": "9", "CLAWR1_SINK_GROUP": "g", "CLAWR1_PROXY_PORT": "1"}
    settings = load_settings(env).with_overrides(proxy_port=2)
    rows = {o.name: (value, source) for o, value, source in
            effective_settings(settings, env, flags=frozenset({"proxy_port"}))}
    assert set(rows) == set(r.REGISTRY)
    assert rows["CLAWR1_API_PORT"] == (9, "env") and rows["CLAWR1_SINK_GROUP"] == ("g", "env")
    assert rows["CLAWR1_PROXY_PORT"] == (2, "flag") and rows["CLAWR1_SINK_BATCH_ROWS"] == (5000, "default")
