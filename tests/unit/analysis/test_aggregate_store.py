"""Metrics on traces written through the store agree with validate, and both paths agree."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from analysis_synth import build_run, noisy_confidence, write_run

from dsparklab.analysis import (
    aggregate_store,
    compute_acceptance_by_position,
    compute_acceptance_length,
    compute_calibration,
    compute_window_scaling,
)
from dsparklab.errors import DSparkLabError, UnknownMethodError
from dsparklab.store import read_run_json, read_trace, validate_trace
from tests.oracles import count_acceptance, count_acceptance_from_steps, count_calibration


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("store")
    runs = [
        build_run(run_id="base", method="none", n=0, n_requests=6, seed=1),
        build_run(
            run_id="ds3", n=3, accept=0.7, n_requests=12, seed=2, confidence=noisy_confidence(0.2)
        ),
        build_run(
            run_id="ds5",
            n=5,
            accept=0.6,
            n_requests=10,
            seed=3,
            steps_per_request=[3, 9, 1, 12, 5, 5, 7, 2, 8, 4],
        ),
        # adaptive verification: some steps verified fewer positions than drafted
        build_run(
            run_id="ada",
            n=4,
            accept=0.8,
            n_requests=8,
            seed=4,
            num_verified=lambda d, g: np.where(g.random(len(d)) < 0.5, d, g.integers(1, 4, len(d))),
        ),
        build_run(run_id="e4", method="eagle3", n=4, accept=0.5, n_requests=9, seed=5),
    ]
    for run in runs:
        write_run(root, run)
    return root


def test_metrics_agree_with_what_validate_counts(store):
    reports = validate_trace(store)
    assert all(r.ok and r.complete for r in reports), [
        str(v) for r in reports for v in r.violations
    ]
    positions = read_trace(store, "positions")
    steps = read_trace(store, "steps")
    counts = count_acceptance(positions, steps=steps, by="run_id", per_request=False)
    for report in reports:
        run_id = read_run_json(report.path)["run_id"]  # in the table layout: run_id=<id>
        mine = counts[counts["run_id"] == run_id]
        run_steps = steps[steps["run_id"] == run_id]
        # validate counted the rows; validate checked accepted_len == accepted rows per step
        assert mine["n_drafted"].sum() == report.rows["positions"]
        assert mine["n_accepted"].sum() == run_steps["accepted_len"].sum()
        assert report.rows["steps"] == len(run_steps)
        if len(mine):
            assert (
                mine.loc[mine["position"] == 0, "n_reached"].iloc[0]
                == (run_steps["num_drafted"] > 0).sum()
            )
    lengths = compute_acceptance_length(positions, steps=steps, by="run_id", n_boot=0)
    for row in lengths.itertuples():
        if row.run_id == "ada":  # adaptive: 1 + sum s_i estimates the full window instead
            continue
        run_steps = steps[steps["run_id"] == row.run_id]
        assert row.accept_len == pytest.approx((run_steps["accepted_len"] + 1).mean())
    scaling = compute_window_scaling(steps, by="run_id", n_boot=0)
    assert set(scaling["run_id"]) == {"ds3", "ds5", "ada", "e4"}
    assert scaling["speedup"].notna().all()


@pytest.mark.parametrize(
    "by", [("n",), ("method", "n"), ("run_id", "prompt_id"), ("dataset", "request_id"), ()]
)
def test_store_path_equals_in_memory_path(store, by):
    positions = read_trace(store, "positions")
    steps = read_trace(store, "steps")
    keys = [*by, "position"]
    memory = count_acceptance(positions, steps=steps, by=by, per_request=False)
    from_steps = count_acceptance_from_steps(steps, by=by, per_request=False)
    for other in (
        aggregate_store(store, metric="acceptance", by=by, per_request=False),
        aggregate_store(store, metric="acceptance", by=by, source="positions", per_request=False),
        from_steps,
    ):
        pd.testing.assert_frame_equal(
            other.sort_values(keys).reset_index(drop=True),
            memory.sort_values(keys).reset_index(drop=True),
            check_dtype=False,
        )
    cal_keys = [*by, "score", "position", "bin", "level", "accepted"]
    disk = aggregate_store(
        store, metric="calibration", by=by, levels=None, threads=1, per_request=False
    )
    memory = count_calibration(positions, steps=steps, by=by, levels=None)
    pd.testing.assert_frame_equal(
        disk.sort_values(cal_keys).reset_index(drop=True),
        memory.sort_values(cal_keys).reset_index(drop=True),
        check_dtype=False,
    )


def test_store_counts_finish_like_frames(store):
    positions = read_trace(store, "positions")
    steps = read_trace(store, "steps")
    disk = aggregate_store(store, by=("method", "n"), per_request=True)
    a = compute_acceptance_by_position(disk, by=("method", "n"), n_boot=100, seed=3)
    b = compute_acceptance_by_position(
        positions, steps=steps, by=("method", "n"), n_boot=100, seed=3
    )
    pd.testing.assert_frame_equal(a, b, check_dtype=False)
    grid = aggregate_store(store, metric="calibration", by="n", filters={"method": "dspark"})
    table = compute_calibration(grid, by="n")
    exact = compute_calibration(positions[positions["method"] == "dspark"], steps=steps, by="n")
    np.testing.assert_allclose(table["brier"], exact["brier"])
    np.testing.assert_allclose(table["ece"], exact["ece"])
    np.testing.assert_allclose(table["auroc"], exact["auroc"], atol=2e-3)


def test_store_path_refuses_what_it_cannot_do(store):
    with pytest.raises(UnknownMethodError, match="valid metrics are"):
        aggregate_store(store, metric="latency")
    with pytest.raises(UnknownMethodError, match="valid sources are"):
        aggregate_store(store, source="requests")
    with pytest.raises(DSparkLabError, match="cannot group by"):
        aggregate_store(store, by="position")
    with pytest.raises(DSparkLabError, match="filters runs only"):
        aggregate_store(store, filters={"accepted": True})
    empty = aggregate_store(store, filters={"method": "medusa"})
    assert empty.empty
