"""The engines that run the counting queries: DuckDB (embedded, the default) and Spark.

An engine is opened on a store and a ``runs`` frame (the selected runs, one row each with
the run columns) and registers the relations :mod:`dsparklab.analysis.sql.queries` reads:
``runs`` and each table the query needs (``positions``, ``steps``) with its ``run_id``.
Where the store is in the table layout (``Catalog.table_directory``: ``<store>/<table>/dataset=.../
method=.../n=.../run_id=.../part-*.parquet``) both engines read the directory natively,
the run columns taken from the partition names; otherwise DuckDB reads the store's
pyarrow dataset (``Catalog.dataset``: either layout, local or ``s3://``). Spark reads the
table layout only.

- DuckDB: an in-memory connection per call (``threads`` sets its worker threads,
  ``memory_limit`` the memory past which its joins and aggregates spill to a temporary
  directory of the system's, removed at close).
- Spark: ``SparkSession.builder.getOrCreate()``, so the master and settings come from
  Spark's own configuration (``$SPARK_CONF_DIR/spark-defaults.conf``, ``spark-submit
  --master``, ``PYSPARK_SUBMIT_ARGS``, the ``MASTER`` variable spark-submit reads, or a
  session the caller built first); the relations live in a ``newSession()`` of it, so
  concurrent calls do not see each other's views.
"""

from __future__ import annotations

import shutil
import tempfile
import warnings
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pandas as pd
import pyarrow as pa

from dsparklab.errors import DSparkLabError, UnknownMethodError
from dsparklab.store.catalog import Catalog, catalog_of, hive_table
from dsparklab.store.location import Location, Where
from dsparklab.store.schema import RUN_COLUMNS, STATUSES, TABLES

# The columns the queries read from each table (run_id comes from the store's partitions).
TABLE_COLUMNS: dict[str, tuple[str, ...]] = {
    "positions": ("request_id", "step", "position", "accepted", "confidence"),
    "steps": (
        "request_id",
        "prompt_id",
        "step",
        "context_len",  # the context and depth bins
        "num_drafted",
        "num_verified",
        "accepted_len",
        "emitted",
        "batch_size",  # step times by runtime batch size
        "draft_time_s",
        "verify_time_s",
        "other_time_s",
    ),
}
RUN_TYPES: dict[str, pa.DataType] = {
    **dict.fromkeys(RUN_COLUMNS, pa.string()),
    "n": pa.int64(),
    "temperature": pa.float64(),
    "concurrency": pa.int64(),
}
RUNS_SCHEMA = pa.schema([pa.field(name, RUN_TYPES[name]) for name in RUN_COLUMNS])


def table_schema(table: str) -> pa.Schema:
    """The relation a query sees for ``table``: ``run_id`` and :data:`TABLE_COLUMNS`."""
    contract = TABLES[table]
    fields = [pa.field("run_id", pa.string())]
    fields += [pa.field(name, contract.field(name).type) for name in TABLE_COLUMNS[table]]
    return pa.schema(fields)


def runs_table(runs: pd.DataFrame, extra: Iterable[str] = ()) -> pa.Table:
    """The ``runs`` relation: the run columns of ``runs``, typed, then the ``extra``
    columns of frames counted in memory (their types as pandas holds them)."""
    runs = runs.reset_index(drop=True)
    table = pa.Table.from_pandas(runs[list(RUN_COLUMNS)], schema=RUNS_SCHEMA, preserve_index=False)
    for name in extra:
        table = table.append_column(name, pa.Array.from_pandas(runs[name]))
    return table


def _quoted(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _run_filter(run_ids: Sequence[str]) -> str:
    """A WHERE clause keeping the rows of ``run_ids`` (the dataset prunes the others' files)."""
    return f" WHERE run_id IN ({', '.join(_quoted(r) for r in run_ids) or 'NULL'})"


class Engine(ABC):
    """An engine holding the relations of one store; :meth:`query` runs a query text."""

    name: str

    @abstractmethod
    def query(self, sql: str) -> pd.DataFrame:
        """The result of ``sql`` as a DataFrame."""

    @abstractmethod
    def close(self) -> None:
        """Drop the relations (and the connection, for DuckDB)."""

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DuckDBEngine(Engine):
    """DuckDB in process: the table layout read natively, any other store as a dataset."""

    name = "duckdb"

    def __init__(
        self,
        catalog: Catalog,
        runs: pd.DataFrame,
        tables: Iterable[str],
        *,
        every_run: bool = True,
        statuses: Iterable[str] = STATUSES,
        threads: int | None = None,
        memory_limit: str | None = None,
    ) -> None:
        self._connect(runs, threads, memory_limit)
        for table in tables:
            if table != "runs":
                self._register(catalog, runs, table, every_run, tuple(statuses))

    def _register(
        self,
        catalog: Catalog,
        runs: pd.DataFrame,
        table: str,
        every_run: bool,
        statuses: tuple[str, ...],
    ) -> None:
        columns = ", ".join(table_schema(table).names)
        if hive_table(catalog, table) is not None:
            # DuckDB's own reader over the parts dsparklab lists (a compaction's other
            # generation is never read), the run columns from the partition names
            files = [str(p.local_path()) for p in catalog.parts(runs, table)]
            if files:
                listed = ", ".join(_quoted(f) for f in files)
                source = (
                    f"read_parquet([{listed}], hive_partitioning = true, "
                    "hive_types = {'run_id': VARCHAR})"
                )
                self.con.execute(f"CREATE VIEW {table} AS SELECT {columns} FROM {source}")
                return
            self.con.register(f"{table}_parts", table_schema(table).empty_table())
        else:  # either layout, local or s3://: the store's pyarrow dataset
            self.con.register(f"{table}_parts", catalog.dataset(table, statuses=statuses))
        where = "" if every_run else _run_filter(list(runs["run_id"]))
        self.con.execute(f"CREATE VIEW {table} AS SELECT {columns} FROM {table}_parts{where}")

    def _connect(
        self,
        runs: pd.DataFrame,
        threads: int | None,
        memory_limit: str | None,
        extra: Iterable[str] = (),
    ) -> None:
        import duckdb

        self.con = duckdb.connect()
        # spills go below the system's temporary directory, not ./.tmp (DuckDB's default)
        self.scratch = tempfile.mkdtemp(prefix="dsparklab-duckdb-")
        self.con.execute(f"SET temp_directory = {_quoted(self.scratch)}")
        if threads:
            self.con.execute(f"SET threads = {int(threads)}")
        if memory_limit:
            self.con.execute(f"SET memory_limit = {_quoted(memory_limit)}")
        self.con.execute("SET preserve_insertion_order = false")
        self.con.register("runs", runs_table(runs, extra))

    def query(self, sql: str) -> pd.DataFrame:
        return self.con.sql(sql).to_arrow_table().to_pandas()

    def close(self) -> None:
        self.con.close()
        shutil.rmtree(self.scratch, ignore_errors=True)


class FramesEngine(DuckDBEngine):
    """DuckDB over frames in memory: the same relations, registered from the frames
    rather than read from a store (``frames``: table name -> rows with ``run_id``;
    ``extra``: grouping columns of ``runs`` besides the run columns)."""

    def __init__(
        self,
        runs: pd.DataFrame,
        frames: dict[str, pd.DataFrame | None],
        *,
        extra: Iterable[str] = (),
        threads: int | None = None,
    ) -> None:
        self._connect(runs, threads, None, extra)
        for table, frame in frames.items():
            self.con.register(table, frame_table(table, frame))


def frame_table(table: str, frame: pd.DataFrame | None) -> pa.Table:
    """``table``'s relation from ``frame``: the columns the queries read, null where the
    frame lacks one (no rows when ``frame`` is None); other columns keep their dtypes."""
    schema = table_schema(table)
    if frame is None:
        return schema.empty_table()
    present = [name for name in schema.names if name in frame.columns]
    data = pa.Table.from_pandas(frame[present], preserve_index=False)
    for field in schema:
        if field.name not in present:
            data = data.append_column(field, pa.nulls(len(frame), field.type))
    return data.select(schema.names)


class SparkEngine(Engine):
    """Spark SQL over the table layout, in a new session of the active SparkSession."""

    name = "spark"

    def __init__(
        self,
        catalog: Catalog,
        runs: pd.DataFrame,
        tables: Iterable[str],
        *,
        every_run: bool = True,
        statuses: Iterable[str] = STATUSES,
        threads: int | None = None,
        memory_limit: str | None = None,
    ) -> None:
        # the runs' own parts are read; Spark sizes itself from its configuration
        del every_run, statuses, threads, memory_limit
        tables = [t for t in tables if t != "runs"]
        directories = {t: catalog.table_directory(t) for t in tables}
        if any(directory is None for directory in directories.values()):
            store = catalog.roots[0]
            raise DSparkLabError(
                f"engine='spark' reads stores in the table layout only, and not every run "
                f"below {store} is in it; run `dsparklab compact {store}` to move them there"
            )
        active = _spark_session()
        try:
            self.session = active.newSession()
        except NotImplementedError:  # Spark Connect: a client's session is its own already
            self.session = active
        self.views: list[str] = []
        self._register_runs(runs)
        for table, directory in directories.items():
            assert directory is not None
            self._register(catalog, runs, table, directory)

    def _register_runs(self, runs: pd.DataFrame) -> None:
        arrow = runs_table(runs)
        rows = [tuple(row[c] for c in arrow.column_names) for row in arrow.to_pylist()]
        self._view("runs", self.session.createDataFrame(rows, schema=_ddl(RUNS_SCHEMA)))

    def _register(
        self, catalog: Catalog, runs: pd.DataFrame, table: str, directory: Location
    ) -> None:
        schema = table_schema(table)
        files = [_spark_uri(p) for p in catalog.parts(runs, table)]
        if files:
            # the parts dsparklab lists, partitions found below basePath; the partition
            # keys typed in the schema, so run_id stays a string whatever it looks like
            reader = self.session.read.schema(_ddl(schema)).option(
                "basePath", _spark_uri(directory)
            )
            frame = reader.parquet(*files)
        else:  # no selected run wrote this table (e.g. only target-only baselines)
            frame = self.session.createDataFrame([], schema=_ddl(schema))
        self._view(table, frame.select(*schema.names))

    def _view(self, name: str, frame: Any) -> None:
        frame.createOrReplaceTempView(name)
        self.views.append(name)

    def query(self, sql: str) -> pd.DataFrame:
        with warnings.catch_warnings():
            # pyspark 4.3 warns that it does not fully support pandas 3 (toArrow does not
            # go through pandas)
            warnings.simplefilter("ignore", FutureWarning)
            return self.session.sql(sql).toArrow().to_pandas()

    def close(self) -> None:
        for name in self.views:
            self.session.catalog.dropTempView(name)
        self.views = []


_SPARK_TYPES = {
    pa.string(): "STRING",
    pa.int32(): "INT",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
}


def _ddl(schema: pa.Schema) -> str:
    """A Spark DDL schema string (``name TYPE, ...``) of a flat arrow schema."""
    return ", ".join(f"{f.name} {_SPARK_TYPES[f.type]}" for f in schema)


def _spark_uri(directory: Location) -> str:
    """The URI Spark reads ``directory`` by: file:// locally, s3a:// for an S3 store.

    Not percent-encoded: Hadoop's Path escapes the name itself (a partition's ``%2F`` is
    part of the directory's name)."""
    if directory.is_local:
        return f"file://{directory.local_path().resolve()}"
    return "s3a://" + directory.uri.split("://", 1)[-1]


def _spark_session() -> Any:
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise DSparkLabError(
            "engine='spark' needs pyspark: pip install 'dsparklab[spark]' (and a Java runtime)"
        ) from None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return SparkSession.builder.appName("dsparklab").getOrCreate()
    except Exception as err:  # e.g. no Java: PySparkRuntimeError JAVA_GATEWAY_EXITED
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise DSparkLabError(f"could not start Spark: {first}") from err


ENGINES: dict[str, Callable[..., Engine]] = {"duckdb": DuckDBEngine, "spark": SparkEngine}


def open_engine(
    name: str,
    root: Where | Catalog,
    runs: pd.DataFrame,
    tables: Iterable[str],
    *,
    every_run: bool = True,
    statuses: Iterable[str] = STATUSES,
    threads: int | None = None,
    memory_limit: str | None = None,
) -> Engine:
    """Open engine ``name`` (:data:`ENGINES`) on ``root`` with the ``runs`` relation.

    Parameters
    ----------
    name
        ``"duckdb"`` or ``"spark"``.
    root
        The store (a local directory or ``s3://``; Spark: the table layout), or its
        catalog already opened (:class:`~dsparklab.store.Catalog`).
    runs
        The selected runs, one row each with the run columns (``list_runs`` rows).
    tables
        The relations the queries will read (``positions``, ``steps``, ``runs``).
    every_run
        False when ``runs`` leaves out some runs below ``root`` (by status or filter):
        the others' files are then pruned before a row is read.
    statuses
        Run statuses whose rows a dataset-read store includes.
    threads
        DuckDB's worker threads (default: DuckDB's, the CPU count).
    memory_limit
        DuckDB's memory limit, e.g. ``"3GB"`` (default: DuckDB's, 80 % of RAM); past it
        joins and aggregates spill to disk.
    """
    if name not in ENGINES:
        raise UnknownMethodError(f"unknown engine {name!r}; valid engines are {sorted(ENGINES)}")
    return ENGINES[name](
        catalog_of(root),
        runs,
        tables,
        every_run=every_run,
        statuses=statuses,
        threads=threads,
        memory_limit=memory_limit,
    )
