"""The catalog: a store's runs, listed once, with their run.json.

Every reader above the store asks the catalog, never a path: which runs a store holds (one
row per run, the run columns of :func:`~dsparklab.store.reader.run_columns` plus status,
granularity, ``sample``, ``path`` and ``root``), a run's run.json by run_id or path, which
runs a selection of run.json fields keeps, how many rows they recorded, and a cheap
fingerprint of the whole for provenance. Listing an object store costs one request per
prefix and reading a run.json one per run, so a notebook or a report opens its catalog once
and hands it on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from dsparklab.errors import TraceSchemaError
from dsparklab.store.layout import PARTITION_KEYS, is_partitioned, store_of
from dsparklab.store.location import Location, Where
from dsparklab.store.reader import (
    Filters,
    check_part_schema,
    find_runs,
    matches_selection,
    part_files,
    read_run_json,
    run_columns,
    run_granularity,
)
from dsparklab.store.sampling import run_sample
from dsparklab.store.schema import ALL_TABLES, RUN_COLUMNS, RUN_JSON, STATUSES

CATALOG_COLUMNS = (
    *RUN_COLUMNS,
    "status",
    "created_at",
    "granularity",
    "sample",
    "path",
    "root",
)


@dataclass(frozen=True)
class Catalog:
    """The runs below ``roots``, each listed and its run.json read once.

    Two runs of one root holding one run_id are refused (every table joins the runs on
    run_id, so both would count twice).
    """

    roots: tuple[Location, ...]
    runs: pd.DataFrame
    metas: Mapping[str, dict[str, Any]] = field(repr=False)  # path -> run.json

    @classmethod
    def of(cls, *roots: Where) -> Catalog:
        """List the runs below each root (a run directory, a store in either layout, or a
        directory of stores; local or ``s3://``).

        Raises
        ------
        TraceSchemaError
            A root holding no run, an invalid run.json, or a run_id held twice: one line
            naming the file and field.
        """
        locations = tuple(Location.of(r) for r in roots)
        rows: list[dict[str, Any]] = []
        metas: dict[str, dict[str, Any]] = {}
        for root in locations:
            for run_dir in find_runs(root):
                meta = read_run_json(run_dir)
                metas[str(run_dir)] = meta
                rows.append(
                    {
                        **run_columns(meta),
                        "status": meta["status"],
                        "created_at": meta["created_at"],
                        "granularity": run_granularity(meta),
                        "sample": run_sample(meta),
                        "path": str(run_dir),
                        "root": str(root),
                    }
                )
        return cls._checked(locations, pd.DataFrame(rows, columns=list(CATALOG_COLUMNS)), metas)

    @classmethod
    def _checked(
        cls, roots: tuple[Location, ...], runs: pd.DataFrame, metas: dict[str, dict[str, Any]]
    ) -> Catalog:
        # within a root: every table of a store joins its runs on run_id (across roots the
        # lab counts root by root, and the shipped traces may reuse a demo's run_ids)
        twice = runs[runs.duplicated(["root", "run_id"], keep=False)]
        if len(twice):
            run_id = twice["run_id"].iloc[0]
            first, again = twice.loc[twice["run_id"] == run_id, "path"].iloc[:2]
            raise TraceSchemaError(
                f"run_id {run_id!r} is also the run_id of "
                f"{Location.of(first) / RUN_JSON}: a store holds each run once (remove one "
                "copy; `dsparklab compact` leaves one)",
                path=Location.of(again) / RUN_JSON,
                field="run_id",
            )
        return cls(roots, runs, metas)

    def run_json(self, run: str | Location) -> dict[str, Any]:
        """A listed run's run.json, by its path or its run_id (as listed: the status a
        lapsed lease derives included)."""
        key = str(run)
        if key in self.metas:
            return self.metas[key]
        paths = self.runs.loc[self.runs["run_id"] == key, "path"]
        if paths.empty:
            raise TraceSchemaError(
                f"no run {key!r} in this catalog of {', '.join(map(str, self.roots))}"
            )
        return self.metas[str(paths.iloc[0])]

    def only(self, root: Where) -> Catalog:
        """The runs found below ``root``, one of this catalog's roots."""
        root = Location.of(root)
        runs = self.runs[self.runs["root"] == str(root)].reset_index(drop=True)
        return Catalog((root,), runs, {p: self.metas[p] for p in runs["path"]})

    def with_status(self, statuses: Iterable[str] = STATUSES) -> pd.DataFrame:
        """The runs whose status is in ``statuses``."""
        return self.runs[self.runs["status"].isin(list(statuses))]

    def matching(self, selection: Mapping[str, Any], runs: pd.DataFrame | None = None) -> pd.Series:
        """Which of ``runs`` (default: all) match every ``key: value`` of ``selection``
        (run columns, dotted run.json paths, hash prefixes, tags:
        :func:`~dsparklab.store.reader.matches_selection`), as a boolean Series."""
        table = self.runs if runs is None else runs
        keep = pd.Series(True, index=table.index, dtype=bool)
        rest = {}
        for key, wanted in selection.items():
            if key in RUN_COLUMNS:  # a column of the listing: one hashed lookup per run
                many = isinstance(wanted, (list, tuple, set, frozenset))
                keep &= table[key].isin(list(wanted) if many else [wanted])
            else:
                rest[key] = wanted
        if rest:
            keep &= pd.Series(
                [matches_selection(self.metas[str(p)], rest) for p in table["path"]],
                index=table.index,
                dtype=bool,
            )
        return keep

    def recorded_rows(self, runs: pd.DataFrame | None = None, table: str = "positions") -> int:
        """Rows of ``table`` the runs' writers recorded (run.json's ``rows``)."""
        paths = (self.runs if runs is None else runs)["path"]
        return sum(int((self.metas[str(p)].get("rows") or {}).get(table, 0)) for p in paths)

    def parts(self, runs: pd.DataFrame, table: str) -> list[Location]:
        """The current parts of ``table`` of each of ``runs`` (rows of :attr:`runs`): the
        finished parts of the compaction generation its run.json names."""
        return [
            part
            for path in runs["path"]
            for part in part_files(Location.of(path), table, self.metas[str(path)])
        ]

    def table_directory(self, table: str) -> Location | None:
        """``<root>/<table>`` when every run of this one-root catalog is in the table layout
        of that root (engines then read the directory's partitions natively), else None."""
        (root,) = self.roots
        paths = [Location.of(p) for p in self.runs["path"]]
        if paths and all(is_partitioned(p) and store_of(p) == root for p in paths):
            return root / table
        return None

    def dataset(self, table: str, *, statuses: Iterable[str] = STATUSES) -> ds.Dataset:
        """Every listed run's parts of ``table`` as one pyarrow dataset, in either layout.

        The schema is the contract's for ``table`` plus the run columns ``dataset``,
        ``method``, ``n`` and ``run_id`` (:data:`RUN_FIELDS`), which each file gets from its
        run's run.json (a partition expression per file: nothing is read to add them). Runs
        whose status is not in ``statuses`` are left out, and so are the parts of a
        compaction run.json does not name. An SQL engine scans it with projection and
        filters pushed down (DuckDB: ``con.register(name, dataset)``), also from an object
        store.
        """
        schema = ALL_TABLES.get(table)
        if schema is None:
            raise TraceSchemaError(f"unknown table {table!r}; expected one of {sorted(ALL_TABLES)}")
        full = pa.schema([*schema, *(f for f in RUN_FIELDS if f.name not in schema.names)])
        paths: list[str] = []
        partitions: list[ds.Expression] = []
        for path in self.with_status(statuses)["path"]:
            run_dir, meta = Location.of(path), self.metas[str(path)]
            columns = run_columns(meta)
            expr = ds.scalar(True)
            for run_field in RUN_FIELDS:
                value = pa.scalar(columns[run_field.name], run_field.type)
                expr = expr & (pc.field(run_field.name) == value)
            for part in part_files(run_dir, table, meta):
                check_part_schema(part, table, partitioned=is_partitioned(run_dir))
                paths.append(part.path)
                partitions.append(expr)
        return ds.FileSystemDataset.from_paths(
            paths,
            schema=full,
            format=ds.ParquetFileFormat(),
            filesystem=self.roots[0].fs,
            partitions=partitions,
        )

    def fingerprint(self) -> str:
        """``sha256:<hex>`` over every run's run.json and the names and sizes of the files
        below the roots: changes when a run is added, closed, compacted or appended to, and
        costs one listing per root, not a read of every part (what provenance records for a
        report's input)."""
        digest = hashlib.sha256()
        for path in sorted(self.metas):
            digest.update(f"{path}\0{json.dumps(self.metas[path], sort_keys=True)}\0".encode())
        for root in self.roots:
            for name, size in root.file_sizes():
                digest.update(f"{root}/{name}\0{size}\0".encode())
        return f"sha256:{digest.hexdigest()}"


# Run columns every table gets in :meth:`Catalog.dataset` (the table layout's partition keys).
RUN_FIELDS = (
    pa.field("dataset", pa.string()),
    pa.field("method", pa.string()),
    pa.field("n", pa.int64()),
    pa.field("run_id", pa.string()),
)


def holds_runs(root: Where) -> bool:
    """Whether a run (a run.json) is below ``root``, which need not exist."""
    root = Location.of(root)
    return root.is_dir() and next(iter(root.find(RUN_JSON)), None) is not None


def catalog_of(source: Where | Catalog) -> Catalog:
    """``source`` when it is a catalog, else the catalog of the runs below it."""
    return source if isinstance(source, Catalog) else Catalog.of(source)


def list_runs(root: Where | Catalog) -> pd.DataFrame:
    """One row per run below ``root`` (:attr:`Catalog.runs`)."""
    return catalog_of(root).runs


def _matches(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, (list, tuple, set, frozenset)):
        return value in wanted
    return bool(value == wanted)


def _row_filter(filters: Filters) -> ds.Expression | None:
    expr: ds.Expression | None = None
    for name, wanted in filters.items():
        values = list(wanted) if isinstance(wanted, (list, tuple, set, frozenset)) else [wanted]
        term = pc.field(name).isin(values)
        expr = term if expr is None else expr & term
    return expr


def read_trace(
    root: Where | Catalog,
    table: str = "positions",
    *,
    columns: Sequence[str] | None = None,
    filters: Filters | None = None,
    statuses: Iterable[str] = STATUSES,
) -> pd.DataFrame:
    """Load ``table`` from one run or every run below ``root``, run metadata joined.

    Parameters
    ----------
    root
        A run directory or a directory of runs, or their catalog (listed once).
    table
        ``"steps"``, ``"positions"``, ``"requests"``, or one of the aggregate tables of runs
        without token-level rows (``"counters"``, ``"totals"``, ``"calibration"``).
    columns
        Table columns to read (run-level columns are always added); None reads all.
    filters
        ``{column: value or list of values}``. Run-level columns (method, n, dataset,
        engine, ...) select runs; table columns are pushed down to parquet.
    statuses
        Run statuses to include; incomplete runs are readable up to their last part.
    """
    filters = dict(filters or {})
    schema = ALL_TABLES.get(table)
    if schema is None:
        raise TraceSchemaError(f"unknown table {table!r}; expected one of {sorted(ALL_TABLES)}")
    for name in [*(columns or []), *(k for k in filters if k not in RUN_COLUMNS)]:
        if name not in schema.names:
            raise TraceSchemaError(
                f"unknown column for table {table!r}; expected one of {schema.names}",
                field=name,
            )
    wanted_columns = list(columns) if columns is not None else list(schema.names)

    frames: list[pd.DataFrame] = []
    catalog = catalog_of(root)
    for path in catalog.with_status(statuses)["path"]:
        run_dir, meta = Location.of(path), catalog.metas[str(path)]
        constants = run_columns(meta)
        partitioned = is_partitioned(run_dir)
        # the table's own column decides, unless the partition holds it (table layout)
        own = [c for c in schema.names if not (partitioned and c in PARTITION_KEYS)]
        run_level = {k: v for k, v in filters.items() if k in RUN_COLUMNS and k not in own}
        if not all(_matches(constants[k], v) for k, v in run_level.items()):
            continue
        files = part_files(run_dir, table, meta)
        for path in files:
            check_part_schema(path, table, partitioned=partitioned)
        if not files:
            continue
        dataset = ds.dataset(
            [p.path for p in files],
            schema=pa.schema([schema.field(c) for c in own]),
            format="parquet",
            filesystem=files[0].fs,
        )
        expr = _row_filter({k: v for k, v in filters.items() if k not in run_level})
        try:
            arrow = dataset.to_table(columns=[c for c in wanted_columns if c in own], filter=expr)
        except (pa.ArrowInvalid, OSError) as err:
            raise TraceSchemaError(f"unreadable part: {err}", path=run_dir / table) from err
        frame = arrow.to_pandas()
        for name, value in constants.items():
            if name not in frame.columns:
                frame[name] = value
        rest = [c for c in frame.columns if c not in wanted_columns]
        frames.append(frame[[*wanted_columns, *rest]])  # a partition's column in its place
    if not frames:
        empty = schema.empty_table().select(wanted_columns).to_pandas()
        for name in RUN_COLUMNS:
            if name not in empty.columns:
                empty[name] = pd.Series(dtype=object)
        return empty
    return pd.concat(frames, ignore_index=True)


def table_dataset(
    root: Where | Catalog, table: str, *, statuses: Iterable[str] = STATUSES
) -> ds.Dataset:
    """Every run's parts of ``table`` below ``root`` as one pyarrow dataset
    (:meth:`Catalog.dataset`)."""
    return catalog_of(root).dataset(table, statuses=statuses)


def hive_table(root: Where | Catalog, table: str) -> Location | None:
    """``<root>/<table>`` when every run below a local ``root`` is in the table layout, so
    engines read the directory natively (``spark.read.parquet``, DuckDB's ``read_parquet(...,
    hive_partitioning = true)``); None otherwise, and for an object store (read
    :func:`table_dataset` instead)."""
    catalog = catalog_of(root)
    return catalog.table_directory(table) if catalog.roots[0].is_local else None
