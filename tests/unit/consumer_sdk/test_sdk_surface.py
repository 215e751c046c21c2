"""The SDK's public surface, its error tree, source parsing, and what it imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clawr1 import consumer_sdk
from clawr1.consumer_sdk import errors
from clawr1.consumer_sdk.source import Source, parse_source

REPO = Path(__file__).resolve().parents[3]


def test_public_surface_is_pinned() -> None:
    assert consumer_sdk.__all__ == [
        "ConsumerClosed",
        "ConsumerError",
        "DataError",
        "EngineControl",
        "ExportManifest",
        "Filters",
        "InvalidFilter",
        "InvalidSource",
        "MissingDependency",
        "PaddedBatch",
        "PoolConsumer",
        "PoolRequestError",
        "PoolUnavailable",
        "PresetNotFound",
        "Step",
        "StepBatch",
        "TransportError",
        "UsageError",
        "export_dataset",
        "list_presets",
        "load_preset",
        "save_preset",
    ]
    for name in consumer_sdk.__all__:
        assert getattr(consumer_sdk, name) is not None


def test_every_error_is_drawn_in_the_tree_and_derives_from_consumer_error() -> None:
    tree = errors.__doc__ or ""
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.ConsumerError)
        assert name in tree, f"{name} missing from the tree in errors.py's docstring"
    assert issubclass(errors.UsageError, ValueError)
    assert issubclass(errors.PresetNotFound, LookupError)
    assert issubclass(errors.ConsumerClosed, RuntimeError)
    assert issubclass(errors.MissingDependency, ImportError)
    assert issubclass(errors.PoolUnavailable, errors.TransportError)
    assert errors.PoolRequestError("x", status=400, code=62).status == 400


@pytest.mark.parametrize(
    ("source", "transport", "expected"),
    [
        ("http://127.0.0.1:8000/", None, Source("api", "http://127.0.0.1:8000")),
        ("https://pool.example:443", None, Source("api", "https://pool.example:443")),
        ("chdb:///data/pool", None, Source("direct", "chdb:///data/pool")),
        ("clickhouse://u:p@ch:8123/db", None, Source("direct", "http://u:p@ch:8123/db")),
        ("clickhouse+http://ch:8123", None, Source("direct", "http://ch:8123")),
        ("clickhouse+https://ch:8443/db", None, Source("direct", "https://ch:8443/db")),
        ("clickhouses://ch:8443", None, Source("direct", "https://ch:8443")),
        ("http://ch:8123/db", "direct", Source("direct", "http://ch:8123/db")),
    ],
)
def test_parse_source(source: str, transport: str | None, expected: Source) -> None:
    assert parse_source(source, transport) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("source", "transport", "needle"),
    [
        ("", None, "non-empty"),
        ("kafka://broker:9092", None, "unsupported source scheme"),
        ("/data/pool", None, "unsupported source scheme"),
        ("http://", None, "no host"),
        ("chdb:///data/pool", "api", "no API"),
        ("clickhouse://ch:8123", "api", "not the Claw-R1 API"),
        ("http://x:1", "grpc", "transport must be"),
    ],
)
def test_parse_source_refuses(source: str, transport: str | None, needle: str) -> None:
    with pytest.raises(errors.InvalidSource, match=needle):
        parse_source(source, transport)  # type: ignore[arg-type]


def test_sdk_imports_without_kafka_quix_mitmproxy_or_torch() -> None:
    """A trainer installs claw-r1[sdk]: importing and parsing must not touch the stack's heavy parts."""
    blocked = ["confluent_kafka", "quixstreams", "mitmproxy", "torch", "fastapi", "chdb"]
    code = (
        "import sys\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None\n"
        "from clawr1 import consumer_sdk\n"
        "from clawr1.consumer_sdk.source import parse_source\n"
        "parse_source('http://127.0.0.1:1')\n"
        f"loaded = sorted(n for n in {blocked!r} if sys.modules.get(n) is not None)\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
