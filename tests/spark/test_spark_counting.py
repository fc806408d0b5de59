"""The SQL counting stage on Spark local[2]: every counter equals the in-process path's and
DuckDB's, on the store of every shape (counting_cases.py) in the table layout.

One module, one store fixture, one Spark session: each query is a few seconds of Spark.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest
from counting_cases import CASES, assert_same_counts, in_process, write_store
from typer.testing import CliRunner

from dsparklab.analysis import aggregate_store
from dsparklab.cli.app import app
from dsparklab.store import hive_table, read_trace
from dsparklab.store.compact import compact_store
from tests.oracles import count_acceptance, count_calibration


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The store as TraceWriter wrote it, and compacted into the table layout in files of
    at most 40 rows (several parts per partition, as a writer's flushes leave them)."""
    written = write_store(str(tmp_path_factory.mktemp("written")))
    table = tmp_path_factory.mktemp("table")
    compact_store(written, out=table, file_rows=40, row_group_rows=16)
    assert hive_table(table, "positions") is not None
    return {"written": written, "table": str(table)}


def test_spark_counts_equal_the_in_process_and_duckdb_counts(
    spark: object, stores: dict[str, str]
) -> None:
    for case in CASES:
        want = in_process(stores["written"], case)
        on_spark = aggregate_store(stores["table"], engine="spark", **case.store_args())
        assert_same_counts(on_spark, want, what=f"spark: {case.name}")
        on_duckdb = aggregate_store(stores["table"], **case.store_args())
        assert_same_counts(on_duckdb, want, what=f"duckdb: {case.name}")


def test_spark_reads_only_the_selected_runs(spark: object, stores: dict[str, str]) -> None:
    statuses = ("complete",)
    filters = {"method": ["dspark", "eagle3"], "dataset": ["gsm8k", "humaneval"]}
    positions = read_trace(stores["written"], "positions", statuses=statuses, filters=filters)
    steps = read_trace(stores["written"], "steps", statuses=statuses, filters=filters)
    options = {"statuses": statuses, "filters": filters, "engine": "spark"}
    got = aggregate_store(
        stores["table"], by="run_id", source="positions", per_request=False, **options
    )
    want = count_acceptance(positions, steps=steps, by="run_id", per_request=False)
    assert_same_counts(got, want, what="acceptance")
    assert "ref/gsm8k/dspark-n3-crashed" not in set(got["run_id"])
    got = aggregate_store(
        stores["table"], metric="calibration", by="n", levels=None, per_request=False, **options
    )
    want = count_calibration(positions, steps=steps, by="n", levels=None)
    assert_same_counts(got, want, what="calibration")
    empty = aggregate_store(stores["table"], filters={"method": "medusa"}, engine="spark")
    assert isinstance(empty, pd.DataFrame) and empty.empty


def test_spark_reads_a_freshly_written_store_natively(spark: Any, stores: dict[str, str]) -> None:
    """As TraceWriter leaves a store: spark.read.parquet gives the run columns, no glob."""
    written = stores["written"]
    frame = spark.read.parquet(f"{written}/steps").select("dataset", "method", "n", "run_id")
    got = sorted(tuple(r) for r in frame.distinct().collect())
    steps = read_trace(written, "steps")
    want = sorted(
        (d, m, int(n), r)
        for d, m, n, r in steps[["dataset", "method", "n", "run_id"]].drop_duplicates().values
    )
    assert got == want and any("/" in r for *_, r in got)  # run ids with '/', unescaped
    on_spark = aggregate_store(written, engine="spark", by=("method", "n"))
    assert_same_counts(on_spark, aggregate_store(written, by=("method", "n")), what="written")
    result = CliRunner().invoke(app, ["count", written, "--engine", "spark", "--by", "method,n"])
    assert result.exit_code == 0, result.output
    duck = CliRunner().invoke(app, ["count", written, "--by", "method,n"])
    assert result.output == duck.output  # the same finished table from either engine


def test_spark_bins_steps_by_depth_and_context_as_duckdb_does(
    spark: object, stores: dict[str, str]
) -> None:
    """The bins' SQL (a CASE ladder, the depth's window over each request's steps) is the
    same text on both engines, with the same counts."""
    for column in ("depth_bin", "context_bin"):
        by = ("method", "n", column)
        on_spark = aggregate_store(stores["table"], engine="spark", by=by)
        on_duckdb = aggregate_store(stores["table"], by=by)
        pd.testing.assert_frame_equal(on_spark, on_duckdb, check_dtype=False)
        assert len(on_duckdb) > 0
