"""Issue 33: a store holding one run_id twice (a compaction killed after writing the table
layout's copy and before removing the old one) is refused in one line, not counted twice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dsparklab.analysis.sql import aggregate_store
from dsparklab.errors import TraceSchemaError
from dsparklab.lab.notebook import load_runs
from dsparklab.store import list_runs
from dsparklab.store.compact import compact_store
from tests.conftest import as_old_layout, write_run


@pytest.fixture
def twice(tmp_path: Path) -> Path:
    store = tmp_path / "store"
    run = write_run(store)
    as_old_layout(run, store / "left-by-a-killed-compaction")
    return store


def test_every_reader_refuses_a_run_id_held_twice(twice: Path) -> None:
    for read in (list_runs, load_runs, lambda s: aggregate_store(s, metric="acceptance")):
        with pytest.raises(TraceSchemaError, match="is also the run_id of") as caught:
            read(twice)
        message = str(caught.value)
        assert "\n" not in message and "field 'run_id'" in message
        assert message.count("run.json") == 2, message


def test_count_exits_2_with_one_line_and_compact_leaves_one_copy(twice: Path) -> None:
    cli = Path(sys.executable).with_name("dsparklab")
    result = subprocess.run(
        [str(cli), "count", str(twice)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "is also the run_id of" in line, line
    compact_store(twice)
    (run,) = list_runs(twice).to_dict("records")
    assert run["status"] == "complete"
