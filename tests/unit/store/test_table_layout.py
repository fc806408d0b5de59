"""The table layout: runs compacted into it read back equal, engines read it natively."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "analysis"))
from analysis_synth import build_run, noisy_confidence, write_run  # noqa: E402

from dsparklab.cli.app import app
from dsparklab.store import find_runs, read_run_json, read_trace, table_dataset, validate_trace
from dsparklab.store.compact import compact_store
from dsparklab.store.layout import (
    is_partitioned,
    partition_path,
    partition_value,
    partition_values,
    table_location,
)
from dsparklab.store.location import Location
from dsparklab.store.reader import part_files
from dsparklab.store.schema import POSITIONS_SCHEMA, STEPS_SCHEMA
from dsparklab.store.writer import part_bytes
from tests.conftest import as_old_layout, make_run_json
from tests.conftest import write_run as write_tiny_run

TABLES = ("positions", "steps", "requests")
KEYS = {
    "positions": ["run_id", "request_id", "step", "position"],
    "steps": ["run_id", "request_id", "step"],
    "requests": ["run_id", "request_id"],
}


RUNS = (
    dict(run_id="ref/gsm8k/dspark-n3", n=3, confidence=noisy_confidence(0.2), seed=1),
    dict(
        run_id="ref/humaneval/eagle3-n5",
        method="eagle3",
        n=5,
        dataset="humaneval",
        seed=2,
        num_verified=lambda drafted, rng: rng.integers(1, drafted + 1),
    ),
    dict(run_id="ref/gsm8k/none", method="none", n=0, seed=3),
)


def _store(root: Path) -> Path:
    """Three runs as TraceWriter writes them: DSpark n=3, Eagle3 n=5 verifying adaptively, a
    baseline."""
    for spec in RUNS:
        write_run(root, build_run(**spec))
    return root


def _old_store(root: Path, scratch: Path) -> Path:
    """The same runs as dsparklab wrote them before the table layout (a directory per run)."""
    written = _store(scratch)
    for run in find_runs(written):
        as_old_layout(Path(run.path), root / read_run_json(run)["run_id"])
    return root


def _tables(root: Path) -> dict[str, pd.DataFrame]:
    return {
        t: read_trace(root, t)
        .sort_values(KEYS[t])
        .reset_index(drop=True)[sorted(read_trace(root, t).columns)]
        for t in TABLES
    }


def test_partition_values_escape_as_hive_and_read_back() -> None:
    for value in ("gsm8k/dspark-n3", "a=b%c d", "é:#?", "plain-1.2_x"):
        escaped = partition_value(value)
        assert "/" not in escaped and "=" not in escaped
        run = Location.of(f"/s/_runs/dataset={escaped}/method=m/n=3/run_id={escaped}")
        assert is_partitioned(run)
        assert partition_values(run) == {"dataset": value, "method": "m", "n": "3", "run_id": value}
    assert partition_value("gsm8k/dspark-n3") == "gsm8k%2Fdspark-n3"


def test_compaction_moves_runs_into_the_table_layout_and_reads_back_equal(tmp_path: Path) -> None:
    root = _old_store(tmp_path / "store", tmp_path / "scratch")
    assert not any(is_partitioned(r) for r in find_runs(root))
    before = _tables(root)
    assert all(r.ok for r in validate_trace(root))  # the old layout reads and validates
    results = compact_store(root, file_rows=500, row_group_rows=200)
    assert [r.generation for r in results] == [1, 1, 1]
    runs = find_runs(root)
    assert len(runs) == 3 and all(is_partitioned(r) for r in runs)
    assert not (root / "ref").exists()  # the old run directories went
    after = _tables(root)
    for table in TABLES:
        pd.testing.assert_frame_equal(after[table], before[table], check_dtype=False)
    assert all(r.ok for r in validate_trace(root)), [
        str(v) for r in validate_trace(root) for v in r.violations
    ]

    dspark = next(r for r in runs if "dspark" in str(r))
    meta = read_run_json(dspark)
    assert meta["compaction"]["generation"] == 1
    parts = part_files(dspark, "positions")
    assert len(parts) == meta["parts"]["positions"] == -(-meta["rows"]["positions"] // 500) > 1
    rows = pq.read_table([p.path for p in parts][0])
    assert "dataset" not in pq.read_schema(part_files(dspark, "steps")[0].path).names
    keys = rows.select(["request_id", "step", "position"]).to_pandas()
    assert keys.equals(keys.sort_values(list(keys.columns)).reset_index(drop=True))
    assert pq.ParquetFile(parts[0].path).metadata.num_row_groups == 3  # 500 rows, groups of 200

    # again, in place: generation 2 replaces generation 1
    assert [r.generation for r in compact_store(root)] == [2, 2, 2]
    assert [p.name for p in part_files(dspark, "positions")] == ["part-c002-00000.parquet"]
    again = _tables(root)
    for table in TABLES:
        pd.testing.assert_frame_equal(again[table], before[table], check_dtype=False)


def test_parts_a_compaction_did_not_commit_are_not_read(tmp_path: Path) -> None:
    root = _store(tmp_path / "store")
    compact_store(root)
    run = next(r for r in find_runs(root) if "dspark" in str(r))
    before = read_trace(root, "positions")
    # a compaction killed before its run.json: generation 2's parts, uncommitted
    stray = read_trace(run, "positions")[
        [c for c in pq.read_schema(part_files(run, "positions")[0].path).names]
    ]
    table = pa.Table.from_pandas(stray, schema=POSITIONS_SCHEMA, preserve_index=False)
    (table_location(run, "positions") / "part-c002-00000.parquet").write_bytes(
        part_bytes(table, "positions")
    )
    assert len(read_trace(root, "positions")) == len(before)
    assert table_dataset(root, "positions").count_rows() == len(before)
    # running it again replaces the stray parts with a committed generation 2
    compact_store(root)
    assert len(read_trace(root, "positions")) == len(before)


def test_a_writers_store_compacts_its_small_parts_in_place(tmp_path: Path) -> None:
    root = _store(tmp_path / "store")
    small = Location.of(write_tiny_run(root, meta=make_run_json(run_id="tiny")))  # 5-row flushes
    before = _tables(root)
    assert len(part_files(small, "positions")) == 3
    assert [r.generation for r in compact_store(root)] == [1, 1, 1, 1]
    assert small in find_runs(root)
    assert [p.name for p in part_files(small, "positions")] == ["part-c001-00000.parquet"]
    after = _tables(root)
    for table in TABLES:
        pd.testing.assert_frame_equal(after[table], before[table], check_dtype=False)


@pytest.mark.parametrize("compacted", [False, True], ids=["as-written", "compacted"])
def test_engines_read_the_run_columns_with_no_glob(tmp_path: Path, compacted: bool) -> None:
    root = _store(tmp_path / "store")  # as TraceWriter leaves it
    if compacted:
        compact_store(root)
    positions = duckdb.sql(
        f"SELECT run_id, dataset, method, n, count(*) AS rows FROM read_parquet("
        f"'{root}/positions', hive_partitioning = true) GROUP BY ALL ORDER BY run_id"
    ).df()
    expected = (
        read_trace(root, "positions")
        .groupby(["run_id", "dataset", "method", "n"], as_index=False)
        .size()
    )
    assert positions["run_id"].tolist() == expected["run_id"].tolist()
    assert positions["rows"].tolist() == expected["size"].tolist()
    assert positions["n"].tolist() == [3, 5]
    steps = duckdb.sql(
        f"SELECT DISTINCT dataset, method FROM read_parquet('{root}/steps', hive_partitioning = "
        "true) ORDER BY ALL"
    ).fetchall()
    assert steps == [("gsm8k", "dspark"), ("gsm8k", "none"), ("humaneval", "eagle3")]
    runs = duckdb.sql(
        f"SELECT run_id, status, engine FROM read_parquet('{root}/runs', hive_partitioning = "
        "true) ORDER BY run_id"
    ).fetchall()
    assert [r[0] for r in runs] == [
        "ref/gsm8k/dspark-n3",
        "ref/gsm8k/none",
        "ref/humaneval/eagle3-n5",
    ]
    assert {r[1] for r in runs} == {"complete"}


def test_table_dataset_gives_every_layout_the_run_columns(tmp_path: Path) -> None:
    old = _old_store(tmp_path / "old", tmp_path / "scratch")
    new = tmp_path / "new"
    compact_store(old, out=new)
    assert (old / "ref").exists()  # --out leaves the source as it was
    for root in (old, new):
        frame = table_dataset(root, "steps").to_table().to_pandas()
        expected = read_trace(root, "steps")
        assert len(frame) == len(expected)
        assert sorted(frame.groupby(["run_id", "dataset", "method", "n"]).size().items()) == sorted(
            expected.groupby(["run_id", "dataset", "method", "n"]).size().items()
        )
        assert np.isclose(frame["verify_time_s"].sum(), expected["verify_time_s"].sum())


def test_a_part_holding_its_partition_key_is_one_clear_violation(tmp_path: Path) -> None:
    root = _store(tmp_path / "store")
    compact_store(root)
    run = next(r for r in find_runs(root) if "dspark" in str(r))
    steps = read_trace(run, "steps", columns=None)
    table = pa.Table.from_pandas(
        steps[STEPS_SCHEMA.names], schema=STEPS_SCHEMA, preserve_index=False
    )
    path = part_files(run, "steps")[0]
    path.write_bytes(part_bytes(table, "steps"))  # with its dataset column
    [report] = [r for r in validate_trace(root) if not r.ok]
    [violation] = report.violations
    assert violation.field == "dataset" and "partition key" in violation.message
    result = CliRunner().invoke(app, ["validate", str(root)])
    assert result.exit_code == 2


def test_compact_cli_reports_each_run_and_leaves_a_running_one(tmp_path: Path) -> None:
    root = _store(tmp_path / "store")
    base = next(r for r in find_runs(root) if "none" in str(r))
    meta = json.loads((Path(base) / "run.json").read_text())
    meta["status"] = "running"
    (Path(base) / "run.json").write_text(json.dumps(meta))
    result = CliRunner().invoke(app, ["compact", str(root)])
    assert result.exit_code == 0, result.output
    assert "3 runs: 2 compacted, 1 skipped" in result.output
    assert "still being written" in result.output
    assert partition_path(meta).startswith("dataset=gsm8k/method=none/n=0/run_id=ref%2Fgsm8k")
    missing = subprocess.run(
        [sys.executable, "-c", "from dsparklab.cli.app import main; main()", "compact"]
        + [str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
    )
    assert missing.returncode == 2 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and "nowhere" in missing.stderr


def test_a_rerun_replaces_every_part_a_killed_attempt_left_at_its_generation(
    tmp_path: Path,
) -> None:
    """A compaction killed before its commit with a smaller file size left more files of
    the next generation than the rerun writes: the rerun clears them all, so no reader
    counts a row twice, and run.json's counts match the parts (validate checks it)."""
    root = _store(tmp_path / "store")
    compact_store(root)
    run = next(r for r in find_runs(root) if "dspark" in str(r))
    before = _tables(root)
    # the killed attempt's generation 2, in files of 10 rows
    rows = pq.read_table(part_files(run, "positions")[0].path)
    for seq, start in enumerate(range(0, rows.num_rows, 10)):
        name = f"part-c002-{seq:05d}.parquet"
        (table_location(run, "positions") / name).write_bytes(
            part_bytes(rows.slice(start, 10), "positions")
        )
    # and a temporary file its killed write left
    (Path(table_location(run, "positions").path) / ".part-c002-99999.parquet.1-1.tmp").write_bytes(
        b"PAR1"
    )
    compact_store(root)  # one file per table this time
    after = _tables(root)
    for table in TABLES:
        pd.testing.assert_frame_equal(after[table], before[table], check_dtype=False)
    assert [p.name for p in part_files(run, "positions")] == ["part-c002-00000.parquet"]
    assert table_dataset(root, "positions").count_rows() == len(before["positions"])
    assert not list(Path(table_location(run, "positions").path).glob(".*.tmp"))
    assert all(r.ok for r in validate_trace(root))


def test_a_move_killed_after_its_commit_is_finished_not_compacted_again(tmp_path: Path) -> None:
    """Moving an old-layout run: after the commit, before the old copy is gone (here: its
    positions already deleted, its run.json not yet). The rerun removes the old copy and
    keeps the moved run whole."""
    root = _old_store(tmp_path / "store", tmp_path / "scratch")
    before = _tables(root)
    old = next(r for r in find_runs(root) if "dspark" in str(r))
    moved = compact_store(root, out=tmp_path / "elsewhere")  # the move's result, elsewhere
    assert len(moved) == 3
    # replay the in-place move's commit for the DSpark run, then cut its removal short
    compact_store(root)  # moves all three, committed and removed
    assert not Path(old.path).exists()
    as_old_layout(
        Path(next(r for r in find_runs(tmp_path / "elsewhere") if "dspark" in str(r)).path),
        Path(old.path),
    )
    shutil.rmtree(Path(old.path) / "positions")
    meta_path = (
        next(Path(r.path) for r in find_runs(root) if is_partitioned(r) and "dspark" in str(r))
        / "run.json"
    )
    meta = json.loads(meta_path.read_text())
    meta["compaction"]["moved_from"] = str(old)
    meta_path.write_text(json.dumps(meta))
    results = compact_store(root)
    assert not Path(old.path).exists()
    assert len(find_runs(root)) == 3
    # the old copy was only removed: every run compacted is the table layout's
    assert len(results) == 3 and all(is_partitioned(r.source) for r in results)
    after = _tables(root)
    for table in TABLES:
        pd.testing.assert_frame_equal(after[table], before[table], check_dtype=False)


def test_out_naming_the_store_compacts_in_place(tmp_path: Path) -> None:
    root = _old_store(tmp_path / "store", tmp_path / "scratch")
    before = _tables(root)
    compact_store(root, out=root)
    assert len(find_runs(root)) == 3 and all(is_partitioned(r) for r in find_runs(root))
    after = _tables(root)
    for table in TABLES:
        pd.testing.assert_frame_equal(after[table], before[table], check_dtype=False)


def test_a_run_whose_joined_writer_has_not_written_waits(tmp_path: Path) -> None:
    """Compaction folds the writers of a run into one and deletes their files: a joined
    writer with no file yet would lose its rows, so the run is left alone."""
    from dsparklab.store import TraceWriter
    from dsparklab.store.schema import JOINED_WRITERS

    root = tmp_path / "store"
    with TraceWriter(root, {**make_run_json(), JOINED_WRITERS: ["tp1"]}, tag="tp0") as owner:
        owner.add_many("steps", [])
    (result,) = compact_store(root)
    assert "tp1" in result.skipped and result.generation == 0


def test_validate_holds_run_json_counts_to_the_parts_and_drafted_steps_to_positions(
    tmp_path: Path,
) -> None:
    root = _store(tmp_path / "store")
    run = next(r for r in find_runs(root) if "dspark" in str(r))
    meta_path = Path(run.path) / "run.json"
    meta = json.loads(meta_path.read_text())
    meta["rows"]["steps"] += 1
    meta_path.write_text(json.dumps(meta))
    (report,) = validate_trace(run)
    assert [v.field for v in report.violations] == ["rows.steps"]
    meta["rows"]["steps"] -= 1
    meta_path.write_text(json.dumps(meta))
    for part in Path(table_location(run, "positions").path).glob("part-*.parquet"):
        part.unlink()
    meta["rows"]["positions"] = 0
    meta_path.write_text(json.dumps(meta))
    (report,) = validate_trace(run)
    assert report.violations and {v.field for v in report.violations} == {"num_drafted"}


def test_validate_reports_the_parts_no_run_json_owns(tmp_path: Path) -> None:
    """A removal cut short after run.json went (``remove_run`` deletes it first) leaves
    parts that dsparklab's readers no longer list but a SQL engine reading the table
    directory still counts: validate names each such directory, and exits 2."""
    root = _store(tmp_path / "store")
    run = next(r for r in find_runs(root) if "dspark" in str(r))
    (Path(run.path) / "run.json").unlink()
    reports = validate_trace(root)
    unowned = [r for r in reports if not r.ok]
    assert [r.path for r in unowned] == [run]
    (report,) = unowned
    assert {Path(v.file) for v in report.violations} == {
        Path(table_location(run, table).path) for table in (*TABLES, "runs")
    }
    ((counted,),) = duckdb.sql(
        f"SELECT count(*) FROM read_parquet('{root}/steps/**/*.parquet', hive_partitioning = true)"
    ).fetchall()
    assert counted > read_trace(root, "steps").shape[0]  # why it is not valid
    result = CliRunner().invoke(app, ["validate", str(root)])
    assert result.exit_code == 2
    assert "parts with no run.json" in result.output


def test_validate_reports_parts_of_a_generation_run_json_does_not_name(tmp_path: Path) -> None:
    """A compaction cut short between its commit and deleting the old generation leaves
    parts no reader lists but SQL over the table directory counts twice: validate names
    them."""
    root = _store(tmp_path / "store")
    compact_store(root)
    run = next(r for r in find_runs(root) if "dspark" in str(r))
    home = Path(table_location(run, "steps").path)
    (current,) = home.glob("part-c*.parquet")
    stale = home / "part-00000.parquet"  # the uncompacted generation's name
    shutil.copy(current, stale)
    (report,) = validate_trace(run)
    assert [Path(v.file) for v in report.violations] == [stale]
    assert "compaction generation" in report.violations[0].message
    assert read_trace(run, "steps").shape[0] == read_run_json(run)["rows"]["steps"]
