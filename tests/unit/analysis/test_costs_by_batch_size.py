"""The cost table per runtime batch size (issue 32): each step of b requests is costed
against the target-only steps of b requests, counted alike by DuckDB and in process."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from analysis_synth import Run, build_run, write_run

from dsparklab.analysis import fitted_cost_table
from dsparklab.analysis.layouts import MATCH_COLUMNS, STEP_TIME_COUNTERS
from dsparklab.analysis.sql import aggregate_store
from dsparklab.errors import DSparkLabError
from dsparklab.store import read_trace
from tests.oracles import count_step_times

# the target-only step of b requests takes BASE[b] s; a verify of n + 1 = 4 tokens VERIFY[b]
# of those steps and the draft pass DRAFT[b] of them: verifying costs more as the batch fills
BASE = {1: 0.010, 2: 0.012, 4: 0.016}
VERIFY = {1: 1.10, 2: 1.40, 4: 2.00}
DRAFT = {1: 0.30, 2: 0.25, 4: 0.20}
MATCH = (*MATCH_COLUMNS, "batch_size")


def _batched(run: Run, seed: int) -> Run:
    """The run's steps spread over batch sizes 1, 2 and 4, each row holding its share of
    its batch's time (time / b), as the taps write it."""
    steps = run.steps.copy()
    b = np.random.default_rng(seed).choice([1, 2, 4], len(steps))
    base = np.array([BASE[x] for x in b])
    steps["batch_size"] = b.astype(np.int32)
    if run.meta["method"] == "none":
        steps["verify_time_s"] = base / b
        steps["draft_time_s"] = np.nan
    else:
        steps["verify_time_s"] = base * np.array([VERIFY[x] for x in b]) / b
        steps["draft_time_s"] = base * np.array([DRAFT[x] for x in b]) / b
    return Run(run.meta, steps, run.positions)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("by-batch")
    write_run(root, _batched(build_run(run_id="base", method="none", n=0, seed=1), 1))
    write_run(root, _batched(build_run(run_id="eagle3-n3", method="eagle3", n=3, seed=2), 2))
    return root


def test_each_batch_size_is_costed_against_the_baseline_steps_of_that_size(store: Path):
    steps = read_trace(store, "steps")
    table = fitted_cost_table(steps, by=("batch_size",)).set_index("batch_size")
    for b in BASE:
        assert table.loc[b, "verify_cost"] == pytest.approx(VERIFY[b], rel=1e-9)
        assert table.loc[b, "draft_cost"] == pytest.approx(DRAFT[b], rel=1e-9)
    # pooled over batch sizes, one number hides the rise
    pooled = fitted_cost_table(steps)
    assert VERIFY[1] < float(pooled["verify_cost"].iloc[0]) < VERIFY[4]


def test_duckdb_counts_by_batch_size_equal_the_in_process_counts(store: Path):
    by = ("method", "batch_size")
    sql = aggregate_store(store, metric="step_times", by=by, match=MATCH, per_request=True)
    mine = count_step_times(read_trace(store, "steps"), by=by, match=MATCH, per_request=True)
    keys = [c for c in mine.columns if c not in STEP_TIME_COUNTERS]
    pd.testing.assert_frame_equal(
        sql.sort_values(keys).reset_index(drop=True)[mine.columns],
        mine.sort_values(keys).reset_index(drop=True),
        check_dtype=False,
        check_exact=False,
        rtol=1e-12,
    )
    # the cost table from the store's counts is the one from the rows
    from_counts = fitted_cost_table(sql, by=("batch_size",)).set_index("batch_size")
    assert from_counts.loc[4, "verify_cost"] == pytest.approx(VERIFY[4], rel=1e-9)


def test_batch_size_groups_step_times_only(store: Path):
    with pytest.raises(DSparkLabError, match="only for step times"):
        aggregate_store(store, metric="acceptance", by=("batch_size",))


def test_a_batch_size_pairs_across_the_loads_the_runs_kept(store: Path):
    """A step of one request in a run kept at four is costed against the target-only
    steps of one request, wherever the baseline ran them (here only at concurrency 1)."""
    steps = read_trace(store, "steps")
    base = steps["method"] == "none"
    steps["concurrency"] = 4
    steps.loc[base & (steps["batch_size"] == 1), "concurrency"] = 1
    table = fitted_cost_table(steps, by=("batch_size",)).set_index("batch_size")
    assert table.loc[1, "verify_cost"] == pytest.approx(VERIFY[1], rel=1e-9)


def test_steps_without_a_batch_size_are_left_out_not_paired_across_loads(
    store: Path, caplog: pytest.LogCaptureFixture
):
    """Imported or migrated steps carry no batch size: they are left out, with a warning,
    never paired with the baseline's other size-less steps whatever their loads."""
    steps = read_trace(store, "steps")
    unknown = steps.sample(frac=0.3, random_state=0).index
    # size-less steps with a cost of their own: pairing them would move every number
    steps.loc[unknown, "batch_size"] = pd.NA
    steps.loc[unknown, "verify_time_s"] *= 5
    with caplog.at_level("WARNING", logger="dsparklab.analysis.projection"):
        table = fitted_cost_table(steps, by=("batch_size",)).set_index("batch_size")
    assert f"{len(unknown)} of {len(steps)} rows have no batch_size" in caplog.text
    assert table["verify_cost"].notna().all() and sorted(table.index) == sorted(BASE)
    for b in BASE:
        assert table.loc[b, "verify_cost"] == pytest.approx(VERIFY[b], rel=1e-9)
