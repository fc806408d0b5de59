"""TraceWriter: the only way engines put rows in a store (a directory or an S3 bucket).

Rows are buffered per table and flushed as parquet parts every ``flush_rows`` rows or
``flush_seconds`` seconds. Each part is committed whole under a name no other writer can
take (sequence, host, process and the writer's tag, e.g. its rank) and is never rewritten,
so a reader never sees half a part and a killed writer keeps every finished one; several
writers may share one run directory or one store. ``run.json`` is replaced whole by its one
writer at every flush and status change; while the run is open it carries a lease
(``lease_expires_at``) that each flush renews, and a reader treats a ``running`` run whose
lease has passed as ``incomplete``.
"""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from types import TracebackType
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from dsparklab.errors import TraceSchemaError
from dsparklab.provenance import provenance, redact_mapping
from dsparklab.store.layout import (
    PARTITION_KEYS,
    RUNS_ROW,
    RUNS_TABLE,
    is_partitioned,
    run_location,
    run_tables,
    table_location,
)
from dsparklab.store.location import Location, Where
from dsparklab.store.outbox import Outbox
from dsparklab.store.reader import run_columns, run_granularity
from dsparklab.store.sampling import run_sample
from dsparklab.store.schema import (
    ALL_TABLES,
    JOINED_DIR,
    JOINED_WRITERS,
    PART_PREFIX,
    PART_SUFFIX,
    RUN_JSON,
    RUN_REQUIRED_FIELDS,
    RUNS_SCHEMA,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    TABLE_KEY,
    TABLES,
)


def json_bytes(payload: Mapping[str, Any]) -> bytes:
    text = json.dumps(payload, indent=2, sort_keys=True, default=str) + "\n"
    return text.encode("utf-8")


logger = logging.getLogger("dsparklab.store")


def write_json_atomic(path: Where, payload: Mapping[str, Any]) -> None:
    """Commit JSON as ``path``, whole (see :meth:`Location.write_bytes`)."""
    Location.of(path).write_bytes(json_bytes(payload))


def writer_id(tag: str | None = None) -> str:
    """What makes this process's part names its own: host, pid and an optional tag."""
    host = "".join(c if c.isalnum() or c == "-" else "-" for c in socket.gethostname())
    return "-".join(part for part in (host or "host", str(os.getpid()), tag) if part)


def part_suffix(writer_id: str) -> str:
    """How every part name of the writer ``writer_id`` ends (:meth:`TraceWriter.part_name`)."""
    return f"-{writer_id}{PART_SUFFIX}"


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
    """The run.json payload of a new run (status 'running'); ``extra`` is kept as given,
    but for secrets (:func:`dsparklab.provenance.redact_mapping`).

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
        # engine settings, served configurations: never a secret in a run.json
        **redact_mapping(extra),
    }


class TraceWriter:
    """Context manager that writes one run into a store, in the table layout.

    >>> with TraceWriter(store, run_json) as w:      # doctest: +SKIP
    ...     w.add("steps", step_row)
    ...     w.add_many("positions", position_rows)

    The run's files go to its partition of each table (:mod:`dsparklab.store.layout`):
    ``<store>/<table>/dataset=.../method=.../n=.../run_id=.../``, its run.json to the same
    partition below ``<store>/_runs`` (:attr:`run_dir`), and its row of the runs table to
    ``<store>/runs``. A run is named by its run_id: writing a run_id already in the store
    replaces it (``overwrite``) or refuses.

    On a clean exit the run is marked ``complete``; on an exception it is marked
    ``failed`` (the exception propagates). Rows already flushed are never rewritten.

    ``outbox`` (a live writer that must never wait on its store, see
    :mod:`dsparklab.store.outbox`): files are sent from a background thread that retries,
    and dropped and counted past its bound; such a writer does not look for an existing
    run (its names are unique) and waits at most ``close_timeout_s`` at close.

    ``publish="first"`` writes run.json at once (a live run that readers may follow);
    ``publish="last"`` writes it only when the run closes, so the run appears whole or not at
    all (an import): parts without a run.json are no run. ``tag`` goes into part names (a
    rank, when several processes write one run).

    ``joins`` (a tag, e.g. ``tp1``): this writer joins the run another writer owns (the one
    whose run.json lists the tag in ``joined_writers``). It writes parts into the run and its
    own status and counts into ``<run>/writers/<tag>.json``; never run.json, the runs
    table's row, or anything of the owner's. A reader counts them in
    (:func:`~dsparklab.store.reader.with_joined_writers`).
    """

    def __init__(
        self,
        store: Where,
        run_json: Mapping[str, Any],
        *,
        flush_rows: int = 50_000,
        flush_seconds: float = 30.0,
        overwrite: bool = False,
        publish: str = "first",
        tag: str | None = None,
        lease_seconds: float | None = None,
        outbox: Outbox | None = None,
        close_timeout_s: float = 30.0,
        joins: str | None = None,
    ) -> None:
        self.store = Location.of(store)
        missing = [k for k in RUN_REQUIRED_FIELDS if k not in run_json]
        if missing:
            raise TraceSchemaError(
                "run metadata lacks required fields; build it with new_run_json()",
                path=self.store,
                field=missing[0],
            )
        self.run_dir = run_location(self.store, run_json)
        if publish not in ("first", "last"):
            raise ValueError(f"publish must be 'first' or 'last', not {publish!r}")
        self.meta = dict(run_json)
        self.flush_rows = flush_rows
        self.flush_seconds = flush_seconds
        # a live run renews its lease at every flush: several flush periods of silence
        self.lease_seconds = lease_seconds or max(120.0, 4 * flush_seconds)
        self._overwrite = overwrite
        self._publish = publish
        self._joins = joins
        self._writer_id = writer_id(tag)
        self._outbox = outbox
        self._close_timeout_s = close_timeout_s
        self._buffers: dict[str, list[Mapping[str, Any]]] = {name: [] for name in ALL_TABLES}
        # rows already in columns (add_table), written after the buffered rows
        self._tables: dict[str, list[pa.Table]] = {name: [] for name in ALL_TABLES}
        self._next_part: dict[str, int] = dict.fromkeys(ALL_TABLES, 0)
        self._rows_written: dict[str, int] = dict.fromkeys(ALL_TABLES, 0)
        self._last_flush = self._last_meta = time.monotonic()
        self._flushes = 0
        self._held = 0
        self._open = False
        self._runs_row_status: str | None = None

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> TraceWriter:
        if self._outbox is None:
            self.run_dir.check_bucket()
        # the owner's run.json may be there already: a joining writer adds to the run
        owner = self._joins is None
        exists = owner and self._outbox is None and (self.run_dir / RUN_JSON).is_file()
        if exists and not self._overwrite:
            raise FileExistsError(
                f"{self.run_dir / RUN_JSON}: run already exists; pass overwrite=True or "
                "choose another directory"
            )
        if exists or (self._publish == "last" and self._outbox is None and owner):
            # the old run, or the parts of a batch writer killed before its run.json
            remove_run(self.run_dir)
        for name in TABLES if self._outbox is None else ():
            table_location(self.run_dir, name).mkdir()  # aggregate tables' come with rows
        self.meta["status"] = "running"
        self._open = True
        if self._publish == "first":
            self._write_meta()
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
        dropped = self._outbox.counts.dropped_json() if self._outbox is not None else None
        if dropped is not None and status == "complete":
            status = "incomplete"  # rows were lost while the store was away
            self.meta["status_reason"] = (
                f"{sum(dropped['rows'].values())} rows were dropped while the store did not "
                "answer (run.json 'dropped')"
            )
        self.meta["status"] = status
        self.meta["finished_at"] = utc_now()
        self.meta.pop("lease_expires_at", None)
        self._open = False
        self._write_meta()
        if self._outbox is not None and not self._outbox.close(self._close_timeout_s):
            logger.warning(
                "dsparklab: %s: the store did not take the last %d bytes within %.0f s; "
                "the run reads as incomplete once its lease ends",
                self.run_dir,
                self._outbox.queued_bytes,
                self._close_timeout_s,
            )

    @property
    def recorded_nothing(self) -> bool:
        """No row added to any table, written or held."""
        return not (
            any(self._buffers.values())
            or any(self._tables.values())
            or any(self._rows_written.values())
        )

    def discard(self) -> None:
        """End a run that recorded nothing by removing it (run.json, its runs-table row, its
        empty table directories), so an engine that served no request leaves no run behind:
        a complete run without rows is one ``validate`` refuses. Only the run's sole writer
        may, and only before any row."""
        if not self._open:
            return
        if self._joins is not None or self.meta.get(JOINED_WRITERS):
            raise ValueError(f"{self.run_dir}: other writers share this run; close it instead")
        if not self.recorded_nothing:
            raise ValueError(f"{self.run_dir}: the run holds rows; close it instead")
        self._open = False
        if self._outbox is not None:
            self._outbox.close(self._close_timeout_s)  # what is on its way lands, then goes
        remove_run(self.run_dir)

    # -- rows ------------------------------------------------------------------------
    def add(self, table: str, row: Mapping[str, Any]) -> None:
        self.add_many(table, (row,))

    def add_many(self, table: str, rows: Any) -> None:
        self._check_table(table)
        self._buffers[table].extend(rows)
        if not self._held:
            self._flush_if_due()

    def add_table(self, table: str, arrow: pa.Table) -> None:
        """Rows already in columns, in the table's schema exactly (a writer that makes many
        rows at once builds them so: no Python object per row)."""
        self._check_table(table)
        schema = ALL_TABLES[table]
        if not arrow.schema.equals(schema):
            raise TraceSchemaError(
                f"columns do not match the {table} schema",
                path=self.run_dir,
                field=first_difference(schema, arrow.schema),
            )
        if arrow.num_rows:
            self._tables[table].append(arrow)
        if not self._held:
            self._flush_if_due()

    def _check_table(self, table: str) -> None:
        if not self._open:
            raise RuntimeError("TraceWriter is not open; use it as a context manager")
        if table not in self._buffers:
            raise TraceSchemaError(
                f"unknown table {table!r}; expected one of {sorted(ALL_TABLES)}", field=table
            )

    def _buffered_rows(self, table: str) -> int:
        return len(self._buffers[table]) + sum(t.num_rows for t in self._tables[table])

    def _flush_if_due(self) -> None:
        if (
            sum(self._buffered_rows(name) for name in self._buffers) >= self.flush_rows
            or time.monotonic() - self._last_flush >= self.flush_seconds
        ):
            self.flush()

    @contextmanager
    def together(self) -> Iterator[None]:
        """Rows added inside land in one flush (a step with its positions and request row):
        a part dropped while the store is away then never separates them."""
        self._held += 1
        try:
            yield
        finally:
            self._held -= 1
            if not self._held and self._open:
                self._flush_if_due()

    def update_meta(self, **fields: Any) -> None:
        """Merge fields into run.json (written at the next flush or status change)."""
        self.meta.update(fields)

    def checkpoint(self) -> None:
        """Flush every buffered row and rewrite run.json now (a live run's progress)."""
        if not self._open:
            raise RuntimeError("TraceWriter is not open; use it as a context manager")
        self.flush()
        self._write_meta()

    def heartbeat(self) -> None:
        """Renew the lease when a third of it has passed without a run.json write (an idle
        writer is still alive)."""
        stale = time.monotonic() - self._last_meta >= self.lease_seconds / 3
        if self._open and self._publish == "first" and stale:
            self._write_meta()

    def flush(self) -> None:
        self._flushes += 1
        wrote = False
        for name in self._buffers:
            count = self._buffered_rows(name)
            if count:
                self._write_part(name, self._buffers[name], self._tables[name])
                self._rows_written[name] += count
                self._buffers[name], self._tables[name] = [], []
                wrote = True
        self._last_flush = time.monotonic()
        if wrote and self._open and self._publish == "first":
            self._write_meta()  # the new counts, and the lease renewed

    # -- files -----------------------------------------------------------------------
    def part_name(self, table: str) -> str:
        """The next part's name: sequence first, so one writer's parts sort in order."""
        return f"{PART_PREFIX}{self._next_part[table]:05d}{part_suffix(self._writer_id)}"

    def _write_part(
        self, table: str, rows: list[Mapping[str, Any]], tables: list[pa.Table]
    ) -> None:
        schema = ALL_TABLES[table]
        path = table_location(self.run_dir, table) / self.part_name(table)
        try:
            arrow = pa.Table.from_pylist(list(rows), schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, KeyError, TypeError) as err:
            raise TraceSchemaError(f"row does not fit the schema: {err}", path=path) from err
        if tables:
            arrow = pa.concat_tables([arrow, *tables])
        arrow = self._without_partition_keys(arrow, path)
        data = part_bytes(arrow, table)
        if self._outbox is None:
            path.write_bytes(data)
        else:
            self._outbox.put(path, data, table=table, rows=arrow.num_rows, batch=self._flushes)
        self._next_part[table] += 1

    def _without_partition_keys(self, arrow: pa.Table, path: Location) -> pa.Table:
        """The rows without their partition's columns (``dataset``): each must hold the
        run's value, which the directory keeps."""
        for name in PARTITION_KEYS:
            if name in arrow.column_names:
                wanted = str(self.meta[name])
                bad = pc.invert(pc.fill_null(pc.equal(arrow.column(name), wanted), False))
                if pc.any(bad).as_py():
                    raise TraceSchemaError(
                        f"a row's {name} is not the run's {wanted!r} (one run, one {name})",
                        path=path,
                        field=name,
                    )
                arrow = arrow.drop_columns([name])
        return arrow

    @staticmethod
    def _present(counts: Mapping[str, int]) -> dict[str, int]:
        """The token-level tables always; an aggregate table once it has rows."""
        return {k: v for k, v in counts.items() if k in TABLES or v}

    def _write_meta(self) -> None:
        parts, rows = dict(self._next_part), dict(self._rows_written)
        if self._outbox is not None:  # what reached the store or is on its way
            counts = self._outbox.counts
            for table, dropped in counts.dropped_parts.items():
                parts[table] -= dropped
                rows[table] -= counts.dropped_rows[table]
            self.meta["dropped"] = counts.dropped_json()
        self.meta["parts"] = self._present(parts)
        self.meta["rows"] = self._present(rows)
        if self._open:
            expires = datetime.now(timezone.utc) + timedelta(seconds=self.lease_seconds)
            self.meta["lease_expires_at"] = expires.isoformat(timespec="seconds")
        self._last_meta = time.monotonic()
        if self._joins is not None:
            files = [(self.run_dir / JOINED_DIR / f"{self._joins}.json", self._joined_json())]
        else:
            files = [(self.run_dir / RUN_JSON, json_bytes(self.meta))]
        if self._joins is None and self.meta["status"] != self._runs_row_status:
            row = table_location(self.run_dir, RUNS_TABLE) / RUNS_ROW
            files.insert(0, (row, part_bytes(runs_row(self.meta), RUNS_TABLE)))
            self._runs_row_status = self.meta["status"]
        for target, data in files:
            if self._outbox is None:
                target.write_bytes(data)
            else:
                self._outbox.put(target, data, table=None, final=not self._open)

    def _joined_json(self) -> bytes:
        """A joining writer's own record: what :func:`with_joined_writers` reads."""
        keys = ("status", "rows", "parts", "created_at", "lease_expires_at", "finished_at")
        # ``config``: the writing process's pid and ancestors, where an engine gives them
        extra = ("error", "status_reason", "dropped", "config")
        record = {key: self.meta.get(key) for key in keys}
        record.update({key: self.meta[key] for key in extra if key in self.meta})
        return json_bytes({"writer": self._joins, "writer_id": self._writer_id, **record})


def first_difference(want: pa.Schema, got: pa.Schema) -> str:
    """The first column where ``got`` is not ``want`` (name, type or nullability, in order;
    what ``Schema.equals`` compares), or the first column ``want`` does not have."""
    for index, field in enumerate(want):
        if index >= len(got) or not got.field(index).equals(field):
            return field.name
    return got.names[len(want)]


def remove_run(run: Where) -> None:
    """Remove every file of the run whose run.json is in ``run``: run.json, its runs-table
    row and its parts of every table."""
    for home in run_tables(Location.of(run), tuple(ALL_TABLES)):
        home.delete()


def write_run_json(run: Where, meta: Mapping[str, Any]) -> None:
    """Rewrite a closed run's run.json (and, in the table layout, its runs-table row first):
    what a dead writer's closer or a compaction commits."""
    run = Location.of(run)
    if is_partitioned(run):
        row = part_bytes(runs_row(meta), RUNS_TABLE)
        (table_location(run, RUNS_TABLE) / RUNS_ROW).write_bytes(row)
    (run / RUN_JSON).write_bytes(json_bytes(meta))


def runs_row(meta: Mapping[str, Any]) -> pa.Table:
    """A run's row of the runs table (its partition keys are the directory's)."""
    columns = run_columns(meta)
    row = {
        **{k: columns[k] for k in ("engine", "target", "drafter", "tier", "temperature")},
        "status": meta["status"],
        "granularity": run_granularity(meta),
        "sample": run_sample(meta),
        "created_at": meta.get("created_at"),
        "finished_at": meta.get("finished_at"),
    }
    return pa.Table.from_pylist([row], schema=RUNS_SCHEMA)


def part_bytes(arrow: pa.Table, table: str, row_group_rows: int | None = None) -> bytes:
    """One part as parquet bytes, stamped with the contract's version and its table."""
    arrow = arrow.replace_schema_metadata(
        {SCHEMA_VERSION_KEY: str(SCHEMA_VERSION).encode(), TABLE_KEY: table.encode()}
    )
    sink = io.BytesIO()
    pq.write_table(arrow, sink, compression="zstd", row_group_size=row_group_rows)
    return sink.getvalue()
