"""A trajectory belongs to the key that created it on every way in, not only on the compat port: the
attacks of the finding, tried on the live stack with keys, each failed before the rule."""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import httpx

from clawr1.proxy.hints import HINTS_IGNORED
from tests.integration.compat.conftest import Stack, auth


def _attribute(key: str, value: Any) -> dict[str, Any]:
    kind = {bool: "boolValue", int: "intValue", str: "stringValue"}[type(value)]
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


def _span(trajectory: str) -> dict[str, Any]:
    """A GenAI chat span naming someone else's trajectory, its next step and its end."""
    words = [{"role": "user", "parts": [{"type": "text", "content": "name a colour"}]}]
    reply = [{"role": "assistant", "parts": [{"type": "text", "content": "ATTACKER"}],
              "finish_reason": "stop"}]
    attributes = [_attribute(k, v) for k, v in {
        "gen_ai.operation.name": "chat", "gen_ai.input.messages": json.dumps(words),
        "gen_ai.output.messages": json.dumps(reply), "clawr1.trajectory_id": trajectory,
        "clawr1.step_index": 1, "clawr1.terminal": True}.items()]
    now_ns = time.time_ns()  # within the linking horizon of the trajectory's own calls
    return {"resourceSpans": [{"scopeSpans": [{"spans": [{
        "traceId": "0af7651916cd43dd8448eb211c80319c", "spanId": "b7ad6b7169203331", "name": "chat",
        "startTimeUnixNano": str(now_ns), "endTimeUnixNano": str(now_ns + 10**9),
        "attributes": attributes}]}]}]}


def test_another_keys_trajectory_is_never_extended_rewarded_or_curated(stack: Stack) -> None:
    created = httpx.post(f"{stack.compat}/init_trajectory", json={"prompt_uid": "own"}, headers=auth("agent"),
                         timeout=60).json()
    trajectory, base = created["trajectory_uid"], created["base_url"]
    chat = {"model": "m", "messages": [{"role": "user", "content": "name a colour"}], "max_tokens": 8}
    called = httpx.post(f"{base}/chat/completions", json=chat, headers=auth("agent"), timeout=60)
    assert called.status_code == 200, called.text
    owned = f"SELECT step_id, source_name FROM steps WHERE trajectory_id = '{trajectory}'"
    (step,) = stack.wait_rows(owned, bool)
    assert step["source_name"] == "agent"

    # The reverse proxy with no key: relayed and captured, but as the proxy's own call, hints ignored.
    hinted = httpx.post(f"http://127.0.0.1:{stack.reverse_port}/v1/chat/completions", json=chat, timeout=60,
                        headers={"X-Claw-Trajectory-Id": trajectory, "X-Claw-Terminal": "true",
                                 "X-Claw-Metadata": json.dumps({"ground_truth": "ATTACKER"})})
    assert hinted.status_code == 200, hinted.text
    # OTLP span attributes with an events-only key.
    spanned = httpx.post(f"{stack.api}/v1/traces", json=_span(trajectory), headers=auth("collector"),
                         timeout=60)
    assert spanned.status_code == 200, spanned.text
    # Feedback with a key of no kinds: a reward is taken but never joins; an exclusion is refused.
    def feedback(key: str, body: dict[str, Any]) -> httpx.Response:
        return httpx.post(f"{stack.api}/v1/feedback", json=body, headers=auth(key), timeout=60)

    assert feedback("plain", {"trajectory_id": trajectory, "reward": -5.0}).status_code == 202
    refused = feedback("plain", {"step_id": step["step_id"], "label": "excluded"})
    assert refused.status_code == 403 and "kind curate" in refused.json()["message"]
    # A reward service's key (kind reward) rewards anyone's step; the owner completes its trajectory.
    assert feedback("rewarder", {"step_id": step["step_id"], "reward": 0.5}).status_code == 202
    completed = httpx.post(f"{base}/complete_trajectory", json={"reward": 0.25}, headers=auth("agent"),
                           timeout=60)
    assert completed.status_code == 200

    rows = stack.wait_rows(
        "SELECT source_name, step_index, terminal, trajectory_reward, reward, quality_labels, metadata_json "
        f"FROM steps WHERE trajectory_id = '{trajectory}'",
        lambda rows: bool(rows) and None not in (rows[0]["trajectory_reward"], rows[0]["reward"]))
    assert [(r["source_name"], r["step_index"], r["terminal"], r["trajectory_reward"], r["reward"],
             r["quality_labels"]) for r in rows] == [("agent", 0, 1, 0.25, 0.5, [])]
    assert "ATTACKER" not in rows[0]["metadata_json"]
    letters = stack.wait_rows(
        f"SELECT reason FROM dead_letters WHERE startsWith(reason, 'not_owner') AND position(reason, "
        f"'{trajectory}') > 0", lambda rows: len(rows) >= 2, timeout=60)
    assert sorted("'collector'" in r["reason"] or "'plain'" in r["reason"] for r in letters) == [True, True]
    ignored = stack.wait_rows(
        f"SELECT metadata_json FROM steps WHERE position(metadata_json, {HINTS_IGNORED[:40]!r}) > 0 "
        "AND position(metadata_json, 'ATTACKER') = 0", bool)
    assert ignored  # the proxy's own call, in a trajectory of its own


def test_another_keys_prompt_group_is_never_joined(stack: Stack) -> None:
    """A key's rollouts naming another key's prompt group form a group of their own; a dead letter when
    that one too was taken by a third key."""
    group, taken = f"g-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"

    def rollout(key: str, group_id: str, trajectory: str, reply: int) -> None:
        body = {"trajectory_id": trajectory, "step_index": 0, "prompt_group_id": group_id,
                "prompt_group_size": 2, "prompt_token_ids": [1, 2, 3], "response_token_ids": [reply],
                "reward": 1.0, "terminal": True}
        posted = httpx.post(f"{stack.api}/v1/steps", json=body, headers=auth(key), timeout=60)
        assert posted.status_code == 202, posted.text

    def pooled(prefix: str, n: int) -> list[dict[str, Any]]:
        return stack.wait_rows(f"SELECT trajectory_id, source_name, prompt_group_id FROM steps WHERE "
                               f"startsWith(trajectory_id, '{prefix}-') ORDER BY trajectory_id",
                               lambda rows: len(rows) == n)

    rollout("agent", group, f"{group}-a0", 7)
    rollout("plain", f"{taken}@intruder", f"{taken}-p0", 7)  # named on purpose, before the intruder
    rollout("agent", taken, f"{taken}-a0", 7)
    pooled(group, 1)  # the groups have their owners
    pooled(taken, 2)
    rollout("intruder", group, f"{group}-i0", 8)
    rollout("agent", group, f"{group}-a1", 9)
    rollout("intruder", taken, f"{taken}-i0", 8)
    rows = pooled(group, 3)
    assert [(r["source_name"], r["prompt_group_id"]) for r in rows] == [
        ("agent", group), ("agent", group), ("intruder", f"{group}@intruder")]
    (letter,) = stack.wait_rows(
        f"SELECT reason FROM dead_letters WHERE startsWith(reason, 'not_owner') AND position(reason, "
        f"'{taken}@intruder') > 0", bool, timeout=60)
    assert all(f"'{key}'" in letter["reason"] for key in ("intruder", "agent", "plain"))
    assert [r["source_name"] for r in pooled(taken, 2)] == ["agent", "plain"]
