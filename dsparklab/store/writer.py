"""TraceWriter: the only way engines put rows on disk.

Rows are buffered per table and flushed as parquet parts every ``flush_rows`` rows or
``flush_seconds`` seconds. Each part is written under a hidden temporary name, fsynced and
renamed, so readers never see a partial file and a killed writer keeps every finished part.
``run.json`` is rewritten the same way whenever the status changes.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dsparklab.errors import TraceSchemaError
from dsparklab.provenance import provenance
from dsparklab.store.schema import (
    ALL_TABLES,
    PART_PREFIX,
    PART_SUFFIX,
    RUN_JSON,
    RUN_REQUIRED_FIELDS,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    TABLE_KEY,
    TABLES,
    TEMP_SUFFIX,
)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json_atomic(path: Path, payload: Mapping[str, Any]) -> None:
    """Write JSON to ``path`` through a temporary file + fsync + rename."""
    tmp = path.with_name(f".{path.name}{TEMP_SUFFIX}")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(payload, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
    _fsync_dir(path.parent)


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_json(
    *,
    run_id: str,
    engine: Mapping[str, Any],
    method: str,
    num_speculative_tokens: int,
    target: Mapping[str, Any],
    drafter: Mapping[str, Any] | None,
    dataset: str,
    sampling: Mapping[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """The run.json payload of a new run (status 'running'); ``extra`` is kept verbatim.

    A ``provenance`` block (git state, argv, package versions, host) is added unless given.
    """
    return {
        "provenance": provenance(),
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "created_at": utc_now(),
        "status": "running",
        "engine": dict(engine),
        "method": method,
        "num_speculative_tokens": int(num_speculative_tokens),
        "target": dict(target),
        "drafter": dict(drafter) if drafter is not None else None,
        "dataset": dataset,
        "sampling": dict(sampling),
        **extra,
    }


class TraceWriter:
    """Context manager that writes one run directory.

    >>> with TraceWriter(run_dir, run_json) as w:      # doctest: +SKIP
    ...     w.add("steps", step_row)
    ...     w.add_many("positions", position_rows)

    On a clean exit the run is marked ``complete``; on an exception it is marked
    ``failed`` (the exception propagates). Rows already flushed are never rewritten.
    """

    def __init__(
        self,
        run_dir: Path | str,
        run_json: Mapping[str, Any],
        *,
        flush_rows: int = 50_000,
        flush_seconds: float = 30.0,
        overwrite: bool = False,
    ) -> None:
        self.run_dir = Path(run_dir)
        missing = [k for k in RUN_REQUIRED_FIELDS if k not in run_json]
        if missing:
            raise TraceSchemaError(
                "run metadata lacks required fields; build it with new_run_json()",
                path=self.run_dir / RUN_JSON,
                field=missing[0],
            )
        self.meta = dict(run_json)
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        self._overwrite = overwrite
        self._buffers: dict[str, list[Mapping[str, Any]]] = {name: [] for name in ALL_TABLES}
        self._next_part: dict[str, int] = dict.fromkeys(ALL_TABLES, 0)
        self._rows_written: dict[str, int] = dict.fromkeys(ALL_TABLES, 0)
        self._last_flush = time.monotonic()
        self._open = False

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> TraceWriter:
        if (self.run_dir / RUN_JSON).exists() and not self._overwrite:
            raise FileExistsError(
                f"{self.run_dir / RUN_JSON}: run already exists; pass overwrite=True or "
                "choose another directory"
            )
        for name in ALL_TABLES:
            table_dir = self.run_dir / name
            if name in TABLES:  # the aggregate tables' directories appear with their rows
                table_dir.mkdir(parents=True, exist_ok=True)
            if self._overwrite and table_dir.is_dir():
                for old in table_dir.iterdir():
                    old.unlink()
        self.meta["status"] = "running"
        self._write_meta()
        self._open = True
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is None:
            self.close(status="complete")
        else:
            # keep what was recorded: flush what we can, then mark failed
            try:
                self.flush()
            finally:
                self.meta["error"] = f"{exc_type.__name__}: {exc}"
                self.close(status="failed")

    def close(self, *, status: str = "complete") -> None:
        if not self._open:
            return
        if status == "complete":
            self.flush()
        self.meta["status"] = status
        self.meta["finished_at"] = utc_now()
        self.meta["rows"] = self._present(self._rows_written)
        self._write_meta()
        self._open = False

    # -- rows ------------------------------------------------------------------------
    def add(self, table: str, row: Mapping[str, Any]) -> None:
        self.add_many(table, (row,))

    def add_many(self, table: str, rows: Any) -> None:
        if not self._open:
            raise RuntimeError("TraceWriter is not open; use it as a context manager")
        if table not in self._buffers:
            raise TraceSchemaError(
                f"unknown table {table!r}; expected one of {sorted(ALL_TABLES)}", field=table
            )
        self._buffers[table].extend(rows)
        if (
            sum(len(b) for b in self._buffers.values()) >= self.flush_rows
            or time.monotonic() - self._last_flush >= self.flush_seconds
        ):
            self.flush()

    def update_meta(self, **fields: Any) -> None:
        """Merge fields into run.json (rewritten atomically at the next status change)."""
        self.meta.update(fields)

    def checkpoint(self) -> None:
        """Flush every buffered row and rewrite run.json now (a live run's progress)."""
        if not self._open:
            raise RuntimeError("TraceWriter is not open; use it as a context manager")
        self.flush()
        self.meta["rows"] = self._present(self._rows_written)
        self._write_meta()

    def flush(self) -> None:
        for name, rows in self._buffers.items():
            if rows:
                self._write_part(name, rows)
                self._rows_written[name] += len(rows)
                self._buffers[name] = []
        self._last_flush = time.monotonic()

    # -- files -----------------------------------------------------------------------
    def _write_part(self, table: str, rows: list[Mapping[str, Any]]) -> None:
        schema = ALL_TABLES[table]
        path = self.run_dir / table / f"{PART_PREFIX}{self._next_part[table]:05d}{PART_SUFFIX}"
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            arrow = pa.Table.from_pylist(list(rows), schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError, TypeError) as err:
            raise TraceSchemaError(f"row does not fit the schema: {err}", path=path) from err
        arrow = arrow.replace_schema_metadata(
            {SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode(), TABLE_KEY: table.encode()}
        )
        tmp = path.with_name(f".{path.name}{TEMP_SUFFIX}")
        with tmp.open("wb") as fh:
            pq.write_table(arrow, fh, compression="zstd")
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
        _fsync_dir(path.parent)
        self._next_part[table] += 1

    @staticmethod
    def _present(counts: Mapping[str, int]) -> dict[str, int]:
        """The token-level tables always; an aggregate table once it has rows."""
        return {k: v for k, v in counts.items() if k in TABLES or v}

    def _write_meta(self) -> None:
        self.meta["parts"] = self._present(self._next_part)
        write_json_atomic(self.run_dir / RUN_JSON, self.meta)
