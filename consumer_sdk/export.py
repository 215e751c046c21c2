"""Steps out of the pool as dataset files: sharded Parquet or JSON Lines that Hugging Face ``datasets``
loads as they are (``load_dataset("parquet", data_files=...)``), for offline RL, SFT and sharing.

The export reads the pool page by page in primary-key order (``trajectory_id, step_id``) with a key
cursor, so it never holds more than a page and a shard's writer; it is bounded by a *watermark*, the
pool's newest ``ingested_at`` when it started, recorded with ``count_sql`` and its count then. Each step
is written in its newest version when its page is read; a filter on what does not change (ids, source,
``created_at_ms``, channel, model) gives exactly ``count_sql``'s count, one on what joins later
(rewards, labels, readiness) may gain or lose steps that change during the export. Shards are
closed at the first page that brings them to the size cap, written under a temporary name and renamed;
``manifest.json`` then records the shard, the cursor past it and the counts. An interrupted export
started again into the same folder continues from the manifest's cursor with the manifest's watermark,
after removing any shard the manifest does not list: nothing twice, nothing missing. Every file is
created new (exclusive, never through a symbolic link) and renamed into place: a link planted in the
folder under a name the export uses (``.data-00000.jsonl.tmp`` to a victim file) is refused, never
written through.

Rows (``group_by="step"``): ids, positions, provenance, policy version, token ids with ``input_ids``
(prompt then response), ``attention_mask`` and ``loss_mask`` (1 on response tokens), behaviour
logprobs, rewards and status, and ``messages`` (the prompt plus the reply, ``{role, content}`` text,
the shape SFT trainers read), with the exact messages kept as JSON. ``group_by="trajectory"``: one row
per trajectory, its steps' columns as lists in step order and ``messages`` of its last step.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from clawr1.consumer_sdk.errors import UsageError
from clawr1.consumer_sdk.filters import Filters, filter_sql
from clawr1.consumer_sdk.presets import read_preset
from clawr1.consumer_sdk.source import parse_source
from clawr1.consumer_sdk.transport import Transport, open_transport

__all__ = ["ExportManifest", "export_dataset", "export_steps", "sft_messages"]

Format = Literal["parquet", "jsonl"]
GroupBy = Literal["step", "trajectory"]
MANIFEST = "manifest.json"
DEFAULT_SHARD_BYTES = 256 * 1024 * 1024
DEFAULT_PAGE_ROWS = 1000

STEP_COLUMNS = """
    step_id, trajectory_id, step_index, parent_step_id, prompt_group_id, prompt_group_size, prompt_id,
    response_id, source_kind, source_name, agent, model, policy_version, channel,
    created_at_ms, status, ready, terminal, link_status,
    reward, reward_status, trajectory_reward, trajectory_reward_status, quality_labels, quality_score,
    token_provenance, tokenizer, prompt_token_ids, response_token_ids, response_logprobs,
    arrayConcat(prompt_token_ids, response_token_ids) AS input_ids,
    arrayWithConstant(length(prompt_token_ids) + length(response_token_ids), toUInt8(1)) AS attention_mask,
    arrayConcat(arrayWithConstant(length(prompt_token_ids), toUInt8(0)),
                arrayWithConstant(length(response_token_ids), toUInt8(1))) AS loss_mask,
    prompt_messages AS prompt_messages_json, response_text, tool_calls_json, metadata_json
"""
MESSAGES_TYPE = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


@dataclass
class ExportManifest:
    """``manifest.json``: what was exported (filter, watermark), where it stands, and its files."""

    format: str
    group_by: str
    filter: dict[str, Any]
    watermark_ms: int
    total_rows: int
    """What ``count_sql`` (with ``filter.parameters``) counted when the export started."""
    count_sql: str = ""
    """The SQL count of the filter over the ``steps`` view (steps, or distinct trajectories)."""
    cursor: list[str] = field(default_factory=list)
    """The last (trajectory_id, step_id) written, or (trajectory_id,) when grouped by trajectory."""
    shards: list[dict[str, Any]] = field(default_factory=list)
    rows: int = 0
    complete: bool = False
    started_at_ms: int = 0
    finished_at_ms: int | None = None

    @property
    def files(self) -> list[str]:
        return [shard["file"] for shard in self.shards]

    def save(self, out: Path) -> None:
        temporary = out / f".{MANIFEST}.tmp"
        with open(_create(temporary), "wb") as file:
            file.write((json.dumps(asdict(self), indent=2) + "\n").encode())
        os.replace(temporary, out / MANIFEST)

    @classmethod
    def load(cls, out: Path) -> ExportManifest | None:
        path = out / MANIFEST
        return cls(**json.loads(path.read_text())) if path.exists() else None


_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _not_a_link(path: Path) -> None:
    if path.is_symlink():
        raise UsageError(f"{path} is a symbolic link: an export never writes through one (was it planted?); "
                         "remove it or choose another folder")


def _ours(name: str) -> bool:
    """A name the export writes or reads in its folder: the manifest, shards and their temporaries."""
    return name.startswith(("data-", ".data-", MANIFEST, f".{MANIFEST}"))


def _create(path: Path) -> int:
    """A new file at ``path``, open for writing: never through a link, never over another file. A regular
    file left there (an interrupted export's temporary) is removed first; a link is refused."""
    try:
        return os.open(path, _NEW_FILE, 0o666)
    except FileExistsError:
        _not_a_link(path)
        path.unlink()
        return os.open(path, _NEW_FILE, 0o666)


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    texts = [p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str)]
    if parts and len(texts) == len(parts):
        return "".join(texts)
    return json.dumps(content, ensure_ascii=False)


def sft_messages(prompt_messages_json: str | None, response_text: str | None,
                 tool_calls_json: str | None) -> list[dict[str, str]]:
    """The conversation of one step as ``{role, content}`` text: its prompt, then the reply (tool calls
    as their JSON after the text, so nothing the model produced is lost)."""
    try:
        prompt = json.loads(prompt_messages_json or "[]")
        calls = json.loads(tool_calls_json or "[]")
    except ValueError:
        prompt, calls = [], []
    messages = [{"role": str(m.get("role") or ""), "content": _text(m.get("content"))}
                for m in prompt if isinstance(m, dict)]
    reply = response_text or ""
    if calls:
        reply += "".join(json.dumps(call, ensure_ascii=False) for call in calls)
    return [*messages, {"role": "assistant", "content": reply}]


def _with_messages(page: pa.Table) -> pa.Table:
    columns = page.select(["prompt_messages_json", "response_text", "tool_calls_json"]).to_pydict()
    messages = [sft_messages(*row) for row in zip(*columns.values(), strict=True)]
    return page.append_column("messages", pa.array(messages, type=MESSAGES_TYPE))


def _by_trajectory(page: pa.Table) -> pa.Table:
    """One row per trajectory: each step column as a list in step order, ``messages`` of its last step.
    (Lists are cut from the sorted columns by offsets: Arrow's ``list`` aggregation takes no list columns.)"""
    page = page.sort_by([("trajectory_id", "ascending"), ("step_index", "ascending")])
    ids = page.column("trajectory_id").to_pylist()
    starts = [i for i, t in enumerate(ids) if i == 0 or t != ids[i - 1]]
    ends = [*starts[1:], len(ids)]
    offsets = pa.array([*starts, len(ids)], type=pa.int32())
    columns: dict[str, pa.Array] = {
        "trajectory_id": pa.array([ids[i] for i in starts], type=pa.string()),
        "num_steps": pa.array([e - s for s, e in zip(starts, ends, strict=True)], type=pa.int32()),
    }
    for name in page.column_names:
        if name not in {"trajectory_id", "messages"}:
            columns[name] = pa.ListArray.from_arrays(offsets, page.column(name).combine_chunks())
    columns["messages"] = page.column("messages").take([e - 1 for e in ends]).combine_chunks()
    return pa.table(columns)


class _ShardWriter:
    """One shard being written under a temporary name; ``close`` renames it into place."""

    def __init__(self, path: Path, fmt: Format) -> None:
        self.path, self.fmt = path, fmt
        self.temporary = path.with_name(f".{path.name}.tmp")
        self.rows = 0
        self._file = open(_create(self.temporary), "wb")  # noqa: SIM115 - closed by close()
        self._parquet: pq.ParquetWriter | None = None

    def write(self, table: pa.Table) -> None:
        if self.fmt == "jsonl":
            lines = (json.dumps(row, ensure_ascii=False, default=str) + "\n" for row in table.to_pylist())
            self._file.write("".join(lines).encode())
        else:
            if self._parquet is None:
                self._parquet = pq.ParquetWriter(self._file, table.schema, compression="zstd")
            self._parquet.write_table(table)  # one row group per page, written out at once
        self.rows += table.num_rows

    @property
    def bytes(self) -> int:
        """Bytes written so far (the Parquet footer, written on close, comes on top)."""
        return int(self._file.tell())

    def close(self) -> dict[str, Any]:
        if self._parquet is not None:
            self._parquet.close()
        self._file.close()
        os.replace(self.temporary, self.path)
        return {"file": self.path.name, "rows": self.rows, "bytes": self.path.stat().st_size}


@dataclass(frozen=True)
class _Query:
    """The export's filter as SQL over the ``steps`` view, with its bound parameters."""

    clauses: list[str]
    parameters: dict[str, Any]

    @property
    def where(self) -> str:
        return " AND ".join(f"({c})" for c in self.clauses) or "1"


def _filter(filters: Filters | None, where: str | None, channel: str | None) -> _Query:
    clauses: list[str] = []
    parameters: dict[str, Any] = {}
    if filters is not None:
        if filters.max_staleness is not None:
            raise UsageError("an export has no trainer policy version: drop max_staleness from the preset "
                             "(use min_policy_version)")
        clauses, parameters = filter_sql(filters, None)
    if channel is not None:
        clauses.append("channel = {x_channel:String}")
        parameters["x_channel"] = channel
    if where:
        clauses.append(where)
    return _Query(clauses, parameters)


def _progress(total: int, done: int, unit: str) -> Any:
    """A tqdm bar on a terminal (when tqdm is installed), else nothing."""
    if not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, initial=done, unit=unit, desc="export", dynamic_ncols=True)


def export_steps(
    transport: Transport,
    out: str | Path,
    *,
    format: Format = "parquet",
    group_by: GroupBy = "step",
    filters: Filters | None = None,
    where: str | None = None,
    channel: str | None = None,
    preset: str | None = None,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    page_rows: int = DEFAULT_PAGE_ROWS,
    on_shard: Callable[[ExportManifest], None] | None = None,
) -> ExportManifest:
    """Write the steps matching ``filters`` (a preset's, already loaded), ``where`` (SQL over the
    ``steps`` view, checked by the pool's SQL guard) and ``channel`` to ``out``; resume an interrupted
    export of the same filter found there. ``on_shard`` sees the manifest after each shard."""
    if format not in ("parquet", "jsonl"):
        raise UsageError(f"format must be parquet or jsonl, got {format!r}")
    if group_by not in ("step", "trajectory"):
        raise UsageError(f"group_by must be step or trajectory, got {group_by!r}")
    if shard_bytes < 1 or page_rows < 1:
        raise UsageError("shard_bytes and page_rows must be >= 1")
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for entry in folder.iterdir():
        if _ours(entry.name):
            _not_a_link(entry)
    query = _filter(filters, where, channel)
    described = {"where": where, "channel": channel, "preset": preset,
                 "preset_filters": None if filters is None else json.loads(filters.to_json()),
                 "sql": query.where, "parameters": query.parameters}
    manifest = ExportManifest.load(folder)
    if manifest is not None:
        if (manifest.format, manifest.group_by, manifest.filter) != (format, group_by, described):
            raise UsageError(f"{folder} holds another export ({manifest.format}, by {manifest.group_by}, "
                             f"filter {manifest.filter['sql']!r}); choose another folder")
        if manifest.complete:
            return manifest
        for stray in folder.iterdir():  # an interrupted shard, or one the manifest never recorded
            if stray.name != MANIFEST and stray.name not in manifest.files and stray.name.startswith(
                    ("data-", ".data-")):
                stray.unlink()
    else:
        newest = "SELECT toUnixTimestamp64Milli(max(ingested_at)) AS v FROM step_versions"
        manifest = ExportManifest(format, group_by, described, int(_scalar(transport, newest, {}) or 0), 0,
                                  count_sql=_count_sql(query, group_by),
                                  started_at_ms=int(time.time() * 1000))
        counted = _scalar(transport, manifest.count_sql, _bound_parameters(query, manifest))
        manifest.total_rows = int(counted or 0)
        manifest.save(folder)
    _run(transport, folder, manifest, query, shard_bytes, page_rows, on_shard)
    return manifest


def _steps_within(bounds: str = "") -> str:
    """The ``steps`` view (each step in its newest version) within ``bounds`` (conditions on the keys).
    Not a snapshot of an earlier instant: ReplacingMergeTree merges drop superseded versions, so the pool
    keeps no history to read one from."""
    return f"(SELECT * FROM steps WHERE 1{bounds})"


def _count_sql(query: _Query, group_by: str) -> str:
    counted = "count()" if group_by == "step" else "uniqExact(trajectory_id)"
    return f"SELECT {counted} AS v FROM {_steps_within()} WHERE {query.where}"


def _bound_parameters(query: _Query, manifest: ExportManifest) -> dict[str, Any]:
    return dict(query.parameters)


def _scalar(transport: Transport, sql: str, parameters: Mapping[str, Any]) -> Any:
    table = transport.query(sql, parameters)
    return table.column("v")[0].as_py() if table.num_rows else None


def _pages(transport: Transport, manifest: ExportManifest, query: _Query,
           page_rows: int) -> Iterator[pa.Table]:
    """Pages after the manifest's cursor, in key order; each moves the cursor to its end. A page is the
    next ``page_rows`` keys (steps, or trajectories) the filter keeps, then their rows, read by
    primary-key range (a step that changed in between may be left out by a filter on what changes)."""
    parameters = _bound_parameters(query, manifest)
    by_step = manifest.group_by == "step"
    keys = "trajectory_id, step_id" if by_step else "trajectory_id"
    while True:
        cursor = manifest.cursor
        if by_step:
            after = " AND (trajectory_id, step_id) > ({x_t:String}, {x_s:String})" if cursor else ""
            until = " AND (trajectory_id, step_id) <= ({x_lt:String}, {x_ls:String})"
            bound = {"x_t": cursor[0], "x_s": cursor[1]} if cursor else {}
        else:
            after = " AND trajectory_id > {x_t:String}" if cursor else ""
            until = " AND trajectory_id <= {x_lt:String}"
            bound = {"x_t": cursor[0]} if cursor else {}
        window = transport.query(
            f"SELECT {keys} FROM steps WHERE ({query.where}){after} GROUP BY {keys} ORDER BY {keys} "
            f"LIMIT {int(page_rows)}", {**parameters, **bound})
        if not window.num_rows:
            return
        last = [window.column(name)[-1].as_py() for name in keys.split(", ")]
        bound |= {"x_lt": last[0], **({"x_ls": last[1]} if by_step else {})}
        order = "trajectory_id, step_id" if by_step else "trajectory_id, step_index"
        rows = f"SELECT {STEP_COLUMNS} FROM {_steps_within(after + until)} WHERE {query.where} " \
               f"ORDER BY {order}"
        page = transport.query(rows, {**parameters, **bound})
        manifest.cursor = last
        if page.num_rows:
            page = _with_messages(page)
            yield page if by_step else _by_trajectory(page)


def _run(transport: Transport, folder: Path, manifest: ExportManifest, query: _Query, shard_bytes: int,
         page_rows: int, on_shard: Callable[[ExportManifest], None] | None) -> None:
    unit = "steps" if manifest.group_by == "step" else "trajectories"
    bar = _progress(manifest.total_rows, manifest.rows, unit)
    extension = "parquet" if manifest.format == "parquet" else "jsonl"
    shard: _ShardWriter | None = None
    schema: pa.Schema | None = None

    def finish_shard() -> None:
        """The shard into place, then the manifest (its cursor is past the shard's last row)."""
        nonlocal shard
        assert shard is not None
        manifest.shards.append(shard.close())
        manifest.rows += shard.rows
        manifest.save(folder)
        shard = None
        if on_shard is not None:
            on_shard(manifest)

    try:
        for page in _pages(transport, manifest, query, page_rows):
            schema = schema or page.schema
            page = page.cast(schema)  # one schema for every shard, or datasets refuses the files
            if shard is None:
                shard = _ShardWriter(folder / f"data-{len(manifest.shards):05d}.{extension}",
                                     manifest.format)  # type: ignore[arg-type]
            shard.write(page)
            if bar is not None:
                bar.update(page.num_rows)
            if shard.bytes >= shard_bytes:
                finish_shard()
        if shard is not None:
            finish_shard()
        manifest.complete = True
        manifest.finished_at_ms = int(time.time() * 1000)
        manifest.save(folder)
    finally:
        if bar is not None:
            bar.close()


def export_dataset(source: str, out: str | Path, *, preset: str | None = None, api_key: str | None = None,
                   transport: Literal["api", "direct"] | None = None, **options: Any) -> ExportManifest:
    """``export_steps`` from a source URL (the API, or a pool DSN), with a saved preset's filters."""
    link = open_transport(parse_source(source, transport), api_key=api_key)
    try:
        filters = read_preset(link, preset) if preset is not None else None
        return export_steps(link, out, filters=filters, preset=preset, **options)
    finally:
        link.close()
