"""The latest-steps table filters by data channel (train / val), as the page's selector asks it to."""

from __future__ import annotations

from pathlib import Path

from clawr1.pool.store import PoolStore
from clawr1.sinks.rows import STEPS_ROUTE
from tests.integration.dashboard.conftest import T0, client_for, insert, step

STATIC = Path(__file__).resolve().parents[3] / "dashboard" / "static"


def test_steps_table_filters_by_channel(pool_store: PoolStore) -> None:
    records = [step("t0", "a", 0, 1), step("v0", "b", 0, 2, channel="val"),
               step("v1", "b", 1, 3, channel="val")]
    insert(pool_store, STEPS_ROUTE, records, [T0] * len(records))
    with client_for(pool_store) as client:
        def ids(**params: str) -> list[str]:
            reply = client.get("/v1/dashboard/steps", params=params)
            assert reply.status_code == 200, reply.text
            return [s["step_id"] for s in reply.json()["steps"]]

        assert ids(channel="train") == ["t0"]
        assert ids(channel="val") == ["v1", "v0"]
        assert ids() == ["v1", "v0", "t0"]  # "all": no channel filter


def test_page_offers_train_val_and_all() -> None:
    page = (STATIC / "index.html").read_text()
    for option in ('<option value="">all</option>', '<option value="train">train</option>',
                   '<option value="val">val</option>'):
        assert option in page
    assert 'getElementById("data-channel")' in (STATIC / "steps.js").read_text()
