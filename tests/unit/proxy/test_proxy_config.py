"""Proxy settings: both modes from one Settings, never an open proxy, a CA per data dir."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawr1.core.settings import Settings
from clawr1.proxy.config import ProxyStartError, ca_cert_path, proxy_config


def test_both_modes_listen_on_the_proxy_host(tmp_path: Path) -> None:
    config = proxy_config(
        Settings(
            data_dir=tmp_path,
            proxy_port=8080,
            reverse_port=8081,
            upstream="http://127.0.0.1:8000",
            capture_token_ids=True,
        )
    )
    assert config.modes == ("regular@127.0.0.1:8080", "reverse:http://127.0.0.1:8000@127.0.0.1:8081")
    assert config.confdir == (tmp_path / "mitmproxy").resolve() and config.capture_token_ids
    assert config.token_id_hosts == "127.0.0.1:8000"  # by default only the reverse-mode upstream


def test_token_id_hosts_default_to_the_reverse_upstream_only(tmp_path: Path) -> None:
    https = Settings(data_dir=tmp_path, reverse_port=8081, upstream="https://vllm.internal")
    assert proxy_config(https).token_id_hosts == "vllm.internal:443"
    assert proxy_config(Settings(data_dir=tmp_path, proxy_port=8080)).token_id_hosts == ""
    listed = Settings(data_dir=tmp_path, reverse_port=8081, upstream="http://a:1", token_id_hosts="b,c:2")
    assert proxy_config(listed).token_id_hosts == "b,c:2"


def test_several_upstreams_are_all_the_reverse_ports_engines(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, reverse_port=8081,
                        upstream=" http://10.0.0.1:8000 , http://10.0.0.2:8000/,")
    config = proxy_config(settings)
    assert config.modes[-1] == "reverse:http://10.0.0.1:8000@127.0.0.1:8081"
    assert config.engines == ("http://10.0.0.1:8000", "http://10.0.0.2:8000")
    assert config.token_id_hosts == "10.0.0.1:8000,10.0.0.2:8000"


def test_upstream_tls_trust_comes_from_the_environment(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path, extra={"CLAWR1_UPSTREAM_CA_FILE": "/ca.pem", "CLAWR1_UPSTREAM_INSECURE": "true"}
    )
    config = proxy_config(settings)
    assert (config.upstream_ca, config.upstream_insecure) == ("/ca.pem", True)


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"proxy_host": "0.0.0.0"}, "refusing to listen on 0.0.0.0 without proxy authentication"),
        ({"proxy_host": "", "proxy_auth": ""}, "refusing to listen on all interfaces"),
        ({"proxy_host": "0.0.0.0", "proxy_auth": "any"}, "accepts every client"),
        ({"proxy_auth": "nocolon"}, "proxy_auth must be user:pass"),
        ({"reverse_port": 8081}, "reverse_port is set but upstream is not"),
        ({"reverse_port": 8081, "upstream": "http://h:1/v1"}, "without a path"),
        ({"reverse_port": 8081, "upstream": "ftp://h"}, "upstream must be http"),
        ({"proxy_port": 0}, "nothing to listen on"),
    ],
)
def test_unsafe_or_incomplete_settings_are_refused(tmp_path: Path, overrides: dict, reason: str) -> None:
    with pytest.raises(ProxyStartError, match=reason):
        proxy_config(Settings(data_dir=tmp_path).with_overrides(**overrides))


def test_processes_and_batching_come_from_the_environment(tmp_path: Path) -> None:
    config = proxy_config(Settings(data_dir=tmp_path, extra={
        "CLAWR1_PROXY_PROCESSES": "3", "CLAWR1_PROXY_BATCH_MS": "25", "CLAWR1_PROXY_BATCH_CALLS": "8"}))
    assert (config.processes, config.batch_s, config.batch_calls) == (3, 0.025, 8)
    with pytest.raises(ProxyStartError, match="CLAWR1_PROXY_PROCESSES must be at least 1, got 0"):
        proxy_config(Settings(data_dir=tmp_path, extra={"CLAWR1_PROXY_PROCESSES": "0"}))


def test_non_loopback_with_auth_is_allowed(tmp_path: Path) -> None:
    config = proxy_config(Settings(data_dir=tmp_path, proxy_host="0.0.0.0", proxy_auth="u:p"))
    assert config.proxyauth == "u:p" and config.modes == ("regular@0.0.0.0:8080",)


def test_ca_is_created_once_per_data_dir(tmp_path: Path) -> None:
    path = ca_cert_path(Settings(data_dir=tmp_path))
    assert path.read_text().startswith("-----BEGIN CERTIFICATE-----")
    first = path.read_bytes()
    assert ca_cert_path(Settings(data_dir=tmp_path)).read_bytes() == first
    assert ca_cert_path(Settings(data_dir=tmp_path / "other")).read_bytes() != first
