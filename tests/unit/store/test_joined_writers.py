"""A run several processes write (vLLM's batch-sharded DSpark sampling: one writer per
tensor-parallel rank): the owner writes run.json, each joined writer its parts and its own
``writers/<tag>.json``; readers count every writer's rows and take the worst status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsparklab.errors import TraceSchemaError
from dsparklab.store import TraceWriter, read_run_json, read_trace, validate_trace
from dsparklab.store.catalog import Catalog
from dsparklab.store.schema import JOINED_DIR, JOINED_WRITERS
from tests.conftest import make_run_json, request_row, step_rows

N = 3


def _writers(store: Path, joined: tuple[str, ...] = ("tp1",)) -> list[TraceWriter]:
    """The owner (tp0) and a writer per tag in ``joined``, all of one run."""
    meta = make_run_json(num_speculative_tokens=N)
    owner = TraceWriter(store, {**meta, JOINED_WRITERS: list(joined)}, tag="tp0")
    return [owner, *(TraceWriter(store, meta, tag=tag, joins=tag) for tag in joined)]


def _fill(owner: TraceWriter, joiner: TraceWriter) -> None:
    """Requests r0, r1: the owner writes every steps and requests row and r0's positions,
    the joiner r1's positions (the batch row its rank sampled)."""
    for rid, writer in (("r0", owner), ("r1", joiner)):
        steps, positions = step_rows([2, 1], n=N, request_id=rid)
        owner.add_many("steps", steps)
        owner.add("requests", request_row(rid, n_output=1 + sum(s["emitted"] for s in steps)))
        writer.add_many("positions", positions)


def test_every_writers_rows_read_as_one_run(tmp_path: Path) -> None:
    owner, joiner = _writers(tmp_path)
    with owner, joiner:
        _fill(owner, joiner)
    run = owner.run_dir
    assert not (run / JOINED_DIR / "tp0.json").is_file(), "the owner keeps run.json only"
    meta = read_run_json(run)
    assert meta["status"] == "complete"
    assert meta["rows"]["positions"] == 2 * 2 * N  # both writers' rows
    assert meta["rows"]["steps"] == 4
    positions = read_trace(run, "positions")
    assert sorted(positions["request_id"].unique()) == ["r0", "r1"]
    assert not positions.duplicated(["request_id", "step", "position"]).any()
    (report,) = validate_trace(run)  # every step's positions are there, once
    assert report.ok, [str(v) for v in report.violations]
    catalog = Catalog.of(tmp_path)
    assert catalog.recorded_rows() == 2 * 2 * N
    assert catalog.runs["status"].tolist() == ["complete"]


def test_a_joined_writer_still_writing_keeps_the_run_running(tmp_path: Path) -> None:
    owner, joiner = _writers(tmp_path)
    with owner:
        joiner.__enter__()
        _fill(owner, joiner)
    meta = read_run_json(owner.run_dir)
    assert meta["status"] == "running"
    assert meta["status_reason"].startswith("joined writer tp1")
    joiner.close()
    assert read_run_json(owner.run_dir)["status"] == "complete"


def test_a_failed_joined_writer_fails_the_run(tmp_path: Path) -> None:
    owner, joiner = _writers(tmp_path)
    with owner:
        with pytest.raises(RuntimeError), joiner:
            raise RuntimeError("boom")
    meta = read_run_json(owner.run_dir)
    assert meta["status"] == "failed"
    assert meta["status_reason"] == "joined writer tp1: RuntimeError: boom"


def test_a_joined_writer_that_left_no_file_makes_a_closed_run_incomplete(
    tmp_path: Path,
) -> None:
    owner, _never_started = _writers(tmp_path)
    owner.__enter__()
    assert read_run_json(owner.run_dir)["status"] == "running"  # it may start yet
    owner.close()
    meta = read_run_json(owner.run_dir)
    assert meta["status"] == "incomplete"
    assert "left no writers/tp1.json" in meta["status_reason"]


def test_a_joined_writers_lapsed_lease_reads_incomplete(tmp_path: Path) -> None:
    owner, joiner = _writers(tmp_path)
    with owner:
        joiner.__enter__()
    path = Path((owner.run_dir / JOINED_DIR / "tp1.json").path)
    record = json.loads(path.read_text())
    record["lease_expires_at"] = "2000-01-01T00:00:00+00:00"
    path.write_text(json.dumps(record))
    meta = read_run_json(owner.run_dir)
    assert meta["status"] == "incomplete"
    assert "lease ended" in meta["status_reason"]
    assert read_run_json(owner.run_dir, derive_status=False)["status"] == "running"


@pytest.mark.parametrize(
    ("change", "field"),
    [({"status": "done"}, "status"), ({"rows": {"positions": "many"}}, "rows")],
)
def test_a_bad_joined_writer_file_names_itself_and_its_field(
    tmp_path: Path, change: dict, field: str
) -> None:
    owner, joiner = _writers(tmp_path)
    with owner, joiner:
        _fill(owner, joiner)
    path = Path((owner.run_dir / JOINED_DIR / "tp1.json").path)
    path.write_text(json.dumps({**json.loads(path.read_text()), **change}))
    with pytest.raises(TraceSchemaError) as err:
        read_run_json(owner.run_dir)
    assert err.value.field == field
    assert err.value.path == str(path)


def test_compacting_a_joined_run_folds_its_writers_into_one(tmp_path: Path) -> None:
    from dsparklab.store.compact import compact_store

    owner, joiner = _writers(tmp_path)
    with owner, joiner:
        _fill(owner, joiner)
    before = read_trace(owner.run_dir, "positions")
    (result,) = compact_store(tmp_path)
    assert result.rows["positions"] == len(before) == 2 * 2 * N
    meta = read_run_json(owner.run_dir)
    assert JOINED_WRITERS not in meta and meta["compaction"][JOINED_WRITERS] == ["tp1"]
    assert meta["rows"]["positions"] == len(before), "the joined writer's rows, counted once"
    assert not (owner.run_dir / JOINED_DIR).is_dir()
    after = read_trace(owner.run_dir, "positions")
    keys = ["request_id", "step", "position"]
    assert after.sort_values(keys)["draft_token"].tolist() == (
        before.sort_values(keys)["draft_token"].tolist()
    )


def test_a_running_joined_writers_lease_is_the_runs(tmp_path: Path) -> None:
    """Compaction leaves a run alone while any writer's lease runs; once the last one
    lapsed, ``stale_after_s`` takes that writer for dead (the owner closed without one)."""
    from dsparklab.store.compact import compact_store

    owner, joiner = _writers(tmp_path)
    with owner:
        joiner.__enter__()
        _fill(owner, joiner)
        joiner.flush()
    path = Path((owner.run_dir / JOINED_DIR / "tp1.json").path)
    written = read_run_json(owner.run_dir, derive_status=False)
    assert written["status"] == "running"
    assert written["lease_expires_at"] == json.loads(path.read_text())["lease_expires_at"]
    (skipped,) = compact_store(tmp_path)
    assert skipped.skipped == "still being written"
    record = json.loads(path.read_text())
    record["lease_expires_at"] = "2000-01-01T00:00:00+00:00"
    path.write_text(json.dumps(record))
    (lapsed,) = compact_store(tmp_path)
    assert "lease lapsed" in lapsed.skipped
    (compacted,) = compact_store(tmp_path, stale_after_s=60)
    assert not compacted.skipped and compacted.rows["positions"] == 2 * 2 * N


def test_the_owners_run_json_reads_alone_when_asked(tmp_path: Path) -> None:
    owner, joiner = _writers(tmp_path)
    with owner, joiner:
        _fill(owner, joiner)
    alone = read_run_json(owner.run_dir, joined=False)
    assert alone["rows"]["positions"] == 2 * N  # r0's, the owner's own
    assert read_run_json(owner.run_dir)["rows"]["positions"] == 2 * 2 * N
