"""The request census of bench/broker_requests.py, over lines as Kafka's request logger writes them."""

from __future__ import annotations

import json

from bench.broker_requests import census, request_kind


def _line(api: str, client: str, request: dict[str, object] | None = None) -> str:
    served = {"isForwarded": False,
              "requestHeader": {"requestApiKey": 0, "requestApiVersion": 10, "correlationId": 7,
                                "clientId": client, "requestApiKeyName": api},
              "request": request or {}, "response": {}, "totalTimeMs": 1.5}
    return "Completed request:" + json.dumps(served)


def _produce(transactional: str | None, *topics: tuple[str, int]) -> str:
    return _line("PRODUCE", "rdkafka", {"transactionalId": transactional, "acks": -1, "topicData": [
        {"name": name, "partitionData": [{"index": i, "recordsSizeInBytes": 10} for i in range(count)]}
        for name, count in topics]})


def test_a_produce_says_how_it_was_written_and_what_partitions_it_carried() -> None:
    assert request_kind(_produce(None, ("raw", 1))) == ("PRODUCE plain raw <- rdkafka", 1)
    assert request_kind(_produce("clawr1-streams-up-0", ("b", 2), ("a", 1))) == (
        "PRODUCE in a transaction a,b <- rdkafka", 3)
    assert request_kind(_line("FETCH", "clawr1-streams-up-0")) == ("FETCH <- clawr1-streams-up-0", 0)
    assert request_kind("[2026-12-07 21:00:00] INFO something else") is None


def test_the_census_counts_requests_per_unit_most_first() -> None:
    lines = [_produce(None, ("raw", 1)), _produce(None, ("raw", 1)), _produce("w", ("steps", 2)),
             _line("FETCH", "w"), "not a request"]
    result = census(lines, units=2)
    assert result["requests_per_unit"] == 2.0
    assert list(result["by_kind"].items()) == [
        ("PRODUCE plain raw <- rdkafka", 1.0), ("PRODUCE in a transaction steps <- rdkafka", 0.5),
        ("FETCH <- w", 0.5)]
    assert result["partitions_per_produce"] == 1.33
    assert census([], units=1) == {"requests_per_unit": 0.0, "by_kind": {}, "partitions_per_produce": None}
