"""``clawr1 status``: is the stack healthy, which roles is ``clawr1 up`` restarting, and what does
its pool hold?"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

_SUMMARY = (
    "SELECT count() AS steps, countIf(ready = 1) AS ready, uniqExact(trajectory_id) AS trajectories, "
    "countIf(reward_status = 'final') AS rewarded FROM steps"
)


def _print_roles(state_file: Path | None) -> None:
    """The supervisor's view: the only witness while the API process itself is down."""
    if state_file is None or not state_file.exists():
        return
    for role in json.loads(state_file.read_text())["roles"]:
        last = f", last {role['last_exit']}" if role["last_exit"] else ""
        print(f"role {role['role']}: {role['state']} (pid {role['pid']}, restarts {role['restarts']}{last})")


def print_status(api_url: str, state_file: Path | None = None) -> int:
    _print_roles(state_file)
    try:
        health = httpx.get(f"{api_url}/healthz", timeout=5)
    except httpx.HTTPError as exc:
        print(f"stack at {api_url} does not answer: {exc}")
        return 2
    print(f"health: {health.status_code} {health.text}")
    if health.status_code != 200:
        return 1
    reply = httpx.post(f"{api_url}/v1/sql", json={"query": _SUMMARY, "format": "JSONEachRow"}, timeout=30)
    if reply.status_code == 200 and reply.text.strip():
        print("pool:", json.dumps(json.loads(reply.text.splitlines()[0])))
    else:
        print(f"pool query failed: {reply.status_code} {reply.text}")
        return 1
    return 0
