"""Where a run's files live: one directory per table, hive-partitioned by the run columns.

A store is laid out so that SQL engines read it natively (no glob, the run columns come
from the directory names)::

    <store>/positions/dataset=<d>/method=<m>/n=<k>/run_id=<slug>/part-*.parquet
    <store>/steps/...same partition.../part-*.parquet
    <store>/requests/...                 (and counters/, totals/, calibration/)
    <store>/runs/...same partition.../part-00000.parquet    the runs table: one row per run
    <store>/_runs/...same partition.../run.json             the run's metadata and status

``spark.read.parquet("<store>/positions")`` and DuckDB's ``read_parquet("<store>/positions",
hive_partitioning = true)`` both give the table with ``dataset``, ``method``, ``n`` and
``run_id`` columns. Two decisions follow from the engines:

- ``dataset`` is a partition key, and Spark refuses a data column with a partition key's
  name, so the files of ``steps`` and ``requests`` in this layout do not hold it: a run is
  one dataset, and the readers give every row the partition's value.
- Partition values are escaped as Hive escapes them (``%XX`` for ``/``, ``=``, ``%``,
  ``:``, ``#``, quotes, brackets, control characters...; every other character as is), and
  both engines unescape them: ``run_id=gsm8k%2Fdspark-n3`` reads as ``gsm8k/dspark-n3``.

``_runs`` starts with an underscore so engines listing the store skip it, and holds
run.json (rewritten at every flush) apart from the ``runs`` table's parquet files.

Every writer writes this layout (:class:`~dsparklab.store.writer.TraceWriter`). Stores
written before it (one directory per run holding ``run.json`` and a directory per table)
are still read, and ``dsparklab compact`` moves them here. A run is addressed by the
directory holding its run.json in either layout, and :func:`table_location` says where
that run's table is.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dsparklab.store.location import Location, Where

RUNS_DIR = "_runs"
RUNS_TABLE = "runs"
RUNS_ROW = "part-00000.parquet"  # a run's one file in the runs table
PARTITION_KEYS = ("dataset", "method", "n", "run_id")
# what Hive (and Spark: ExternalCatalogUtils.charToEscape) escapes in a partition value
_ESCAPED = frozenset("\"#%'*/:=?\\\x7f{[]^ <>|")


def partition_value(value: Any) -> str:
    """``value`` as a partition directory's value: Hive's escaping (``/`` -> ``%2F``)."""
    text = str(value)
    if not text:
        return "__HIVE_DEFAULT_PARTITION__"
    return "".join(f"%{ord(c):02X}" if c in _ESCAPED or ord(c) < 0x20 else c for c in text)


def partition_path(meta: Mapping[str, Any]) -> str:
    """``dataset=<d>/method=<m>/n=<k>/run_id=<slug>`` of a run.json."""
    values = {
        "dataset": meta["dataset"],
        "method": meta["method"],
        "n": int(meta["num_speculative_tokens"]),
        "run_id": meta["run_id"],
    }
    return "/".join(f"{key}={partition_value(values[key])}" for key in PARTITION_KEYS)


def run_location(store: Where, meta: Mapping[str, Any]) -> Location:
    """The directory holding a run's run.json in ``store``."""
    return Location.of(store) / RUNS_DIR / partition_path(meta)


def is_partitioned(run: Location) -> bool:
    """Whether ``run`` (the directory of a run.json) is in the table layout."""
    parts = run.path.rstrip("/").split("/")
    return (
        len(parts) > len(PARTITION_KEYS)
        and parts[-len(PARTITION_KEYS) - 1] == RUNS_DIR
        and all(p.startswith(f"{k}=") for p, k in zip(parts[-4:], PARTITION_KEYS, strict=True))
    )


def _split(run: Location) -> tuple[Location, str]:
    """(store, partition path) of a run in the table layout (string work: it runs for
    every run of a listing)."""
    parts = run.path.rstrip("/").split("/")
    cut = len(parts) - len(PARTITION_KEYS) - 1  # parts[cut] is _runs
    store = "/".join(parts[:cut]) or "/"
    return Location(run.fs, store, run.scheme), "/".join(parts[cut + 1 :])


def store_of(run: Location) -> Location:
    """The store a run belongs to: its ``_runs``' parent, or a legacy run's parent."""
    return _split(run)[0] if is_partitioned(run) else run.parent


def table_location(run: Where, table: str) -> Location:
    """The directory of ``run``'s parts of ``table`` (in either layout)."""
    run = Location.of(run)
    if not is_partitioned(run):
        return run / table
    store, partition = _split(run)
    return store / table / partition


def run_tables(run: Where, tables: tuple[str, ...]) -> list[Location]:
    """Every directory holding ``run``'s files: its run.json's and each table's."""
    run = Location.of(run)
    if not is_partitioned(run):
        return [run]
    return [run, *(table_location(run, t) for t in (*tables, RUNS_TABLE))]


def partition_values(run: Location) -> dict[str, str]:
    """The partition keys' values of a run in the table layout, unescaped."""
    parts = run.path.rstrip("/").split("/")[-len(PARTITION_KEYS) :]
    return {k: _unescape(p.split("=", 1)[1]) for k, p in zip(PARTITION_KEYS, parts, strict=True)}


def runs_named(run_dirs: Iterable[Where], store: Where, prefix: str) -> list[Location]:
    """The runs among ``run_dirs`` that ``store`` holds in the table layout under a run_id
    starting with ``prefix`` (a process's recorders also list runs it wrote elsewhere or
    for an earlier engine)."""
    store = Location.of(store)
    return [
        run
        for run in map(Location.of, run_dirs)
        if is_partitioned(run)
        and store_of(run) == store
        and partition_values(run)["run_id"].startswith(prefix)
    ]


def _unescape(text: str) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] == "%" and _is_hex(text[i + 1 : i + 3]):
            out.append(chr(int(text[i + 1 : i + 3], 16)))
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _is_hex(text: str) -> bool:
    return len(text) == 2 and all(c in "0123456789abcdefABCDEF" for c in text)


# -- compaction generations ----------------------------------------------------------------
# A compacted run's parts are ``part-c<generation>-<seq>.parquet``; run.json's
# ``compaction.generation`` says which generation is the run's (its rewrite is the commit).
COMPACTED_PREFIX = "part-c"


def compacted_part_name(generation: int, seq: int) -> str:
    """The name of a compacted part: ``part-c<generation:03d>-<seq:05d>.parquet``."""
    return f"{COMPACTED_PREFIX}{generation:03d}-{seq:05d}.parquet"


def compaction_generation(meta: Mapping[str, Any]) -> int:
    """The generation of a run's parts (0: as its writer wrote them)."""
    compaction = meta.get("compaction")
    return int(compaction.get("generation", 0)) if isinstance(compaction, Mapping) else 0


def current_parts(files: list[Location], meta: Mapping[str, Any]) -> list[Location]:
    """The parts of ``files`` that belong to the run's current generation: a compaction in
    progress (or killed) has written parts run.json does not name yet, and a finished one
    may not have deleted the previous generation's."""
    generation = compaction_generation(meta)
    if generation:
        prefix = f"{COMPACTED_PREFIX}{generation:03d}-"
        return [f for f in files if f.name.startswith(prefix)]
    return [f for f in files if not f.name.startswith(COMPACTED_PREFIX)]
