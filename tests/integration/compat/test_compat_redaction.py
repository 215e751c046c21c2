"""Secrets posted to the white-box ways in (the API's ``/v1/steps`` and ``/v1/feedback``, the compat port's
``/submit_steps``) are kept out of the pool as the capture proxy keeps them out of its records: through
the live gateway, Kafka, the stream worker and the sink."""

from __future__ import annotations

import json
import uuid

import httpx

from clawr1.core.redaction import REDACTED, REDACTED_WITH_TOKEN_IDS
from tests.integration.compat.conftest import Stack, auth

OPENAI = "sk-proj-" + "q9W8e7R6" * 5
GITHUB = "ghp_" + "Z9y8" * 9
PASSWORD = "LIVEHUNTER2PW"
USERINFO = "LIVEUSERINFO7"
NEEDLES = (OPENAI, GITHUB, PASSWORD, USERINFO)


def test_secrets_posted_to_white_box_routes_never_reach_the_pool(stack: Stack) -> None:
    api_trajectory, compat_trajectory = f"redact-api-{uuid.uuid4().hex}", f"redact-compat-{uuid.uuid4().hex}"
    step = {"trajectory_id": api_trajectory, "step_index": 0, "prompt_token_ids": [1, 2, 3],
            "response_token_ids": [4, 5], "response_text": f"the key is {OPENAI}",
            "prompt_messages": [{"role": "user", "content": f"clone https://bob:{USERINFO}@git.example.com"},
                                {"role": "assistant", "content": "", "tool_calls": [{
                                    "id": "c", "type": "function", "function": {
                                        "name": "login", "arguments": json.dumps({"password": PASSWORD})}}]}],
            "metadata": {"password": PASSWORD, "note": GITHUB, "task": "kept"}}
    posted = httpx.post(f"{stack.api}/v1/steps", json=step, headers=auth("agent"), timeout=60)
    assert posted.status_code == 202, posted.text
    feedback = {"trajectory_id": api_trajectory, "reward": 1.0, "comment": f"leaked {GITHUB}"}
    assert httpx.post(f"{stack.api}/v1/feedback", json=feedback, headers=auth("agent"),
                      timeout=60).status_code == 202
    seed_step = {"prompt_ids": [1, 2], "response_ids": [3], "trajectory_uid": compat_trajectory,
                 "metadata": {"api_key": PASSWORD, "note": f"{OPENAI} at https://u:{USERINFO}@h"}}
    submitted = httpx.post(f"{stack.compat}/submit_steps", json={"steps": [seed_step]}, headers=auth("agent"),
                           timeout=60)
    assert submitted.status_code == 200, submitted.text

    rows = stack.wait_rows(
        f"SELECT * FROM steps WHERE trajectory_id IN ('{api_trajectory}', '{compat_trajectory}') "
        "ORDER BY trajectory_id", lambda rows: len(rows) == 2)
    feedback_rows = stack.wait_rows(f"SELECT * FROM feedback WHERE target_id = '{api_trajectory}'", bool)
    stored = json.dumps([rows, feedback_rows])
    for needle in NEEDLES:
        assert needle not in stored, needle
    api_row, compat_row = rows
    assert json.loads(api_row["metadata_json"])["password"] == REDACTED
    assert REDACTED_WITH_TOKEN_IDS in json.loads(api_row["metadata_json"])["capture_notes"]
    assert json.loads(compat_row["metadata_json"])["api_key"] == REDACTED
    assert feedback_rows[0]["comment"] == f"leaked {REDACTED}"
