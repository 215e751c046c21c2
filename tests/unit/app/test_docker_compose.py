"""docker-compose.yml stays in step with the Compose specification, the CLI and the settings object, and
its profiles hold the topologies docs/scale.md describes."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from compose_spec import PyCompose

from clawr1.cli import _build_parser
from clawr1.core.registry import REGISTRY, closest

COMPOSE = Path(__file__).resolve().parents[3] / "docker-compose.yml"
# ${VAR}, ${VAR:-default}, ${VAR:?message}: what `docker compose` substitutes from the environment.
_VARIABLE = re.compile(r"\$\{([A-Z_]+)(?::?[-?][^}]*)?\}")


def _interpolated(text: str) -> str:
    """The file as compose sees it once the environment is substituted (a path for *_FILE, else a word)."""
    return _VARIABLE.sub(lambda m: "/run/secret" if m.group(1).endswith("_FILE") else "value", text)


def _compose() -> dict[str, Any]:
    return yaml.safe_load(_interpolated(COMPOSE.read_text()))


def _services() -> dict[str, Any]:
    return _compose()["services"]


def _project_services() -> list[str]:
    """The services built from ./Dockerfile (the others run third-party images)."""
    return sorted(name for name, service in _services().items() if "build" in service)


def _profile(name: str) -> dict[str, Any]:
    return {k: v for k, v in _services().items() if name in v.get("profiles", [])}


def test_compose_follows_the_compose_specification() -> None:
    """A strict parser of the specification (unknown keys, bad ports, restart policies, profile lists are
    errors), then its checks that every volume and network a service uses is declared."""
    compose = PyCompose.from_json(json.dumps(_compose()))
    compose.validate()


def test_every_dependency_is_a_service_of_the_same_profile() -> None:
    services = _services()
    for name, service in services.items():
        for dependency in service.get("depends_on", []):
            assert dependency in services, (name, dependency)
            assert set(service["profiles"]) <= set(services[dependency]["profiles"]), (name, dependency)


def test_each_profile_has_its_topology() -> None:
    single, cluster = _profile("single"), _profile("cluster")
    assert set(single) | set(cluster) == set(_services()), "a service outside both profiles always starts"
    assert {"kafka", "clickhouse", "api", "sink", "worker", "proxy", "prometheus", "grafana"} <= set(single)

    def running(command: str) -> list[str]:
        return [n for n, s in cluster.items() if s.get("command", [None, None])[:2] == ["clawr1", command]]

    def on(image: str) -> list[str]:
        return [n for n, s in cluster.items() if s.get("image", "").startswith(image)]

    assert len(on("apache/kafka")) == 3 and len(on("clickhouse/clickhouse-keeper")) == 3
    assert len(on("clickhouse/clickhouse-server")) == 4
    assert len(running("worker")) == 2 and len(running("api")) == 2 and len(running("proxy")) == 1
    assert len(on("prom/prometheus")) == 1 and len(on("grafana/grafana")) == 1
    # The API processes run their pool sinks (no --no-sink) and migrate onto the ClickHouse cluster.
    for name in running("api"):
        assert "--no-sink" not in cluster[name]["command"]
        assert cluster[name]["environment"]["CLAWR1_CLICKHOUSE_CLUSTER"] == "clawr1"


def test_the_cluster_brokers_form_one_replicated_quorum() -> None:
    brokers = {name: s["environment"] for name, s in _profile("cluster").items()
               if s.get("image", "").startswith("apache/kafka")}
    ids = sorted(env["KAFKA_NODE_ID"] for env in brokers.values())
    assert ids == ["1", "2", "3"]
    voters = {env["KAFKA_CONTROLLER_QUORUM_VOTERS"] for env in brokers.values()}
    quorum = ",".join(f"{env['KAFKA_NODE_ID']}@{name}:9093" for name, env in sorted(brokers.items()))
    assert voters == {quorum}
    assert len({env["CLUSTER_ID"] for env in brokers.values()}) == 1
    for name, env in brokers.items():
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        for key in ("DEFAULT_REPLICATION_FACTOR", "OFFSETS_TOPIC_REPLICATION_FACTOR",
                    "TRANSACTION_STATE_LOG_REPLICATION_FACTOR"):
            assert env[f"KAFKA_{key}"] == "3", (name, key)
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2"
    bootstrap = ",".join(f"{name}:9092" for name in sorted(brokers))
    for name in _project_services():
        if name in _profile("cluster"):
            assert _services()[name]["environment"]["CLAWR1_KAFKA_BOOTSTRAP"] == bootstrap, name


@pytest.mark.parametrize("name", _project_services())
def test_each_project_service_runs_a_real_clawr1_command(name: str) -> None:
    service = _services()[name]
    assert service["build"] == "."
    command = service["command"]
    argv = command if isinstance(command, list) else shlex.split(command)
    assert argv[0] == "clawr1"
    _build_parser().parse_args(argv[1:])  # exits (fails the test) on an unknown command or flag


@pytest.mark.parametrize("name", _project_services())
def test_service_settings_are_known_settings(name: str) -> None:
    known = set(REGISTRY)  # every declared CLAWR1_* variable, shared or role-specific
    env = _services()[name].get("environment") or {}
    clawr1_vars = {k for k in env if k.startswith("CLAWR1_")}
    assert clawr1_vars, f"{name} sets no CLAWR1_* settings"
    unknown = {var: closest(var) for var in sorted(clawr1_vars - known)}
    assert not unknown, f"{name}: unknown settings (and the closest known ones) {unknown}"


def test_non_loopback_services_require_their_secrets() -> None:
    services = _services()
    for api in ("api", "api-1", "api-2"):
        assert "CLAWR1_API_KEYS" in services[api]["environment"], api
    for proxy in ("proxy", "cluster-proxy"):
        assert "CLAWR1_PROXY_AUTH" in services[proxy]["environment"], proxy


def test_the_image_copies_every_shipped_package() -> None:
    """The Dockerfile lists folders by hand; a package the wheel ships but the image lacks breaks a role."""
    import tomllib

    root = COMPOSE.parent
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    shipped = {p.rstrip("*") for p in patterns["include"]}
    copied = {line.split()[1] for line in (root / "Dockerfile").read_text().splitlines()
              if line.startswith("COPY ") and len(line.split()) == 3}
    assert shipped <= copied, f"Dockerfile does not COPY {sorted(shipped - copied)}"
