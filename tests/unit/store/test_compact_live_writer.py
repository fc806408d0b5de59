"""Issue 33: compaction never drops a live writer's rows. A writer whose lease lapsed (slow,
not dead) reads as incomplete; compaction leaves it alone, so when the writer goes on and
closes, every row it wrote is read back. With --stale-after the run is compacted once its
writer is taken for dead."""

from __future__ import annotations

import json
import time
from pathlib import Path

from typer.testing import CliRunner

from dsparklab.cli.app import app
from dsparklab.store import TraceWriter, read_run_json, read_trace
from dsparklab.store.compact import compact_store
from tests.conftest import make_run_json, step_rows


def test_a_writer_whose_lease_lapsed_keeps_every_row(tmp_path: Path) -> None:
    store = tmp_path / "store"
    steps, positions = step_rows([3, 1, 0, 2, 1, 2], n=3)
    writer = TraceWriter(store, make_run_json(), flush_rows=10**6, lease_seconds=1.0)
    with writer:
        writer.add_many("steps", steps[:3])
        writer.add_many("positions", [p for p in positions if p["step"] < 3])
        writer.flush()
        time.sleep(1.5)  # the writer is slow: its lease lapses
        assert read_run_json(writer.run_dir)["status"] == "incomplete"
        (result,) = compact_store(store)
        assert "its writer may be alive" in result.skipped
        writer.add_many("steps", steps[3:])
        writer.add_many("positions", [p for p in positions if p["step"] >= 3])
    assert read_run_json(writer.run_dir)["status"] == "complete"
    assert len(read_trace(store, "steps")) == len(steps)
    assert len(read_trace(store, "positions")) == len(positions)


def test_stale_after_compacts_a_run_whose_writer_died(tmp_path: Path) -> None:
    store = tmp_path / "store"
    steps, positions = step_rows([3, 1, 0, 2], n=3)
    writer = TraceWriter(store, make_run_json(), flush_rows=10**6, lease_seconds=1.0)
    writer.__enter__()
    writer.add_many("steps", steps)
    writer.add_many("positions", positions)
    writer.flush()  # then the process dies: no close, the lease lapses
    time.sleep(1.5)
    kept = CliRunner().invoke(app, ["compact", str(store)])
    assert "1 runs: 0 compacted, 1 skipped" in kept.output, kept.output
    done = CliRunner().invoke(app, ["compact", str(store), "--stale-after", "0.5"])
    assert "1 runs: 1 compacted, 0 skipped" in done.output, done.output
    meta = json.loads((Path(writer.run_dir.path) / "run.json").read_text())
    assert meta["compaction"]["generation"] == 1 and meta["status"] == "running"
    assert len(read_trace(store, "steps", statuses=("incomplete",))) == len(steps)
