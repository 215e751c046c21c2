"""API key parsing, kind limits, constant-time identification and the loopback rule."""

from __future__ import annotations

from pathlib import Path

import pytest

from clawr1.gateway.auth import INGEST_KINDS, ApiKeyError, FeedbackRefused, feedback_standing, parse_api_keys
from clawr1.gateway.server import InsecureBindError, bind_address, check_bind, is_loopback


def test_entries_with_and_without_kinds() -> None:
    ring = parse_api_keys(" agent:k1 , rater:k2:feedback|events, ops:k3:read|consume|curate")
    assert ring.enabled
    # Without kinds: ingest only. Reading or moving the pool is always granted by name.
    assert [(k.name, sorted(k.kinds)) for k in ring.keys] == [
        ("agent", sorted(INGEST_KINDS)), ("rater", ["events", "feedback"]),
        ("ops", ["consume", "curate", "read"])]


def test_a_consume_key_owns_the_groups_named_after_it() -> None:
    key = parse_api_keys("trainer:k1:consume").keys[0]
    assert key.owns_group("trainer") and key.owns_group("trainer:run-1") and key.owns_group("trainer:a:b")
    for group in ("", "trainerx", "trainer/run", "other", "other:trainer", " trainer"):
        assert not key.owns_group(group), group


def test_file_entries_skip_comments_and_blank_lines(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# trainers\nagent:k1:steps\n\nsvc:k2\n")
    ring = parse_api_keys(f"@{keys},extra:k3")
    assert [k.name for k in ring.keys] == ["agent", "svc", "extra"]
    assert ring.identify("k1").kinds == frozenset({"steps"})


def test_empty_spec_disables_auth() -> None:
    assert not parse_api_keys("").enabled
    assert not parse_api_keys(" , ").enabled


@pytest.mark.parametrize(("spec", "reason"), [
    ("agent", "expected name:key"),
    (":S3CRET", "empty name"),
    ("agent:", "empty key"),
    ("agent:S3CRET:steps|train", "kinds must be among"),
    ("agent:S3CRET:pool", "kinds must be among"),
    ("agent:S3CRET:", "kinds must be among"),
    ("a:S3CRET:steps:x", "expected name:key"),
    ("a:S3CRET,b:S3CRET", "entry 2 \\(b\\): the same key is already given to 'a'"),
    ("anonymous:S3CRET", "the source of keyless calls"),  # no key may pass for the keyless
])
def test_malformed_entries_are_refused_without_echoing_the_secret(spec: str, reason: str) -> None:
    with pytest.raises(ApiKeyError, match=reason) as error:
        parse_api_keys(spec)
    assert "S3CRET" not in str(error.value)


def test_unreadable_key_file_is_reported(tmp_path: Path) -> None:
    with pytest.raises(ApiKeyError, match="cannot read API key file"):
        parse_api_keys(f"@{tmp_path / 'missing'}")


def test_identify_matches_exact_keys_only() -> None:
    ring = parse_api_keys("a:alpha-key,b:beta-key")
    assert ring.identify("beta-key").name == "b"
    assert ring.identify("alpha-key").name == "a"
    for wrong in ("", "alpha", "alpha-key ", "ALPHA-KEY", "beta-key-x"):
        assert ring.identify(wrong) is None


def test_key_repr_hides_the_secret() -> None:
    key = parse_api_keys("a:super-secret").keys[0]
    assert "super-secret" not in repr(key)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.5.0.1", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.2", False), ("example.org", False),
])
def test_loopback_detection(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_public_bind_needs_keys() -> None:
    check_bind("127.0.0.1", keys_enabled=False)
    check_bind("0.0.0.0", keys_enabled=True)
    with pytest.raises(InsecureBindError, match="without API keys"):
        check_bind("0.0.0.0", keys_enabled=False)


def test_bind_address_brackets_ipv6() -> None:
    assert bind_address("::1", 8000) == "[::1]:8000"
    assert bind_address("127.0.0.1", 8000) == "127.0.0.1:8000"


def test_a_mounted_route_missing_from_the_matrix_is_refused_to_every_key() -> None:
    from fastapi import APIRouter
    from fastapi.testclient import TestClient

    from clawr1.core.settings import Settings
    from clawr1.gateway.app import create_app

    router = APIRouter()

    @router.get("/v1/unlisted")
    def probe() -> dict[str, bool]:
        return {"ok": True}

    every_kind = "steps|feedback|events|read|consume|curate"
    app = create_app(Settings(api_keys=f"all:key-all:{every_kind}"), routers=[router])
    client = TestClient(app)  # no lifespan: the probe needs no Kafka
    assert client.get("/v1/unlisted").status_code == 401
    refused = client.get("/v1/unlisted", headers={"Authorization": "Bearer key-all"})
    assert refused.status_code == 403 and "a route in ROUTE_KINDS" in refused.json()["message"]


def test_the_security_guide_names_every_keyed_route() -> None:
    """docs/security.md's matrix is written by hand: a new route must show up there too."""
    from pathlib import Path

    from clawr1.gateway.auth import ROUTE_KINDS

    guide = (Path(__file__).resolve().parents[3] / "docs" / "security.md").read_text()
    missing = [route for route in ROUTE_KINDS if route.rsplit("/", 1)[-1] not in guide]
    assert not missing, f"docs/security.md's route x kind matrix lacks {missing}"


def test_where_feedback_counts_depends_on_the_keys_kinds() -> None:
    """A plain agent key rewards only its own trajectories; ``reward`` anyone's; labels need ``curate``,
    which counts on any step for labels and notes only."""
    agent, rewarder, curator = INGEST_KINDS, frozenset({"reward"}), frozenset({"curate"})
    assert feedback_standing(agent, labelled=False, curation_only=False) is False
    assert feedback_standing(rewarder, labelled=False, curation_only=False) is True
    assert feedback_standing(curator, labelled=True, curation_only=True) is True
    assert feedback_standing(agent | curator, labelled=True, curation_only=False) is False
    refused = ((agent, True, True), (rewarder, True, False), (curator, False, False))
    for kinds, labelled, curation_only in refused:
        with pytest.raises(FeedbackRefused):
            feedback_standing(kinds, labelled=labelled, curation_only=curation_only)


def test_labels_and_exclusions_through_the_feedback_route_need_kind_curate() -> None:
    """The finding: a key with no kinds excluded another key's steps through POST /v1/feedback (any label
    of 1-128 characters), while the dashboard's curate route needs kind curate."""
    from fastapi.testclient import TestClient

    from clawr1.core.settings import Settings
    from clawr1.gateway.app import create_app

    app = create_app(Settings(api_keys="agent:key-agent,curator:key-curator:curate"))
    client = TestClient(app)  # no lifespan: a refusal comes before Kafka, an admission meets a 503

    def post(key: str, body: object) -> tuple[int, str]:
        answer = client.post("/v1/feedback", json=body, headers={"Authorization": f"Bearer {key}"})
        return answer.status_code, answer.json()["message"]

    excluded = {"step_id": "s-victim", "label": "excluded"}
    status, message = post("key-agent", excluded)
    assert status == 403 and "needs a key of kind curate" in message
    status, message = post("key-agent", [{"step_id": "s-own", "reward": 1.0}, {**excluded, "label": "x"}])
    assert status == 403 and message.startswith("the API key of 'agent' may not send item 1 of this feedback")
    assert post("key-curator", {"trajectory_id": "t-1", "reward": -5.0})[0] == 403
    assert post("key-curator", {**excluded, "comment": "off topic"})[0] == 503  # admitted: Kafka is not up
    assert post("key-agent", {"trajectory_id": "t-own", "reward": 1.0})[0] == 503
