"""`clawr1 up` as a user runs it, for the tests of the whole stack: real Kafka and chDB on free ports,
optionally the stand-in engine upstream, and a clean stop on SIGINT at the end."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.ports import free_port
from tests.support.waiting import wait_until

CLAWR1 = [sys.executable, "-m", "clawr1.cli"]
UP_PORTS = ("api", "proxy", "reverse", "compat", "kafka")


@dataclass(frozen=True)
class LiveStack:
    ports: dict[str, int]
    up: subprocess.Popen[bytes]

    def url(self, name: str) -> str:
        """``http://127.0.0.1:<port>`` of one of ``UP_PORTS`` (or "engine" under ``live_stack``)."""
        return f"http://127.0.0.1:{self.ports[name]}"


def wait_http(url: str, timeout: float, process: subprocess.Popen[bytes]) -> None:
    """Wait for ``url`` to answer 200, failing at once if the process meant to serve it exits."""

    def answers() -> bool:
        assert process.poll() is None, f"process exited with {process.returncode} before {url} answered"
        try:
            return httpx.get(url, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(answers, timeout, interval=0.5, message=f"{url} did not answer 200")


def clean_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This environment less its CLAWR1_ variables, plus ``env``."""
    return {**{k: v for k, v in os.environ.items() if not k.startswith("CLAWR1_")}, **(env or {})}


def stopped(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.kill()
        process.wait()


@contextmanager
def clawr1_up(data_dir: Path, env: Mapping[str, str] | None = None, args: Sequence[str] = (),
              ports: Mapping[str, int] | None = None, stop_timeout: float = 90,
              reverse: bool = True) -> Iterator[LiveStack]:
    """`clawr1 up --data-dir data_dir` with every port of ``UP_PORTS`` free (the reverse port only with
    ``reverse``: it needs an upstream, --upstream or --demo), ``env`` on ``clean_env()`` and ``args``
    added; ready once /healthz answers 200. On leaving normally it must stop with 0 on SIGINT within
    ``stop_timeout``; if still running on the way out it is killed."""
    names = [name for name in UP_PORTS if reverse or name != "reverse"]
    ports = {**{name: free_port() for name in names}, **(ports or {})}
    up = subprocess.Popen(
        [*CLAWR1, "up", "--data-dir", str(data_dir),
         *(a for name in names for a in (f"--{name}-port", str(ports[name]))), *args],
        env=clean_env(env))
    stack = LiveStack(ports, up)
    try:
        wait_http(f"{stack.url('api')}/healthz", 240, up)
        yield stack
        up.send_signal(signal.SIGINT)
        assert up.wait(stop_timeout) == 0, f"clawr1 up {' '.join(args)} did not stop cleanly on SIGINT"
    finally:
        stopped(up)


@contextmanager
def live_stack(data_dir: Path, env: Mapping[str, str] | None = None,
               args: Sequence[str] = ()) -> Iterator[LiveStack]:
    """``clawr1_up`` in front of the stand-in engine (its port is ``ports["engine"]``)."""
    port = free_port()
    engine = subprocess.Popen([*CLAWR1, "standin-engine", "--port", str(port)], env=clean_env())
    try:
        wait_http(f"http://127.0.0.1:{port}/v1/models", 30, engine)
        with clawr1_up(data_dir, env, ["--upstream", f"http://127.0.0.1:{port}", *args],
                       ports={"engine": port}) as stack:
            yield stack
    finally:
        stopped(engine)


def pool_sql(api: str, query: str) -> list[dict[str, object]]:
    """``query`` through ``clawr1 sql --api`` as a user runs it against the stack: the rows as dicts."""
    out = subprocess.run([*CLAWR1, "sql", "--api", api, "--format", "JSONEachRow", query],
                         capture_output=True, text=True, check=True, timeout=60)
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]
