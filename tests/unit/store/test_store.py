"""Round trips through the real writer and readers."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dsparklab.errors import TraceSchemaError
from dsparklab.store import (
    SCHEMA_VERSION,
    TraceWriter,
    list_runs,
    read_run_json,
    read_trace,
    validate_trace,
)
from dsparklab.store.layout import table_location
from dsparklab.store.outbox import Outbox
from dsparklab.store.schema import JOINED_WRITERS, POSITIONS_SCHEMA, SCHEMA_VERSION_KEY
from tests.conftest import make_run_json, request_row, step_rows, write_run


def test_round_trip_joins_run_columns(good_run: Path) -> None:
    positions = read_trace(good_run, "positions")
    assert len(positions) == 4 * 3
    assert set(positions["method"]) == {"dspark"}
    assert set(positions["n"]) == {3}
    assert set(positions["dataset"]) == {"humaneval"}
    steps = read_trace(good_run, "steps")
    assert steps["accepted_len"].tolist() == [3, 1, 0, 2]
    recount = positions.groupby("step")["accepted"].sum().tolist()
    assert recount == [3, 1, 0, 2]
    requests = read_trace(good_run, "requests")
    assert requests.loc[0, "output_token_ids"].tolist() == list(range(4, 4 + 11))


def test_parts_are_versioned_and_split(good_run: Path) -> None:
    parts = sorted(Path(table_location(good_run, "positions").path).glob("part-*.parquet"))
    assert len(parts) > 1  # flush_rows=5 forces several parts
    for part in parts:
        meta = pq.read_schema(part).metadata
        assert meta[SCHEMA_VERSION_KEY] == str(SCHEMA_VERSION).encode()
    meta = read_run_json(good_run)
    assert meta["status"] == "complete"
    assert meta["rows"] == {"steps": 4, "positions": 12, "requests": 1}


def test_projection_and_filters_push_down(tmp_path: Path) -> None:
    write_run(tmp_path / "a", meta=make_run_json(run_id="a", method="dspark"))
    write_run(
        tmp_path / "b", meta=make_run_json(run_id="b", method="eagle3", drafter={"name": "e"})
    )
    both = read_trace(tmp_path, "positions", columns=["position", "accepted"])
    assert set(both["run_id"]) == {"a", "b"}
    assert "draft_token" not in both.columns
    eagle = read_trace(tmp_path, "positions", filters={"method": "eagle3", "position": [0, 2]})
    assert set(eagle["run_id"]) == {"b"}
    assert set(eagle["position"]) == {0, 2}
    assert len(eagle) == 8
    runs = list_runs(tmp_path)
    assert sorted(runs["method"]) == ["dspark", "eagle3"]
    assert (runs["status"] == "complete").all()


def test_empty_selection_keeps_columns(good_run: Path) -> None:
    empty = read_trace(good_run, "steps", filters={"method": "eagle3"})
    assert empty.empty
    assert {"step", "accepted_len", "method", "run_id"} <= set(empty.columns)


def test_exception_marks_failed_and_keeps_rows(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (step,), _ = step_rows([0], n=0)  # one step that drafted nothing: no positions rows
    with pytest.raises(RuntimeError, match="boom"):
        with TraceWriter(run, make_run_json(), flush_rows=1000) as writer:
            writer.add("steps", step)
            raise RuntimeError("boom")
    meta = json.loads((writer.run_dir / "run.json").read_text())
    assert meta["status"] == "failed"
    assert "boom" in meta["error"]
    assert len(read_trace(run, "steps")) == 1
    (report,) = validate_trace(run)
    assert report.ok
    assert not report.complete


def test_bad_row_is_a_schema_error(tmp_path: Path) -> None:
    with pytest.raises(TraceSchemaError, match="positions"):
        with TraceWriter(tmp_path / "run", make_run_json()) as writer:
            writer.add("positions", {"request_id": "r0", "step": "zero"})
            writer.flush()


def test_rows_in_columns_are_written_with_the_buffered_rows(tmp_path: Path) -> None:
    """add_table: rows already in columns land in the same part as the rows added one by
    one, counted in run.json and read back as if added as rows."""
    steps, positions = step_rows([2, 0], n=3)
    with TraceWriter(tmp_path / "store", make_run_json(), flush_rows=1000) as writer:
        writer.add("requests", request_row(n_output=1 + sum(s["emitted"] for s in steps)))
        writer.add_many("steps", steps)
        writer.add_many("positions", positions[:3])
        writer.add_table("positions", pa.Table.from_pylist(positions[3:], schema=POSITIONS_SCHEMA))
        writer.add_table("positions", POSITIONS_SCHEMA.empty_table())
    run = writer.run_dir
    (part,) = Path(table_location(run, "positions").path).glob("part-*.parquet")
    assert pq.read_table(part).num_rows == 6
    assert json.loads((Path(run.path) / "run.json").read_text())["rows"]["positions"] == 6
    got = read_trace(tmp_path / "store", "positions").sort_values(["step", "position"])
    assert got["accepted"].tolist() == [p["accepted"] for p in positions]
    (report,) = validate_trace(tmp_path / "store")
    assert report.ok and report.complete


def test_columns_of_another_schema_name_the_field(tmp_path: Path) -> None:
    _, positions = step_rows([1], n=3)
    wrong = pa.Table.from_pylist(positions, schema=POSITIONS_SCHEMA)
    wrong = wrong.set_column(1, "step", wrong.column("step").cast(pa.int64()))
    with TraceWriter(tmp_path / "store", make_run_json()) as writer:
        with pytest.raises(TraceSchemaError, match="positions schema") as err:
            writer.add_table("positions", wrong)
        assert err.value.field == "step"
        # a difference the types do not show: nullability, or a column the schema lacks
        loose = wrong.cast(POSITIONS_SCHEMA.set(0, POSITIONS_SCHEMA.field(0).with_nullable(True)))
        with pytest.raises(TraceSchemaError) as err:
            writer.add_table("positions", loose)
        assert err.value.field == "request_id"
        extra = pa.Table.from_pylist(positions, schema=POSITIONS_SCHEMA).append_column(
            "note", pa.array(["x"] * 3)
        )
        with pytest.raises(TraceSchemaError) as err:
            writer.add_table("positions", extra)
        assert err.value.field == "note"
        writer.add_many("positions", positions)  # nothing of the refused table was kept
    assert len(read_trace(tmp_path / "store", "positions")) == 3


def test_existing_run_is_not_overwritten(good_run: Path) -> None:
    store = good_run.parents[4]  # <store>/_runs/dataset=/method=/n=/run_id=
    with pytest.raises(FileExistsError), TraceWriter(store, make_run_json()):
        pass
    assert len(read_trace(good_run, "steps")) == 4
    # overwrite=True replaces the run in every table
    with TraceWriter(store, make_run_json(), overwrite=True) as writer:
        writer.add_many("steps", step_rows([1], n=3)[0])
    assert len(read_trace(store, "steps")) == 1 and read_trace(store, "positions").empty


def test_a_run_writes_its_tables_partitioned_and_its_runs_row(tmp_path: Path) -> None:
    run = write_run(tmp_path / "store", meta=make_run_json(run_id="ref/humaneval/dspark-n3"))
    store = tmp_path / "store"
    partition = "dataset=humaneval/method=dspark/n=3/run_id=ref%2Fhumaneval%2Fdspark-n3"
    assert run == store / "_runs" / partition
    for table in ("steps", "positions", "requests"):
        (part,) = list((store / table / partition).glob("part-*.parquet"))[:1]
        assert "dataset" not in pq.read_schema(part).names  # the partition's
    row = pq.read_table(store / "runs" / partition / "part-00000.parquet").to_pylist()
    assert row[0]["status"] == "complete" and row[0]["engine"] == "test"
    assert set(read_trace(store, "steps")["dataset"]) == {"humaneval"}


@pytest.mark.parametrize("sent", ["directly", "through an outbox"])
def test_a_run_that_recorded_nothing_is_discarded_whole(tmp_path: Path, sent: str) -> None:
    """discard() removes an open run that holds no row (run.json, its runs-table row, its
    table directories), from a disk or through a live writer's outbox; a run with a row, or
    one other writers share, is refused and kept."""
    store = tmp_path / "store"
    outbox = Outbox(name="test store") if sent == "through an outbox" else None
    writer = TraceWriter(store, make_run_json(), outbox=outbox, flush_seconds=1e9)
    writer.__enter__()
    writer.checkpoint()  # run.json and the runs row on their way, as a live writer's are
    assert writer.recorded_nothing
    writer.discard()
    assert not [p for p in store.rglob("*") if p.is_file()]
    writer.close()  # closing a discarded run does nothing
    assert not [p for p in store.rglob("*") if p.is_file()]

    with TraceWriter(store, make_run_json()) as kept:
        kept.add_many("steps", step_rows([1], n=3)[0])
        assert not kept.recorded_nothing
        with pytest.raises(ValueError, match="holds rows"):
            kept.discard()
    assert read_run_json(store)["status"] == "complete"
    shared = TraceWriter(
        tmp_path / "shared", {**make_run_json(), JOINED_WRITERS: ["tp1"]}, tag="tp0"
    )
    with shared, pytest.raises(ValueError, match="other writers"):
        shared.discard()


def test_a_row_of_another_dataset_is_refused(tmp_path: Path) -> None:
    (step,), _ = step_rows([0], n=0)
    with pytest.raises(TraceSchemaError, match="dataset") as err:
        with TraceWriter(tmp_path / "store", make_run_json()) as writer:
            writer.add("steps", {**step, "dataset": "gsm8k"})
            writer.flush()
    assert err.value.field == "dataset"


def test_no_pickle_in_store() -> None:
    import dsparklab.store as store

    root = Path(store.__file__).parent
    for source in root.glob("*.py"):
        assert "pickle" not in source.read_text(), source


def test_validate_counts_match_readers(good_run: Path) -> None:
    (report,) = validate_trace(good_run)
    assert report.ok
    assert report.complete
    assert report.rows == {"steps": 4, "positions": 12, "requests": 1}
    assert isinstance(read_trace(good_run, "steps"), pd.DataFrame)
