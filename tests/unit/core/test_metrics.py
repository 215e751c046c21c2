"""The metric names in one place: the Grafana dashboard uses only them (and all of them), and a role's
metrics port fails at start, naming its setting, when the port is taken."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import httpx
import pytest

from clawr1.core.metrics import ALL_METRICS, MetricsPortError, exposed_names, serve_metrics
from tests.support.ports import free_port

DASHBOARD = Path(__file__).resolve().parents[3] / "docs" / "grafana-clawr1.json"


def _dashboard_names() -> set[str]:
    exprs = [target["expr"] for panel in json.loads(DASHBOARD.read_text())["panels"]
             for target in panel["targets"]]
    assert exprs, "the dashboard has no queries"
    return {name for expr in exprs for name in re.findall(r"\bclawr1_[a-z_]+", expr)}


def test_the_dashboard_queries_only_defined_metrics() -> None:
    unknown = _dashboard_names() - exposed_names()
    assert not unknown, f"docs/grafana-clawr1.json queries metrics clawr1/core/metrics.py lacks: " \
        f"{sorted(unknown)}"


def test_every_metric_has_a_panel() -> None:
    used = _dashboard_names()
    unshown = {metric._name for metric in ALL_METRICS  # noqa: SLF001
               if not any(name.startswith(metric._name) for name in used)}  # noqa: SLF001
    assert not unshown, f"metrics without a panel in docs/grafana-clawr1.json: {sorted(unshown)}"


def test_a_served_port_answers_prometheus_text() -> None:
    port = free_port()
    assert serve_metrics(port, "127.0.0.1", "CLAWR1_TEST_METRICS_PORT")
    reply = httpx.get(f"http://127.0.0.1:{port}/metrics")
    assert reply.status_code == 200 and "# TYPE clawr1_proxy_calls_captured_total counter" in reply.text


def test_a_taken_port_fails_naming_the_setting() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsPortError, match=f"127.0.0.1:{port}.*CLAWR1_WORKER_METRICS_PORT"):
            serve_metrics(port, "127.0.0.1", "CLAWR1_WORKER_METRICS_PORT")


def test_port_zero_serves_nothing() -> None:
    assert serve_metrics(0, "127.0.0.1", "CLAWR1_WORKER_METRICS_PORT") is False


def test_a_failed_sample_is_tried_again_before_the_interval() -> None:
    """A broker still loading its groups fails the first lag sample; the gauge must not stay empty for a
    whole interval."""
    import threading

    from clawr1.core.metrics import _Sampler

    calls: list[int] = []
    second = threading.Event()

    def sample() -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("coordinator load in progress")
        second.set()

    sampler = _Sampler("test-sampler", sample, interval_s=600.0)
    sampler.start()
    try:
        assert second.wait(10), "the failed sample was not tried again within 10 s (interval 600 s)"
    finally:
        sampler.stop()
