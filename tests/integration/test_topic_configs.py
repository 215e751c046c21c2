"""A real broker holds each topic of the stack with its role's configs: set when ``ensure_topics`` creates
it, and set on a topic that exists with others (a stack upgraded from before, a setting changed)."""

from __future__ import annotations

from confluent_kafka.admin import ConfigResource, NewTopic, ResourceType

from clawr1.core.kafka_io import HOUR_MS, TopicPolicy, ensure_topics, make_admin, topic_config
from clawr1.streams import quix_compat
from clawr1.streams.config import StreamTopics

KEYS = ("cleanup.policy", "compression.type", "retention.ms", "segment.ms", "delete.retention.ms")


def broker_configs(bootstrap: str, name: str) -> dict[str, str]:
    resource = ConfigResource(ResourceType.TOPIC, name)
    admin = make_admin(bootstrap)  # held until the answer: a client destroyed first fails its requests
    described = admin.describe_configs([resource])[resource].result(30)
    return {key: described[key].value for key in KEYS}


def test_created_topics_get_their_role_s_configs(kafka_bootstrap: str, unique: str) -> None:
    names = StreamTopics().with_suffix("." + unique)
    changelog = quix_compat.changelog_topic("app" + unique, names.work)
    policy = TopicPolicy.from_env({})
    ensure_topics(kafka_bootstrap, [names.raw_llm, names.steps, names.dlq, changelog], partitions=2)
    for name in (names.raw_llm, names.steps, names.dlq, changelog):
        held = broker_configs(kafka_bootstrap, name)
        assert {k: held[k] for k in topic_config(name, policy)} == topic_config(name, policy), name
    assert broker_configs(kafka_bootstrap, names.raw_llm)["retention.ms"] == str(6 * HOUR_MS)
    assert broker_configs(kafka_bootstrap, changelog)["cleanup.policy"] == "compact"


def test_an_existing_topic_is_altered_to_its_role_s_configs(kafka_bootstrap: str, unique: str) -> None:
    """As an upgraded stack finds its topics: created without configs (Kafka's 7 days, uncompressed),
    then by a stack with other settings; the partitions stay as they are."""
    names = StreamTopics().with_suffix("." + unique)
    admin = make_admin(kafka_bootstrap)
    for future in admin.create_topics([NewTopic(names.raw_steps, 3), NewTopic(names.steps, 3)]).values():
        future.result(30)
    assert broker_configs(kafka_bootstrap, names.raw_steps)["retention.ms"] == str(168 * HOUR_MS)

    counts = ensure_topics(kafka_bootstrap, [names.raw_steps, names.steps], partitions=8)
    assert counts == {names.raw_steps: 3, names.steps: 3}
    policy = TopicPolicy.from_env({})
    for name in (names.raw_steps, names.steps):
        held = broker_configs(kafka_bootstrap, name)
        assert {k: held[k] for k in topic_config(name, policy)} == topic_config(name, policy), name

    changed = TopicPolicy(input_ms=HOUR_MS // 2, output_ms=-1, dead_letters_ms=HOUR_MS)
    ensure_topics(kafka_bootstrap, [names.raw_steps, names.steps], policy=changed)
    assert broker_configs(kafka_bootstrap, names.raw_steps)["retention.ms"] == str(HOUR_MS // 2)
    assert broker_configs(kafka_bootstrap, names.raw_steps)["segment.ms"] == str(HOUR_MS // 2)
    assert broker_configs(kafka_bootstrap, names.steps)["retention.ms"] == "-1"


def test_a_topic_of_anyone_else_is_left_as_kafka_makes_it(kafka_bootstrap: str, unique: str) -> None:
    name = f"someone-else.{unique}"
    ensure_topics(kafka_bootstrap, [name], partitions=1)
    held = broker_configs(kafka_bootstrap, name)
    assert held["retention.ms"] == str(168 * HOUR_MS) and held["compression.type"] == "producer"
