"""``clawr1 config``, and every command refusing an unknown CLAWR1_* variable before anything starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clawr1.cli import main
from clawr1.core.registry import markdown_table

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith("CLAWR1_"):
            monkeypatch.delenv(name)
    return monkeypatch


def test_config_prints_values_and_sources_with_secrets_masked(
    clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    clean_env.setenv("CLAWR1_API_KEYS", "alice:topsecret")
    clean_env.setenv("CLAWR1_PROXY_AUTH", "user:hunter2")
    clean_env.setenv("CLAWR1_CLICKHOUSE_DSN", "http://writer:chpass@ch:8123/clawr1")
    clean_env.setenv("CLAWR1_REWARD_MODEL_API_KEY", "sk-abc")
    clean_env.setenv("CLAWR1_SINK_BATCH_ROWS", "7")
    assert main(["config", "--data-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for secret in ("topsecret", "hunter2", "chpass", "sk-abc"):
        assert secret not in out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert lines["CLAWR1_API_KEYS"] == ["env", "****"]
    assert lines["CLAWR1_CLICKHOUSE_DSN"] == ["env", "http://writer:****@ch:8123/clawr1"]
    assert lines["CLAWR1_SINK_BATCH_ROWS"] == ["env", "7"]
    assert lines["CLAWR1_API_PORT"] == ["default", "8000"]
    assert lines["CLAWR1_DATA_DIR"] == ["flag", str(tmp_path)]
    assert not (tmp_path / "pool").exists()


def test_config_markdown_is_the_docs_table(clean_env: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "--markdown"]) == 0
    assert capsys.readouterr().out == markdown_table()


COMMANDS = ["config", "status", "worker", "sink", "rewarder", "proxy", "api", "kafka", "ca", "sql", "prune"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_an_unknown_variable(clean_env: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str], command: str) -> None:
    clean_env.setenv("CLAWR1_PROXY_PROT", "1")
    assert main([command]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"clawr1 {command}: unknown setting CLAWR1_PROXY_PROT")
    assert "did you mean CLAWR1_PROXY_PORT?" in err


def test_a_malformed_value_stops_a_command_without_a_traceback(clean_env: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("CLAWR1_STREAMS_COMMIT_INTERVAL_MS", "soon")
    assert main(["worker"]) == 2
    err = capsys.readouterr().err
    assert "CLAWR1_STREAMS_COMMIT_INTERVAL_MS" in err and "Traceback" not in err


def test_up_with_a_misspelled_variable_exits_at_once_naming_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CLAWR1_")}
    env |= {"CLAWR1_SINK_BACTH_ROWS": "1", "PYTHONPATH": str(ROOT)}
    data = tmp_path / "data"
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "clawr1.cli", "up", "--data-dir", str(data)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "CLAWR1_SINK_BACTH_ROWS" in done.stderr and "CLAWR1_SINK_BATCH_ROWS" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert not data.exists(), "the stack started something before refusing the variable"
    assert time.monotonic() - started < 30
