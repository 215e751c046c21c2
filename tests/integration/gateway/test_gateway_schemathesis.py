"""Property-based run of the published OpenAPI spec against the live gateway and a real broker:
generated valid and invalid requests never cause a server error, and every answer matches the spec.

(schemathesis 4.32's lazy ``from_fixture`` loader does not run under pytest 9, so the spec is loaded
from the live server inside the test and each operation's strategy is driven by Hypothesis here.)
Every check runs except "schema-valid data must be accepted": the cross-field rules (one logprob
per response token, exactly one feedback target, a turn's payload) are documented in the models'
descriptions but JSON Schema cannot state them, so schema-valid data may rightly get a 422.
Invalid data may also be refused with 413: a generated body past ``max_request_bytes`` is turned away
before it is read, which is a rejection, not an acceptance.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig
from schemathesis.config._checks import NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES
from schemathesis.specs.openapi.checks import positive_data_acceptance

from tests.support.gateway import LiveGateway

EXAMPLES_PER_OPERATION_AND_MODE = 50
# schemathesis's default rejection statuses, plus 413 for a body over the gateway's size limit.
REJECTION_STATUSES = [*NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES, "413"]


@pytest.fixture(scope="module")
def operations(gateway: LiveGateway) -> dict[str, schemathesis.APIOperation]:
    config = SchemathesisConfig.from_dict(
        {"checks": {"negative_data_rejection": {"expected-statuses": REJECTION_STATUSES}}})
    schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json", config=config)
    return {op.label: op for op in (result.ok() for result in schema.get_all_operations())}


def test_spec_lists_every_route(operations: dict[str, schemathesis.APIOperation]) -> None:
    assert set(operations) == {"POST /v1/steps", "POST /v1/feedback", "POST /v1/events", "POST /v1/traces",
                               "POST /v1/logs", "GET /healthz"}


# What each route answers when it accepts (the OTLP routes answer as OTLP/HTTP does: 200).
ACCEPTED = {"POST /v1/steps": 202, "POST /v1/feedback": 202, "POST /v1/events": 202, "POST /v1/traces": 200,
            "POST /v1/logs": 200}
RUNS = [(label, mode) for label in ACCEPTED for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)]
# /healthz takes no input, so there is no invalid request to generate for it.
RUNS.append(("GET /healthz", GenerationMode.POSITIVE))


@pytest.mark.parametrize(("label", "mode"), RUNS)
def test_no_server_errors_and_spec_conformant_answers(operations: dict[str, schemathesis.APIOperation],
                                                      label: str, mode: GenerationMode) -> None:
    statuses: list[int] = []

    @given(case=operations[label].as_strategy(generation_mode=mode))
    @settings(max_examples=EXAMPLES_PER_OPERATION_AND_MODE, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))
    def run(case: schemathesis.Case) -> None:
        reply = case.call_and_validate(timeout=30, excluded_checks=[positive_data_acceptance])
        statuses.append(reply.status_code)

    run()
    assert statuses and all(status < 500 for status in statuses)
    if mode is GenerationMode.POSITIVE and label != "GET /healthz":
        assert ACCEPTED[label] in statuses, f"no valid request was accepted: {sorted(set(statuses))}"
