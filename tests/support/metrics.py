"""A role's Prometheus metrics as the tests read them."""

from __future__ import annotations

import httpx


def scrape(url: str) -> dict[str, float]:
    """A role's metrics as ``name{label="value",...}`` -> value (labels sorted), parsed as Prometheus does."""
    from prometheus_client.parser import text_string_to_metric_families

    reply = httpx.get(url, timeout=10)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain"), reply.text
    families = text_string_to_metric_families(reply.text)
    return {sample.name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items())) + "}":
            sample.value for family in families for sample in family.samples}


def total(metrics: dict[str, float], name: str, **labels: str) -> float:
    """The sum of ``name``'s series that carry ``labels``."""
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(value for key, value in metrics.items()
               if key.split("{", 1)[0] == name and all(w in key for w in wanted))
