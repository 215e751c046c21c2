"""Where the explicit proxy may connect: every spelling of this machine is refused, the upstreams and
the allow-list's entries are reached, and a name that resolves here when connected gains nothing."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from pathlib import Path

import pytest

from clawr1.core.settings import Settings
from clawr1.proxy.addons.destinations import DestinationGuard
from clawr1.proxy.config import ProxyStartError, proxy_config
from clawr1.proxy.destinations import DestinationError, Destinations, parse_allow, resolve

THIS_MACHINE = ["127.0.0.1", "127.1", "127.42.0.9", "0x7f000001", "2130706433", "0177.0.0.1", "[::1]",
                "::1", "[::ffff:127.0.0.1]", "[::ffff:7f00:1]", "localhost", "localhost.", "LOCALHOST",
                "0.0.0.0", "0", "[::]", socket.gethostname()]


@pytest.mark.parametrize("host", THIS_MACHINE)
def test_every_spelling_of_this_machine_is_refused_on_every_port(host: str) -> None:
    destinations = Destinations(upstreams=(("127.0.0.1", 8091),))
    for port in (9092, 9093, 8000, 8100, 8123, 1):
        reason = destinations.refusal(host, port)
        assert reason is not None and "a machine of the Claw-R1 stack" in reason, (host, port)


def test_upstreams_and_host_port_entries_are_the_only_ports_reached_here() -> None:
    destinations = Destinations(parse_allow("*,localhost:8000"), upstreams=(("127.0.0.1", 8091),))
    assert destinations.refusal("127.0.0.1", 8091) is None
    assert destinations.refusal("127.1", 8091) is None  # the same address and port, another spelling
    assert destinations.refusal("localhost", 8000) is None and destinations.refusal("127.0.0.1", 8000) is None
    assert destinations.refusal("127.0.0.1", 8092) is not None
    assert destinations.refusal("[::1]", 8091) is not None


def test_entries_name_hosts_domains_and_ports() -> None:
    public = Destinations(parse_allow("api.openai.com, *.anthropic.com, 10.1.2.3:8000"),
                          resolver=lambda _host, _port: ["203.0.113.7"])
    assert public.refusal("api.openai.com", 443) is None and public.refusal("API.OpenAI.com.", 443) is None
    assert public.refusal("eu.api.anthropic.com", 443) is None
    assert public.refusal("anthropic.com", 443) == \
        "refusing to relay to anthropic.com:443: not in CLAWR1_PROXY_ALLOW"
    assert public.refusal("10.1.2.3", 8000) is None and public.refusal("10.1.2.3", 8001) is not None
    assert public.refusal("evil.example", 443) is not None
    assert Destinations().refusal("any.example", 443) is None  # the default: any host off the stack


@pytest.mark.parametrize(("entry", "reason"), [
    ("localhost", "names this machine without a port"), ("127.0.0.1", "without a port"),
    ("[::1]", "without a port"),
    ("a b", "expected host"), ("*.*.x", "expected host"), ("x:0", "port must be"), ("x:http", "port must be"),
    ("http://x/", "expected host"),
])
def test_malformed_or_too_wide_entries_are_refused_at_start(entry: str, reason: str, tmp_path: Path) -> None:
    with pytest.raises(DestinationError, match=reason):
        parse_allow(entry)
    with pytest.raises(ProxyStartError, match=reason):
        proxy_config(Settings(data_dir=tmp_path, extra={"CLAWR1_PROXY_ALLOW": entry}))


def test_the_stacks_service_hosts_are_refused_on_every_port(tmp_path: Path) -> None:
    """Kafka, ClickHouse and a schema registry may run on other machines (docker-compose): the proxy
    reaches none of their ports, the controller's included."""
    settings = Settings(data_dir=tmp_path, kafka_bootstrap="kafka:9092,10.9.0.2:9092",
                        clickhouse_dsn="http://u:p@clickhouse:8123/db", reverse_port=8081,
                        upstream="http://engine:8000")
    names = {"kafka": "10.9.0.1", "clickhouse": "10.9.0.3", "engine": "10.9.0.4",
             "api.openai.com": "203.0.113.9"}
    destinations = proxy_config(settings).destinations
    destinations = Destinations(destinations.entries, destinations.upstreams, destinations.service_hosts,
                                resolver=lambda host, _port: [names[host]] if host in names else [])
    for host, port in [("kafka", 9093), ("10.9.0.1", 9092), ("10.9.0.2", 29092), ("clickhouse", 9000),
                       ("10.9.0.3", 8123)]:
        assert destinations.refusal(host, port) is not None, (host, port)
    assert destinations.refusal("engine", 8000) is None
    assert destinations.refusal("api.openai.com", 443) is None


def test_a_name_that_resolves_here_at_connection_time_is_dropped() -> None:
    """DNS rebinding: the check saw a public address, the connection's own resolution answers 127.0.0.1.
    The proxy's loop resolves through the rule, so only the checked address can be connected to."""
    answers = iter([["203.0.113.5"], ["127.0.0.1"]])
    destinations = Destinations(resolver=lambda _host, _port: next(answers))
    assert destinations.refusal("rebind.example", 9092) is None
    guard = DestinationGuard(destinations)
    infos = [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, 9092))
             for address in ("127.0.0.1", "203.0.113.5")]
    assert guard._keep("rebind.example", 9092, infos) == infos[1:]
    with pytest.raises(OSError, match="resolves to a machine of the stack"):
        guard._keep("rebind.example", 9092, infos[:1])

    async def through_the_loop() -> list[str]:
        guard.running()
        try:
            found = await asyncio.get_running_loop().getaddrinfo("localhost", 9092, type=socket.SOCK_STREAM)
        except OSError as exc:
            return [str(exc)]
        finally:
            guard.done()
        return [str(info[4][0]) for info in found]

    assert "resolves to a machine of the stack" in asyncio.run(through_the_loop())[0]


def test_resolution_sees_every_numeric_form_as_the_connection_would() -> None:
    assert {ipaddress.ip_address(a) for a in resolve("0x7f000001", 80)} == {ipaddress.ip_address("127.0.0.1")}
    assert resolve("no-such-host.invalid", 80) == []
