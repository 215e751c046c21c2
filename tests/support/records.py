"""Complete Avro records for pool tests: the schema's defaults plus the fields a test cares about."""

from __future__ import annotations

import copy
from typing import Any

from clawr1.schemas.codec import current_schema

_REQUIRED_SAMPLES: dict[str, Any] = {
    "string": "x", "int": 0, "long": 0, "double": 0.0, "boolean": False, "bytes": b"",
}


def record(schema: str, **fields: Any) -> dict[str, Any]:
    """Every field of ``schema``: given values, else the schema default, else a plain sample value."""
    out: dict[str, Any] = {}
    for field in current_schema(schema).raw["fields"]:
        name = field["name"]
        if name in fields:
            out[name] = fields.pop(name)
        elif "default" in field:
            out[name] = copy.deepcopy(field["default"])
        else:
            kind = field["type"]
            out[name] = [] if isinstance(kind, dict) and kind.get("type") == "array" \
                else _REQUIRED_SAMPLES[kind]
    if fields:
        raise KeyError(f"{schema} has no fields {sorted(fields)}")
    return out


def step(step_id: str, version: int = 1, trajectory_id: str = "traj", step_index: int = 0,
         **fields: Any) -> dict[str, Any]:
    base = {
        "prompt_id": f"p-{step_id}", "response_id": f"r-{step_id}", "source_kind": "whitebox_agent",
        "created_at_ms": 1_760_000_000_000, "updated_at_ms": 1_760_000_000_000 + version,
        "prompt_token_ids": [1, 2, 3], "response_token_ids": [4, 5],
    }
    base.update(fields)
    return record("step", step_id=step_id, version=version, trajectory_id=trajectory_id,
                  step_index=step_index, **base)
