"""docker-compose.yml stays in step with the CLI and the settings object."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from clawr1.cli import _build_parser
from clawr1.core.registry import REGISTRY, closest

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.yml"
THIRD_PARTY = {"kafka", "clickhouse", "prometheus", "grafana"}


def _services() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())["services"]


def test_compose_parses_and_has_the_topology() -> None:
    services = _services()
    assert {"kafka", "clickhouse", "api", "sink", "worker", "proxy"} <= set(services)


@pytest.mark.parametrize("name", sorted(set(_services()) - THIRD_PARTY))
def test_each_project_service_runs_a_real_clawr1_command(name: str) -> None:
    service = _services()[name]
    assert service["build"] == "."
    command = service["command"]
    argv = command if isinstance(command, list) else shlex.split(command)
    assert argv[0] == "clawr1"
    _build_parser().parse_args(argv[1:])  # exits (fails the test) on an unknown command or flag


@pytest.mark.parametrize("name", sorted(set(_services()) - THIRD_PARTY))
def test_service_settings_are_known_settings(name: str) -> None:
    known = set(REGISTRY)  # every declared CLAWR1_* variable, shared or role-specific
    env = _services()[name].get("environment") or {}
    clawr1_vars = {k for k in env if k.startswith("CLAWR1_")}
    assert clawr1_vars, f"{name} sets no CLAWR1_* settings"
    unknown = {var: closest(var) for var in sorted(clawr1_vars - known)}
    assert not unknown, f"{name}: unknown settings (and the closest known ones) {unknown}"


def test_non_loopback_services_require_their_secrets() -> None:
    services = _services()
    assert "CLAWR1_API_KEYS" in services["api"]["environment"]
    assert "CLAWR1_PROXY_AUTH" in services["proxy"]["environment"]


def test_the_image_copies_every_shipped_package() -> None:
    """The Dockerfile lists folders by hand; a package the wheel ships but the image lacks breaks a role."""
    import tomllib

    root = COMPOSE.parent
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = {p.rstrip("*") for p in patterns["include"]}
    copied = {line.split()[1] for line in (root / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") and len(line.split()) == 3}
    assert shipped <= copied, f"Dockerfile does not COPY {sorted(shipped - copied)}"
