"""``dsparklab migrate``: bring runs written under an older trace contract up to this one.

Schema 1 -> 2: the steps gain ``batch_size`` and ``other_time_s`` and the totals the
source's ``tpot_s`` / ``itl_s`` / ``ttft_s`` (null: schema 1 did not record them), and the
steps gain ``emitted``, the output tokens a step added once the
output was cut at ``max_new_tokens`` and at a stop token. It is derived exactly from what
schema 1 recorded: the request's output length :math:`L` (``requests.output_token_ids``,
else the per-request ``totals.num_output_tokens`` of an import), the prefill's token
first, then each step's ``accepted_len + 1`` tokens in step order
(:func:`dsparklab.store.rows.emitted_tokens`). A run whose output lengths are not recorded
cannot be derived and is refused with the file and field. Every part is rewritten with the
new version stamp; each table is swapped in whole (built beside it, then two renames), and
run.json is updated last, so a migration killed midway is finished by running it again and
never leaves a table half old.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from dsparklab.errors import TraceSchemaError
from dsparklab.store.location import Location
from dsparklab.store.reader import find_runs, part_files
from dsparklab.store.rows import emitted_tokens
from dsparklab.store.schema import (
    ALL_TABLES,
    PART_SUFFIX,
    RUN_JSON,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    TABLE_KEY,
)
from dsparklab.store.writer import write_json_atomic

_NEW = ".{table}.v{version}"
_OLD = ".{table}.old"


def derive_emitted(steps: pd.DataFrame, output_lengths: pd.Series) -> np.ndarray:
    """``emitted`` per row of ``steps`` (``request_id``, ``step``, ``accepted_len``) from
    each request's output length (``output_lengths`` indexed by request_id), in row order
    (:func:`dsparklab.store.rows.emitted_tokens` per request)."""
    out = np.zeros(len(steps), dtype=np.int64)
    frame = steps.reset_index(drop=True)
    for request_id, part in frame.sort_values("step", kind="stable").groupby("request_id"):
        kept = emitted_tokens(part["accepted_len"].tolist(), int(output_lengths[request_id]))
        out[part.index.to_numpy()] = np.asarray(kept, dtype=np.int64)
    return out


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _output_lengths(run_dir: Path, steps: pd.DataFrame) -> pd.Series:
    """request_id -> output length, from the requests table or the per-request totals."""
    lengths = pd.Series(dtype=np.float64)
    source = run_dir / "requests"
    requests = [
        pq.read_table(p, columns=["request_id", "output_token_ids"])
        for p in part_files(run_dir, "requests")
    ]
    if requests:
        frame = pa.concat_tables(requests).to_pandas()
        frame = frame[frame["output_token_ids"].notna()]
        lengths = frame.set_index("request_id")["output_token_ids"].map(len).astype(np.float64)
    if lengths.empty and part_files(run_dir, "totals"):
        source = run_dir / "totals"
        totals = pa.concat_tables([pq.read_table(p) for p in part_files(run_dir, "totals")])
        frame = totals.to_pandas()
        frame = frame[(frame["scope"] == "request") & frame["num_output_tokens"].notna()]
        lengths = frame.set_index("request_id")["num_output_tokens"].astype(np.float64)
    missing = sorted(set(steps["request_id"]) - set(lengths.index))
    if missing:
        raise TraceSchemaError(
            f"cannot derive emitted tokens exactly: no output length for request "
            f"{missing[0]!r} ({len(missing)} requests); re-collect this run",
            path=source,
            field="output_token_ids",
        )
    return lengths


def _rewrite(run_dir: Path, table: str) -> None:
    """Build ``.<table>.v<N>`` with every part restamped (steps with ``emitted``), then
    swap it in for ``<table>``."""
    schema = ALL_TABLES[table]
    new_dir = run_dir / _NEW.format(table=table, version=SCHEMA_VERSION)
    old_dir = run_dir / _OLD.format(table=table)
    if new_dir.exists():
        shutil.rmtree(new_dir)
    new_dir.mkdir()
    parts = part_files(run_dir, table)
    tables = [pq.read_table(p) for p in parts]
    # a table an earlier, killed migration already swapped in has its emitted column
    if table == "steps" and any("emitted" not in t.column_names for t in tables):
        keys = pa.concat_tables([t.select(["request_id", "step", "accepted_len"]) for t in tables])
        frame = keys.to_pandas()
        emitted = derive_emitted(frame, _output_lengths(run_dir, frame))
        bounds = np.cumsum([0, *(t.num_rows for t in tables)])
        tables = [
            t.drop_columns([c for c in ("emitted",) if c in t.column_names]).append_column(
                "emitted", pa.array(emitted[a:b], pa.int32())
            )
            for t, a, b in zip(tables, bounds[:-1], bounds[1:], strict=True)
        ]
    for path, arrow in zip(parts, tables, strict=True):
        for spec in schema:  # the other columns v2 added hold nothing schema 1 recorded
            if spec.name not in arrow.column_names:
                arrow = arrow.append_column(spec, pa.nulls(arrow.num_rows, spec.type))
        arrow = (
            arrow.select(schema.names)
            .cast(schema)
            .replace_schema_metadata(
                {SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode(), TABLE_KEY: table.encode()}
            )
        )
        with (new_dir / path.name).open("wb") as fh:
            pq.write_table(arrow, fh, compression="zstd")
            fh.flush()
            os.fsync(fh.fileno())
    _fsync_dir(new_dir)
    (run_dir / table).rename(old_dir)
    new_dir.rename(run_dir / table)
    _fsync_dir(run_dir)
    shutil.rmtree(old_dir)


def _finish_interrupted(run_dir: Path, table: str) -> None:
    """A migration killed between its two renames left ``.<table>.v<N>`` and no table."""
    new_dir = run_dir / _NEW.format(table=table, version=SCHEMA_VERSION)
    old_dir = run_dir / _OLD.format(table=table)
    if new_dir.is_dir() and not (run_dir / table).exists() and old_dir.is_dir():
        new_dir.rename(run_dir / table)
        shutil.rmtree(old_dir)


def migrate_run(run_dir: Location | Path | str) -> str:
    """Bring one run to :data:`SCHEMA_VERSION`: ``"migrated"`` or ``"current"``."""
    run_dir = Path(run_dir)
    path = run_dir / RUN_JSON
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise TraceSchemaError(f"unreadable run.json ({err})", path=path) from err
    version = meta.get("schema_version")
    if version == SCHEMA_VERSION:
        return "current"
    if version != 1:
        raise TraceSchemaError(
            f"schema version {version!r}: this dsparklab migrates 1 to {SCHEMA_VERSION}",
            path=path,
            field="schema_version",
        )
    for table in ALL_TABLES:
        _finish_interrupted(run_dir, table)
    for table in ALL_TABLES:
        if (run_dir / table).is_dir() and any((run_dir / table).glob(f"*{PART_SUFFIX}")):
            _rewrite(run_dir, table)
    meta["schema_version"] = SCHEMA_VERSION
    write_json_atomic(path, meta)
    return "migrated"


def migrate_store(root: Location | Path | str) -> dict[str, str]:
    """Every run below ``root`` brought to :data:`SCHEMA_VERSION`: run dir -> outcome."""
    return {str(run): migrate_run(run) for run in find_runs(root)}
