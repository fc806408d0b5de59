"""`dsparklab count`: the counting stage from the shell prints the finished table the
library gives (the Spark run of the same command: tests/spark)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from counting_cases import write_store
from typer.testing import CliRunner

from dsparklab.analysis import (
    aggregate_store,
    compute_acceptance_by_position,
    compute_calibration,
)
from dsparklab.cli.app import app

COMPLETE = ("complete",)  # what the command counts unless --statuses names others


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_store(str(tmp_path_factory.mktemp("store")))


def test_count_prints_and_writes_the_finished_tables(store: str, tmp_path: Path) -> None:
    out = tmp_path / "acceptance.csv"
    result = CliRunner().invoke(app, ["count", store, "--by", "method,n", "--out", str(out)])
    assert result.exit_code == 0, result.output
    counts = aggregate_store(store, by=("method", "n"), per_request=False, statuses=COMPLETE)
    want = compute_acceptance_by_position(counts, by=("method", "n"), n_boot=0)
    pd.testing.assert_frame_equal(pd.read_csv(out), want.reset_index(drop=True), check_dtype=False)
    assert want.to_string(index=False) in result.output
    out = tmp_path / "calibration.parquet"
    args = ["count", store, "--metric", "calibration", "--by", "n", "--out", str(out)]
    assert CliRunner().invoke(app, args).exit_code == 0
    counts = aggregate_store(store, metric="calibration", by=("n",), statuses=COMPLETE)
    want = compute_calibration(counts, by=("n",))
    pd.testing.assert_frame_equal(pd.read_parquet(out), want.reset_index(drop=True))
    timed = CliRunner().invoke(app, ["count", store, "--metric", "step_times", "--by", "method"])
    assert timed.exit_code == 0 and "sum_verify" in timed.output


def test_count_reads_complete_runs_and_names_the_others(store: str) -> None:
    """A failed run is left out unless --statuses asks for it, and named on stderr."""
    runner = CliRunner()
    result = runner.invoke(app, ["count", store, "--by", "run_id"])
    assert result.exit_code == 0, result.output
    assert "ref/gsm8k/dspark-n3-crashed (failed)" in result.stderr
    assert "dspark-n3-crashed" not in result.stdout
    asked = runner.invoke(app, ["count", store, "--by", "run_id", "--statuses", "complete,failed"])
    assert asked.exit_code == 0 and "dspark-n3-crashed" in asked.stdout, asked.output
    bad = runner.invoke(app, ["count", store, "--statuses", "finished"])
    assert bad.exit_code != 0 and "--statuses='finished': unknown status" in str(bad.exception)


def test_count_refuses_a_bad_option_in_one_line(store: str, tmp_path: Path) -> None:
    for args in (["--out", str(tmp_path / "x.txt")], ["--engine", "presto"]):
        done = subprocess.run(
            [sys.executable, "-c", "from dsparklab.cli.app import main; main()", "count", store]
            + args,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
