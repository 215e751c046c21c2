"""``clawr1 status``: is the stack healthy, and what does its pool hold?"""

from __future__ import annotations

import json

import httpx

_SUMMARY = (
    "SELECT count() AS steps, countIf(ready = 1) AS ready, uniqExact(trajectory_id) AS trajectories, "
    "countIf(reward_status = 'final') AS rewarded FROM steps"
)


def print_status(api_url: str) -> int:
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
