"""``dsparklab compact``: rewrite runs as large sorted files in the table layout.

A writer commits a part per flush (50k rows or 30 s), far below the 100 MB - 1 GB files
SQL engines read best, and a store written before the table layout holds one directory
per run. Compaction rewrites every finished run below a store into its partition of the
table layout (:mod:`dsparklab.store.layout`), in files of at most ``file_rows`` rows sorted
by (request_id, step, position), with row groups of ``row_group_rows``:

1. each table's new parts are written as generation ``g + 1`` (``part-c<g+1>-<seq>``),
   which readers ignore while run.json names generation ``g``;
2. run.json is rewritten with ``compaction.generation = g + 1``: the commit, one atomic
   rename on a disk, one PUT on an object store. dsparklab's readers (and the SQL counting
   stage, which lists files through them) see the old parts before it and the new ones
   after it, never both;
3. the old generation's parts (or the old run directory, for a run moved from the old
   layout in place) are deleted.

A compaction killed midway leaves parts run.json does not name; running it again
replaces them (all of them, whatever ``file_rows`` the killed attempt used), and a move out
of the old layout killed after its commit is finished by the next run, not compacted
again. An engine reading a partition directory by itself during step 3 may see both
generations: compact before a query, not during one. Peak memory is one run's table.
``out`` naming the store itself is compaction in place.

A run written as ``running`` is left alone, even one whose lease lapsed (it reads as
``incomplete``): its writer may be alive but slow, and its next run.json, which knows no
compaction, would hide the compacted rows and name parts already deleted. ``stale_after_s``
compacts such a run once its lease lapsed that long ago (its writer is taken for dead).
A run other writers join waits until every one of them has written its file: compaction
folds them into one writer and deletes their files, so a late writer's rows would be lost.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from dsparklab.store.layout import (
    PARTITION_KEYS,
    compacted_part_name,
    compaction_generation,
    is_partitioned,
    run_location,
    store_of,
    table_location,
)
from dsparklab.store.location import Location, Where
from dsparklab.store.reader import (
    find_runs,
    joined_record,
    lease_lapsed_s,
    part_files,
    read_parts,
    read_run_json,
)
from dsparklab.store.schema import ALL_TABLES, JOINED_DIR, JOINED_WRITERS, RUN_JSON, TEMP_SUFFIX
from dsparklab.store.writer import part_bytes, utc_now, write_run_json

logger = logging.getLogger(__name__)

SORT_KEYS = ("request_id", "step", "position")
FILE_ROWS = 32_000_000
ROW_GROUP_ROWS = 1_000_000


@dataclass(frozen=True)
class Compacted:
    """What compaction did to one run."""

    source: Location
    run: Location
    generation: int
    files: dict[str, int]
    rows: dict[str, int]
    skipped: str = ""


def _sorted(table: pa.Table) -> pa.Table:
    keys = [(k, "ascending") for k in SORT_KEYS if k in table.column_names]
    return table.sort_by(keys) if keys and table.num_rows > 1 else table


def compact_store(
    store: Where,
    *,
    out: Where | None = None,
    file_rows: int = FILE_ROWS,
    row_group_rows: int = ROW_GROUP_ROWS,
    stale_after_s: float | None = None,
) -> list[Compacted]:
    """Rewrite every finished run below ``store`` into ``out`` (default: ``store`` itself,
    in place) in the table layout, as large files sorted by (request_id, step, position).

    A run written as ``running`` is left alone unless its lease lapsed more than
    ``stale_after_s`` seconds ago (None: never). Returns one :class:`Compacted` per run
    (``skipped`` says why a run was left alone).
    """
    store = Location.of(store)
    # --out naming the store itself is compaction in place (not a copy beside each run)
    dest_store = Location.of(out) if out is not None and Location.of(out) != store else None
    results = []
    runs = find_runs(store)
    if dest_store is None:  # first, before a run's target is compacted again
        runs = [run for run in runs if not _finish_move(run, store)]
    for run in runs:
        written = read_run_json(run, derive_status=False)
        why = _still_written(written, stale_after_s) or _joined_writer_missing(run, written)
        if why:
            results.append(Compacted(run, run, 0, {}, {}, skipped=why))
            logger.info("skipping %s: %s", run, why)
            continue
        # in place: a run of the table layout stays in its store; one of the old layout
        # moves into the table layout of the store compacted
        home = dest_store or (store_of(run) if is_partitioned(run) else store)
        results.append(_compact_run(run, home, file_rows, row_group_rows))
        if dest_store is None and not is_partitioned(run):
            _remove_moved(run, store)
    return results


def _still_written(written: dict[str, Any], stale_after_s: float | None) -> str:
    """Why a run written as ``running`` must be left alone ('' when it may be compacted)."""
    if written["status"] != "running":
        return ""
    lapsed = lease_lapsed_s(written)
    if lapsed is None or lapsed <= 0:
        return "still being written"
    if stale_after_s is not None and lapsed > stale_after_s:
        return ""
    return (
        f"written as running, its lease lapsed {lapsed:.0f} s ago: its writer may be alive "
        "(--stale-after compacts it once taken for dead)"
    )


def _finish_move(run: Location, store: Location) -> bool:
    """Remove an old-layout ``run`` whose move into ``store``'s table layout was committed
    (the run.json there says it was moved from ``run``) but not finished (a compaction
    killed between its commit and the removal); whether it did."""
    if is_partitioned(run):
        return False
    moved = _existing(run_location(store, read_run_json(run, derive_status=False)))
    if moved is None or (moved.get("compaction") or {}).get("moved_from") != str(run):
        return False
    _remove_moved(run, store)
    logger.info("removed %s: its move into the table layout had been committed", run)
    return True


def _joined_writer_missing(run: Location, written: dict[str, Any]) -> str:
    """Why a run other writers join must wait ('' when every one has written its file):
    compaction folds the writers into one and deletes their files, so a writer that has
    not written yet would lose its rows."""
    missing = [tag for tag in written.get(JOINED_WRITERS) or () if joined_record(run, tag) is None]
    if not missing:
        return ""
    return f"joined writer(s) {', '.join(missing)} have not written their files yet"


def _compact_run(run: Location, home: Location, file_rows: int, row_group_rows: int) -> Compacted:
    written = read_run_json(run, derive_status=False)
    target = run_location(home, written)
    in_place = target == run
    previous = written if in_place else _existing(target)
    generation = compaction_generation(previous) + 1 if previous else 1
    files: dict[str, int] = {}
    rows: dict[str, int] = {}
    for table, schema in ALL_TABLES.items():
        sources = part_files(run, table, written)
        if not sources and not table_location(run, table).is_dir():
            continue  # an aggregate table a token-level run never had
        columns = [c for c in schema.names if c not in PARTITION_KEYS]
        data = _sorted(read_parts(run, table, columns))
        directory = table_location(target, table)
        directory.mkdir()
        _clear_generation(directory, generation)  # a killed attempt's parts, any count
        starts = range(0, data.num_rows, file_rows)
        for seq, start in enumerate(starts):
            chunk = part_bytes(data.slice(start, file_rows), table, row_group_rows)
            (directory / compacted_part_name(generation, seq)).write_bytes(chunk)
        files[table] = len(starts)
        rows[table] = data.num_rows
    # the compacted parts hold every writer's rows: the run has one writer from here on,
    # and its joined writers' own counts (already in ``rows``) must not be added again
    joined = written.get(JOINED_WRITERS)
    committed = {
        **{key: value for key, value in written.items() if key != JOINED_WRITERS},
        "rows": rows,
        "parts": files,
        "compaction": {
            "generation": generation,
            "at": utc_now(),
            "file_rows": file_rows,
            "sorted_by": list(SORT_KEYS),
            **({} if in_place else {"moved_from": str(run)}),
            **({JOINED_WRITERS: joined} if joined else {}),
        },
    }
    write_run_json(target, committed)  # the commit: run.json, its runs row first
    _delete_old(target, generation)
    if joined and in_place:
        (target / JOINED_DIR).delete()
    logger.info("compacted %s -> %s (generation %d)", run, target, generation)
    return Compacted(run, target, generation, files, rows)


def _existing(target: Location) -> dict[str, Any] | None:
    """run.json of a run already at ``target`` (a compaction run again), else None."""
    if not (target / RUN_JSON).is_file():
        return None
    return read_run_json(target, derive_status=False)


def _generation_prefix(generation: int) -> str:
    return compacted_part_name(generation, 0)[: len("part-c000-")]


def _clear_generation(directory: Location, generation: int) -> None:
    """Delete ``generation``'s parts in ``directory``: what a compaction killed before its
    commit left (possibly more files than this attempt writes), which this one replaces."""
    prefix = _generation_prefix(generation)
    for path in directory.files(f"{prefix}*"):
        path.delete()


def _delete_old(target: Location, generation: int) -> None:
    """Delete what the commit made obsolete below the target: the older generations' parts
    and any temporary file a killed write left (readers never list them; validate refuses
    a run holding one)."""
    keep = _generation_prefix(generation)
    for table in ALL_TABLES:
        directory = table_location(target, table)
        if not directory.is_dir():
            continue
        for path in directory.files("part-*.parquet"):
            if not path.name.startswith(keep):
                path.delete()
        for path in directory.walk_files():
            if path.name.startswith(".") and path.name.endswith(TEMP_SUFFIX):
                path.delete()


def _remove_moved(run: Location, store: Location) -> None:
    """Delete a run moved out of the old layout, and the directories it leaves empty; its
    run.json first, so a removal cut short leaves no half run for a reader to count."""
    (run / RUN_JSON).delete()
    run.delete()
    parent = run.parent
    while parent != store and parent.is_dir() and not parent.walk_files():
        parent.delete()
        parent = parent.parent
