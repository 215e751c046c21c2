"""What the dashboard writes and what it previews: curation as feedback, the trainer's next batch, a
scope's prefix tree packed for training.

Curation never edits a row. It becomes feedback records (``source = "curation"``, the key's name as
``source_name``) on the feedback topic, so it is audited and replayed like any other feedback: the
streams fold each label into the step's ``quality_labels`` and a note into its feedback history.
Labels only accumulate (the join unions them), so a curation cannot be withdrawn by another one.
``excluded`` and ``untrainable`` (``clawr1.consumer_sdk.filters.CURATION_EXCLUDED_LABELS``) take a step out
of every consumer's batches; ``quality:<grade>`` is a label too, since the join's ``quality_score`` is
a human *reward* and curation must not change rewards.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from clawr1.consumer_sdk import PoolConsumer, StepBatch
from clawr1.gateway.models import Id
from clawr1.pool.store import PoolStore
from clawr1.prefix_tree.packing import PackedTree, dense_mask, pack_tree
from clawr1.prefix_tree.tree import StepTokens

SOURCE = "curation"
MAX_CURATED_STEPS = 1000
MASK_CELLS = 48
PREVIEW_MAX_STEPS = 256
NEWEST_POLICY_SQL = "SELECT max(policy_version) AS version FROM steps"

Label = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]{1,64}$")]


class CurateRequest(BaseModel):
    """Rows (``step_ids``) or a whole filter of the steps table (``filters``), and what to set."""

    model_config = ConfigDict(extra="forbid")

    step_ids: list[Id] = Field([], max_length=MAX_CURATED_STEPS)
    filters: dict[str, Any] | None = Field(None, description="the steps table's filters (a whole filter)")
    labels: list[Label] = Field([], max_length=16)
    quality: Literal["good", "ok", "bad"] | None = None
    trainable: Literal[False] | None = Field(None, description="false marks the steps untrainable")
    exclude: Literal[True] | None = Field(None, description="true excludes the steps from training")
    note: Annotated[str, StringConstraints(min_length=1, max_length=2000)] | None = None

    @model_validator(mode="after")
    def _one_target_something_to_set(self) -> CurateRequest:
        if bool(self.step_ids) == (self.filters is not None):
            raise ValueError("give either step_ids or filters")
        if not self.labels_to_set() and self.note is None:
            raise ValueError("set at least one of labels, quality, trainable (false), exclude (true), note")
        return self

    def labels_to_set(self) -> list[str]:
        extra = [f"quality:{self.quality}" if self.quality else None,
                 "untrainable" if self.trainable is False else None, "excluded" if self.exclude else None]
        return list(dict.fromkeys([*self.labels, *(label for label in extra if label)]))


def curation_feedback(request: CurateRequest, step_ids: Iterable[str]) -> list[dict[str, Any]]:
    """The feedback items (``FeedbackIn`` fields) that carry ``request`` to each step: one per label,
    the note on the first (or alone); their ids derive from the content, so a repeat is one fact."""
    labels: list[str | None] = list(request.labels_to_set()) or [None]
    items = []
    for step_id in step_ids:
        for position, label in enumerate(labels):
            item: dict[str, Any] = {"step_id": step_id, "source": SOURCE, "final": True}
            if label is not None:
                item["label"] = label
            if position == 0 and request.note is not None:
                item["comment"] = request.note
            items.append(item)
    return items


# --- the trainer's next batch -------------------------------------------------------------------

class StoreTransport:
    """The SDK's ``Transport`` over the dashboard's pool store, read-only: a preview never commits."""

    def __init__(self, store: PoolStore) -> None:
        self.store = store

    def query(self, sql: str, parameters: Mapping[str, Any]) -> pa.Table:
        return self.store.query_arrow(sql, parameters=parameters)

    def insert(self, table: str, rows: Sequence[Sequence[Any]], column_names: Sequence[str]) -> None:
        raise PermissionError("the dashboard's batch preview never writes to the pool")

    def close(self) -> None:
        """The store belongs to the dashboard: nothing to close."""


def step_tokens(rows: Iterable[Mapping[str, Any]]) -> list[StepTokens]:
    """Rows with token ids as the prefix tree takes them (steps without prompt ids cannot be packed)."""
    return [StepTokens(row["step_id"], row["prompt_token_ids"], row["response_token_ids"],
                       row.get("parent_step_id")) for row in rows if len(row["prompt_token_ids"])]


def packing_totals(packed: PackedTree | None) -> dict[str, Any]:
    if packed is None:
        return {"total_tokens": 0, "tree_tokens": 0, "saved_tokens": 0, "savings_ratio": 1.0}
    ratio = packed.total_tokens / packed.tree_tokens if packed.tree_tokens else 1.0
    return {"total_tokens": packed.total_tokens, "tree_tokens": packed.tree_tokens,
            "saved_tokens": packed.total_tokens - packed.tree_tokens, "savings_ratio": ratio}


def preview_batch(store: PoolStore, group: str, preset: str | None, whole_groups: bool, max_steps: int,
                  max_groups: int | None, policy_version: int | None) -> dict[str, Any]:
    """What ``group``'s next ``poll`` would return now, through the SDK itself, without committing.
    Without ``policy_version`` the trainer is taken to be at the newest version any step reports
    (what ``max_staleness`` counts back from)."""
    if policy_version is None:
        policy_version = store.query(NEWEST_POLICY_SQL)[0]["version"]
    with PoolConsumer(store.dsn, group, preset=preset, whole_groups=whole_groups,
                      transport=StoreTransport(store)) as consumer:
        if policy_version is not None:
            consumer.report_policy_version(policy_version)
        batch: StepBatch = consumer.poll(max_steps=max_steps, max_groups=max_groups if whole_groups else None)
        rows = batch.to_arrow().to_pylist()
    tokens = step_tokens(rows)
    packed = pack_tree(tokens) if tokens else None
    return {
        "group": group, "preset": preset, "whole_groups": whole_groups, "policy_version": policy_version,
        "steps": len(rows), "groups": len({r["prompt_group_id"] for r in rows if r["prompt_group_id"]}),
        "prompt_tokens": sum(len(r["prompt_token_ids"]) for r in rows),
        "response_tokens": sum(len(r["response_token_ids"]) for r in rows),
        "packed": packing_totals(packed),
        "rows": [{"step_id": r["step_id"], "trajectory_id": r["trajectory_id"], "step_index": r["step_index"],
                  "prompt_group_id": r["prompt_group_id"], "policy_version": r["policy_version"],
                  "reward": r["reward"], "prompt_tokens": len(r["prompt_token_ids"]),
                  "response_tokens": len(r["response_token_ids"]), "quality_labels": r["quality_labels"]}
                 for r in rows],
    }


# --- a scope's prefix tree -------------------------------------------------------------------------

def sharing_runs(packed: PackedTree) -> list[dict[str, int]]:
    """The packed ribbon: runs of consecutive packed tokens shared by the same number of steps (a
    token is shared by every step whose sequence ends inside its subtree)."""
    ends = np.sort(np.array([int(packed.target_idx[packed.target_offsets[i + 1] - 1])
                             for i in range(len(packed.step_ids))
                             if packed.target_offsets[i + 1] > packed.target_offsets[i]], dtype=np.int64))
    runs: list[dict[str, int]] = []
    for k in range(packed.num_tokens):
        shared = int(np.searchsorted(ends, packed.tout[k], "left") - np.searchsorted(ends, k, "left"))
        if runs and runs[-1]["shared"] == shared and runs[-1]["end"] == k:
            runs[-1]["end"] = k + 1
        else:
            runs.append({"start": k, "end": k + 1, "shared": shared})
    return runs


def mask_thumbnail(packed: PackedTree, cells: int = MASK_CELLS) -> list[list[float]]:
    """The tree attention mask shrunk to at most ``cells`` x ``cells``: each cell the share of
    allowed (query, key) pairs in its block."""
    mask = dense_mask(packed)[: packed.num_tokens, : packed.num_tokens].astype(np.float64)
    size = min(cells, packed.num_tokens)
    edges = np.linspace(0, packed.num_tokens, size + 1).astype(int)
    return [[round(float(mask[edges[i]:edges[i + 1], edges[j]:edges[j + 1]].mean()), 3) for j in range(size)]
            for i in range(size)]


def scope_tree(nodes: list[dict[str, Any]], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """The tree view of one scope: its merged nodes (as the streams stored them) and the packed
    layout of its steps (ribbon, mask thumbnail, savings)."""
    tokens = step_tokens(steps)
    packed = pack_tree(tokens) if tokens else None
    return {
        "nodes": [{"node_id": n["node_id"], "parent_node_id": n["parent_node_id"],
                   "depth_start": n["depth_start"], "tokens": len(n["token_ids"]),
                   "head": list(n["token_ids"][:12]), "step_ids": list(n["step_ids"])} for n in nodes],
        "packed": {**packing_totals(packed), "num_tokens": packed.num_tokens if packed else 0,
                   "steps": len(tokens), "forks": packed.forks if packed else 0,
                   "ribbon": sharing_runs(packed) if packed else [],
                   "mask": mask_thumbnail(packed) if packed else []},
    }
