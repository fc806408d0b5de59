"""Readers: run directories -> pandas DataFrames with run metadata joined.

Column projection and row filters are pushed down to parquet through ``pyarrow.dataset``,
and run-level filters (method, n, ...) skip whole runs, so a large store need not fit in
memory to answer a narrow question.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from dsparklab.errors import TraceSchemaError
from dsparklab.store.layout import (
    COMPACTED_PREFIX,
    PARTITION_KEYS,
    RUNS_DIR,
    RUNS_TABLE,
    current_parts,
    is_partitioned,
    partition_values,
    table_location,
)
from dsparklab.store.location import Location, StoreAccessError, Where
from dsparklab.store.schema import (
    ALL_TABLES,
    DEFAULT_GRANULARITY,
    GRANULARITIES,
    JOINED_DIR,
    JOINED_WRITERS,
    PART_PREFIX,
    PART_SUFFIX,
    RUN_JSON,
    RUN_OPTIONAL_FIELDS,
    RUN_REQUIRED_FIELDS,
    SCHEMA_VERSION,
    SCHEMA_VERSION_KEY,
    STATUSES,
)

Filters = Mapping[str, Any]
# older contracts dsparklab upgrades in place
_MIGRATE_HINT = {1: "; run `dsparklab migrate <runs>` to add the steps' emitted tokens"}


def _json_object(path: Location, missing: str) -> dict[str, Any]:
    """The JSON object in ``path``; TraceSchemaError naming the file, ``missing`` saying
    what a missing file means."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TraceSchemaError(missing, path=path) from None
    except UnicodeDecodeError as err:
        raise TraceSchemaError(f"invalid JSON ({err})", path=path) from err
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as err:
        raise TraceSchemaError(f"invalid JSON ({err})", path=path) from err
    if not isinstance(meta, dict):
        raise TraceSchemaError("expected a JSON object at the top level", path=path)
    return meta


def read_run_json(
    run_dir: Where, *, derive_status: bool = True, joined: bool = True
) -> dict[str, Any]:
    """Load and check ``run.json``; raise TraceSchemaError naming the file and field.

    A ``running`` run whose writer's lease (``lease_expires_at``) has passed reads as
    ``incomplete``, with ``status_reason`` saying so (its writer stopped renewing it: killed,
    or its host lost); ``derive_status=False`` returns the status as written. A run other
    writers join (``joined_writers``) reads with their rows and parts counted in and the
    worst of their statuses (:func:`with_joined_writers`); ``joined=False`` returns its
    owner's run.json alone (what the owner's closer writes back).
    """
    run = resolve_run(run_dir)
    path = run / RUN_JSON
    meta = _json_object(path, "run.json is missing; not a run directory")
    for field, expected in RUN_REQUIRED_FIELDS.items():
        if field not in meta:
            raise TraceSchemaError("required field missing", path=path, field=field)
        if not isinstance(meta[field], expected) or isinstance(meta[field], bool):
            raise TraceSchemaError(
                f"expected {_type_names(expected)}, got {type(meta[field]).__name__}",
                path=path,
                field=field,
            )
    _check_optional_fields(meta, path)
    if meta["schema_version"] != SCHEMA_VERSION:
        raise TraceSchemaError(
            f"schema version {meta['schema_version']} is not supported (this dsparklab reads "
            f"{SCHEMA_VERSION}){_MIGRATE_HINT.get(meta['schema_version'], '')}",
            path=path,
            field="schema_version",
        )
    if meta["status"] not in STATUSES:
        raise TraceSchemaError(
            f"status {meta['status']!r} is not one of {list(STATUSES)}", path=path, field="status"
        )
    if meta["num_speculative_tokens"] < 0:
        raise TraceSchemaError("must be >= 0", path=path, field="num_speculative_tokens")
    granularity = meta.get("granularity", DEFAULT_GRANULARITY)
    if granularity not in GRANULARITIES:
        raise TraceSchemaError(
            f"granularity {granularity!r} is not one of {list(GRANULARITIES)}",
            path=path,
            field="granularity",
        )
    if derive_status and meta["status"] == "running" and _lease_expired(meta):
        meta["status"] = "incomplete"
        meta["status_reason"] = (
            f"its writer's lease ended at {meta['lease_expires_at']} without the run being "
            "closed (the writer was killed or lost its store)"
        )
    if joined and meta.get(JOINED_WRITERS):
        meta = with_joined_writers(run, meta, derive_status=derive_status)
    return meta


# a run's status is the worst of its writers'
_STATUS_RANK = {"complete": 0, "running": 1, "incomplete": 2, "failed": 3}


def with_joined_writers(
    run: Location, meta: dict[str, Any], *, derive_status: bool = True
) -> dict[str, Any]:
    """run.json ``meta`` with the writers that joined the run counted in: each tag of
    ``joined_writers`` has ``<run>/writers/<tag>.json`` (status, rows, parts, lease), written
    by that writer alone. Rows and parts add up; the status is the worst of all writers'
    (failed > incomplete > running > complete), and ``status_reason`` / ``error`` name the
    writer that set it. A joined writer with no file yet is running while the run is; once
    the run's owner has closed, its missing file makes the run ``incomplete``: its rows are
    not all there."""
    meta = {**meta, "rows": dict(meta.get("rows") or {}), "parts": dict(meta.get("parts") or {})}
    tags = meta[JOINED_WRITERS]
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise TraceSchemaError(
            "expected a list of writer tags", path=run / RUN_JSON, field=JOINED_WRITERS
        )
    for tag, written in _joined_records(run, tags).items():
        if written is None:
            if meta["status"] != "running":
                why = f"left no {JOINED_DIR}/{tag}.json: it never started, or its store lost it"
                _worse(meta, tag, "incomplete", why)
            continue
        for key in ("rows", "parts"):
            for table, count in written[key].items():
                meta[key][table] = int(meta[key].get(table, 0)) + count
        status = written["status"]
        reason = written.get("status_reason") or written.get("error")
        if status == "running" and written.get("lease_expires_at"):
            # the run is open while any writer is: its lease is the last one to end
            leases = [meta.get("lease_expires_at"), written["lease_expires_at"]]
            meta["lease_expires_at"] = max(lease for lease in leases if lease)
            if derive_status and _lease_expired(written):
                status = "incomplete"
                reason = f"its lease ended at {written['lease_expires_at']} without it closing"
        _worse(meta, tag, status, reason)
    return meta


def _joined_records(run: Location, tags: list[str]) -> dict[str, dict[str, Any] | None]:
    """Each joined writer's ``writers/<tag>.json``, checked (None where it is missing)."""
    records: dict[str, dict[str, Any] | None] = {}
    for tag in tags:
        path = run / JOINED_DIR / f"{tag}.json"
        if not path.is_file():
            records[tag] = None
            continue
        written = _json_object(path, "a joined writer's file is missing")
        if written.get("status") not in STATUSES:
            raise TraceSchemaError(
                f"status {written.get('status')!r} is not one of {list(STATUSES)}",
                path=path,
                field="status",
            )
        for key in ("rows", "parts"):
            counts = written.get(key) or {}
            if not isinstance(counts, dict) or not all(
                isinstance(v, int) and not isinstance(v, bool) for v in counts.values()
            ):
                raise TraceSchemaError("expected counts by table", path=path, field=key)
            written[key] = counts
        records[tag] = written
    return records


def joined_record(run_dir: Where, tag: str) -> dict[str, Any] | None:
    """The joined writer ``tag``'s ``writers/<tag>.json`` in run ``run_dir``, checked; None
    where it has none."""
    return _joined_records(resolve_run(run_dir), [tag])[tag]


def _worse(meta: dict[str, Any], tag: str, status: str, reason: str | None) -> None:
    """Make ``status`` (of joined writer ``tag``) the run's when it is worse."""
    if _STATUS_RANK[status] <= _STATUS_RANK[meta["status"]]:
        return
    meta["status"] = status
    meta["status_reason"] = f"joined writer {tag}: {reason or status}"


def complete_run_json(run_dir: Where) -> dict[str, Any] | None:
    """The run.json in ``run_dir`` when it is readable and its status is 'complete' (what a
    writer asks before redoing a run), else None."""
    try:
        meta = read_run_json(run_dir)
    except TraceSchemaError:
        return None
    return meta if meta["status"] == "complete" else None


def resolve_run(where: Where) -> Location:
    """The run at ``where``: a run's directory (either layout) as it is, or the one run of a
    store in the table layout (a writer's store holding one run)."""
    where = Location.of(where)
    if is_partitioned(where) or not (where / RUNS_DIR).is_dir() or (where / RUN_JSON).is_file():
        return where
    runs = [p.parent for p in (where / RUNS_DIR).find(RUN_JSON)]
    if len(runs) != 1:
        raise TraceSchemaError(
            f"a store of {len(runs)} runs, not one run; name one (its _runs/... directory)",
            path=where,
        )
    return runs[0]


def lease_lapsed_s(meta: Mapping[str, Any]) -> float | None:
    """Seconds since a run's lease ended (negative while it holds); None without a lease
    (a writer that never published one, or a closed run)."""
    lease = meta.get("lease_expires_at")
    if not isinstance(lease, str):
        return None
    try:
        return (datetime.now(timezone.utc) - datetime.fromisoformat(lease)).total_seconds()
    except ValueError:
        return None


def _lease_expired(meta: Mapping[str, Any]) -> bool:
    lapsed = lease_lapsed_s(meta)
    return lapsed is not None and lapsed > 0


def run_granularity(meta: Mapping[str, Any]) -> str:
    """What a run holds (``token`` for runs written before granularities existed)."""
    return str(meta.get("granularity", DEFAULT_GRANULARITY))


def _check_optional_fields(meta: Mapping[str, Any], path: Location) -> None:
    """:data:`RUN_OPTIONAL_FIELDS` present in ``meta`` have their types; TraceSchemaError
    naming the dotted field otherwise."""
    for field, expected in RUN_OPTIONAL_FIELDS.items():
        parent, _, key = field.rpartition(".")
        holder = meta.get(parent) if parent else meta
        if not isinstance(holder, dict) or key not in holder:
            continue
        value = holder[key]
        if not isinstance(value, expected) or isinstance(value, bool):
            raise TraceSchemaError(
                f"expected {_type_names(expected)}, got {type(value).__name__}",
                path=path,
                field=field,
            )


def _type_names(expected: type | tuple[type, ...]) -> str:
    types = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join("null" if t is type(None) else t.__name__ for t in types)


def part_files(run_dir: Where, table: str, meta: Mapping[str, Any] | None = None) -> list[Location]:
    """Finished parts of ``table`` in name order, of the run's current compaction
    generation (temporary files are never listed). ``meta``: the run's run.json, read when
    not given and compacted parts are there."""
    return parts_by_generation(run_dir, table, meta)[0]


def parts_by_generation(
    run_dir: Where, table: str, meta: Mapping[str, Any] | None = None
) -> tuple[list[Location], list[Location]]:
    """(:func:`part_files`, the finished parts of ``table`` of any other compaction
    generation: what a compaction in progress or cut short has not yet committed or
    deleted, which no reader lists)."""
    if table not in ALL_TABLES:
        raise TraceSchemaError(f"unknown table {table!r}; expected one of {sorted(ALL_TABLES)}")
    run_dir = resolve_run(run_dir)
    files = table_location(run_dir, table).files(f"{PART_PREFIX}*{PART_SUFFIX}")
    if meta is None and any(f.name.startswith(COMPACTED_PREFIX) for f in files):
        meta = read_run_json(run_dir, derive_status=False)  # which generation is current
    current = current_parts(files, meta or {})
    kept = set(current)
    return current, [f for f in files if f not in kept]


def check_part_schema(path: Where, table: str, *, partitioned: bool = False) -> pa.Schema:
    """Read one part's footer and check version, columns and types against the contract.

    ``partitioned``: the part is in the table layout, where ``dataset`` is the partition's
    (:mod:`dsparklab.store.layout`), not a column of the file."""
    path = Location.of(path)
    try:
        schema = pq.read_schema(path.path, filesystem=path.fs)
    except StoreAccessError:
        raise
    except (pa.ArrowInvalid, OSError) as err:
        raise TraceSchemaError(
            f"unreadable parquet (truncated or not parquet): {err}", path=path
        ) from err
    version = (schema.metadata or {}).get(SCHEMA_VERSION_KEY)
    if version is None:
        raise TraceSchemaError(
            "parquet metadata has no schema version; write parts with TraceWriter",
            path=path,
            field="schema_version",
        )
    if version != str(SCHEMA_VERSION).encode():
        text = version.decode(errors="replace")
        hint = _MIGRATE_HINT.get(int(text), "") if text.isdigit() else ""
        raise TraceSchemaError(
            f"schema version {text} is not supported (this dsparklab reads {SCHEMA_VERSION}){hint}",
            path=path,
            field="schema_version",
        )
    expected = ALL_TABLES[table]
    for field in expected:
        if partitioned and field.name in PARTITION_KEYS:
            if field.name in schema.names:
                raise TraceSchemaError(
                    "a partition key must not be a column of a part in the table layout "
                    "(the directory holds it)",
                    path=path,
                    field=field.name,
                )
            continue
        if field.name not in schema.names:
            raise TraceSchemaError("required column missing", path=path, field=field.name)
        got = schema.field(field.name).type
        if got != field.type:
            raise TraceSchemaError(
                f"type {got} does not match the contract's {field.type}",
                path=path,
                field=field.name,
            )
    return schema


def read_parts(
    run_dir: Where,
    table: str,
    columns: Sequence[str],
    *,
    read_dictionary: Sequence[str] = (),
) -> pa.Table:
    """``columns`` of every finished part of one run's ``table``, checked against the
    contract, as one arrow table (``read_dictionary`` columns come dictionary-encoded).
    In the table layout ``dataset`` comes from the partition."""
    run_dir = resolve_run(run_dir)
    partitioned = is_partitioned(run_dir)
    files = part_files(run_dir, table)
    for path in files:
        check_part_schema(path, table, partitioned=partitioned)
    schema = ALL_TABLES[table]
    if not files:
        return schema.empty_table().select(list(columns))
    constants = partition_values(run_dir) if partitioned else {}
    own = [c for c in columns if c not in constants]
    tables = []
    for path in files:
        with path.fs.open_input_file(path.path) as fh:
            part = pq.ParquetFile(fh, read_dictionary=list(read_dictionary))
            tables.append(part.read(columns=own))
    arrow = tables[0] if len(tables) == 1 else pa.concat_tables(tables, promote_options="none")
    return with_partition_columns(arrow, table, constants).select(list(columns))


def with_partition_columns(arrow: pa.Table, table: str, constants: Mapping[str, str]) -> pa.Table:
    """``arrow`` with the columns of ``table`` its partition holds (``constants``, from
    :func:`~dsparklab.store.layout.partition_values`) added, typed as the contract says."""
    schema = ALL_TABLES[table]
    for name in schema.names:
        if name in constants and name not in arrow.column_names:
            value = pa.array([constants[name]] * arrow.num_rows, schema.field(name).type)
            arrow = arrow.append_column(schema.field(name), value)
    return arrow


# a table-layout store's table directories: parquet partitions only, never a run.json
_TABLE_DIRECTORIES = frozenset({*ALL_TABLES, RUNS_TABLE})


def _table_directories(subdirectories: list[str]) -> frozenset[str]:
    """The subdirectories a walk for run.json need not enter: a store's tables, beside its
    ``_runs`` (on a store of many runs, most of the directories below it)."""
    return _TABLE_DIRECTORIES if RUNS_DIR in subdirectories else frozenset()


def find_runs(root: Where) -> list[Location]:
    """``root`` itself when it is a run, else every run directory below it (sorted).

    Hidden directories (``.<name>``: an import or a migration in progress) are not runs.
    """
    root = Location.of(root)
    if (root / RUN_JSON).is_file():
        return [root]
    runs = [p.parent for p in root.find(RUN_JSON, skip=_table_directories)]
    if not runs:
        if not root.exists() and root.is_local:
            raise TraceSchemaError("no such file or directory", path=root)
        raise TraceSchemaError("no run.json found below this directory", path=root)
    return sorted(runs)


def run_columns(meta: Mapping[str, Any]) -> dict[str, Any]:
    """The run-level values joined onto every row read from this run."""
    drafter = meta.get("drafter") or {}
    return {
        "run_id": meta["run_id"],
        "engine": meta["engine"].get("name", ""),
        "method": meta["method"],
        "n": int(meta["num_speculative_tokens"]),
        "target": meta["target"].get("name", ""),
        "drafter": drafter.get("name", "none"),
        "tier": meta.get("tier", ""),
        # an imported run whose source does not record its temperature stores null: NaN
        "temperature": _float_or_nan(meta["sampling"].get("temperature", 0.0)),
        "dataset": meta["dataset"],
        "concurrency": run_concurrency(meta),
    }


def run_concurrency(meta: Mapping[str, Any]) -> int:
    """The requests the run kept in flight (run.json ``load.concurrency``): 1 for the
    reference engine, which decodes one request at a time; 0 where nothing recorded it
    (an imported run, or one written before runs recorded their load)."""
    recorded = (meta.get("load") or {}).get("concurrency")
    if recorded is not None:
        return int(recorded)
    return 1 if (meta.get("engine") or {}).get("name") == "reference" else 0


def _float_or_nan(value: Any) -> float:
    return float("nan") if value is None else float(value)


def run_field(meta: Mapping[str, Any], key: str) -> Any:
    """A run.json value by run column (``method``, ``n``, ``tier``...) or dotted path
    (``drafter.content_hash``, ``engine.version``, ``tags``); None when absent."""
    columns = run_columns(meta)
    if key in columns:
        return columns[key]
    value: Any = meta
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def _selected(value: Any, wanted: Any, key: str) -> bool:
    """One wanted value: equal; a hash or git sha matched by its prefix; a list field
    (``tags``) holding it."""
    if isinstance(value, list):
        return wanted in value
    if isinstance(wanted, str) and isinstance(value, str) and key.endswith(("hash", "sha")):
        return bool(wanted) and value.split(":", 1)[-1].startswith(wanted.split(":", 1)[-1])
    return bool(value == wanted)


def matches_selection(meta: Mapping[str, Any], selection: Mapping[str, Any]) -> bool:
    """Whether a run's run.json matches every ``key: value`` (a list: any of them) of
    ``selection``; keys as in :func:`run_field`."""
    for key, wanted in selection.items():
        value = run_field(meta, key)
        options = wanted if isinstance(wanted, (list, tuple, set, frozenset)) else [wanted]
        if not any(_selected(value, option, key) for option in options):
            return False
    return True


def store_runs(store: Where) -> list[Location]:
    """The runs of ``store`` in the table layout, listed below its ``_runs`` only (none of
    its tables' parts): what a poller of a live store lists."""
    runs_dir = Location.of(store) / RUNS_DIR
    if not runs_dir.is_dir():
        return []
    return sorted(p.parent for p in runs_dir.find(RUN_JSON))
