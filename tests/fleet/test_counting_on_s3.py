"""The SQL counting stage on DuckDB over a real S3 store (SeaweedFS on loopback): the
counters of a store in a bucket equal those of the same store on local disk.

DuckDB's httpfs extension cannot be installed offline; the counting stage hands DuckDB the
store's pyarrow dataset, which reads the bucket through dsparklab's S3 filesystem.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from seaweed_store import SeaweedS3

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "analysis"))
from counting_cases import CASES, assert_same_counts, write_store  # noqa: E402

from dsparklab.analysis import aggregate_store  # noqa: E402
from dsparklab.store import hive_table, list_runs  # noqa: E402
from dsparklab.store.compact import compact_store  # noqa: E402

# every query text once (each call on S3 lists the store and reads each run.json and footer)
ON_S3 = (
    "acceptance/steps/method-n-request",
    "acceptance/positions/dataset-request",
    "calibration/exact/run",
    "step_times/run-request",
)


def test_duckdb_counts_on_s3_equal_the_local_ones(
    seaweed: SeaweedS3, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    local = write_store(str(tmp_path / "local"))
    # the same runs written by TraceWriter into the bucket, and compacted into the table
    # layout there
    written = write_store(f"s3://{s3_bucket}/written")
    table = f"s3://{s3_bucket}/table"
    compact_store(local, out=table)
    assert hive_table(table, "positions") is None  # an object store: read as a dataset
    assert sorted(list_runs(written)["run_id"]) == sorted(list_runs(local)["run_id"])
    for case in (c for c in CASES if c.name in ON_S3):
        want = aggregate_store(local, **case.store_args())
        assert len(want), case.name
        for root in (written, table):
            got = aggregate_store(root, **case.store_args())
            assert_same_counts(got, want, what=f"{root}: {case.name}")
    # runs selected on S3 as on disk
    selection = {"statuses": ("complete",), "filters": {"method": "dspark"}}
    assert_same_counts(
        aggregate_store(written, metric="calibration", by="run_id", **selection),
        aggregate_store(local, metric="calibration", by="run_id", **selection),
        what="selected runs",
    )
