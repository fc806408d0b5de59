"""A store past the row budget: notebooks read the whole requests of a sample of prompts (the
same in every run), and say so."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dsparklab.analysis import (
    compute_acceptance_by_position,
    compute_calibration,
    compute_regression_diff,
    compute_window_scaling,
    fitted_cost_table,
)
from dsparklab.errors import ConfigError
from dsparklab.lab.notebook import MAX_ROWS_ENV, load_any_runs, load_runs
from dsparklab.report.findings import compute_findings, sampled_notes
from dsparklab.store import Catalog, read_trace
from dsparklab.store.sampling import request_unit
from tests.notebooks.lab_synth import write_synthetic_run


@pytest.fixture
def store(tmp_path: Path) -> Path:
    for method, n in (("dspark", 3), ("eagle3", 3), ("none", 0)):
        write_synthetic_run(tmp_path, method=method, n=n, dataset="prose", n_requests=40)
    return tmp_path


def test_past_the_budget_whole_requests_are_read_and_the_fraction_said(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = load_runs(store)
    total = len(full.positions)
    assert (full.runs["sample"] == 1.0).all()
    monkeypatch.setenv(MAX_ROWS_ENV, str(total // 4))
    runs = load_runs(store)
    # the quarter of the prompts with the smallest points, the same in every run
    prompts = full.steps.drop_duplicates("request_id").set_index("request_id")["prompt_id"]
    points = prompts.map(request_unit).sort_values()
    kept = set(points.index[: len(points) // 4])
    assert runs.runs["sample"].tolist() == pytest.approx([len(kept) / len(points)] * 3)
    assert full.rows_note == "" and f"hold {len(kept) / len(points):.0%} of" in runs.rows_note
    assert set(runs.positions["request_id"]) | set(runs.steps["request_id"]) == kept
    for table, keys in ((runs.positions, ["run_id", "request_id", "step", "position"]),
                        (runs.steps, ["run_id", "request_id", "step"])):  # fmt: skip
        whole = getattr(full, "positions" if "position" in keys else "steps")
        want = whole[whole["request_id"].isin(kept)].sort_values(keys).reset_index(drop=True)
        got = table.sort_values(keys).reset_index(drop=True)
        assert got[keys].equals(want[keys])  # each kept request whole, in every run
    assert set(runs.steps["method"]) == {"dspark", "eagle3", "none"}  # baselines sampled alike
    any_runs = load_any_runs(store)
    assert set(any_runs.positions["request_id"]) == set(runs.positions["request_id"])
    labels = pd.Series("store", index=any_runs.runs["run_id"])  # run_id -> run set
    (note,) = sampled_notes(any_runs.runs, labels)
    assert "hold a sample" in note and "DSPARKLAB_MAX_ROWS" in note
    assert len(read_trace(store, "positions")) == total  # the store itself is untouched


def test_a_store_recorded_as_a_sample_is_read_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 33: runs recorded with DSPARKLAB_SAMPLE=0.1 hold only prompts whose points lie
    below 0.1; past the budget the lab reads half of those (not all of them, at twice the
    budget) and labels each run with the share its tables hold."""
    for method, n in (("dspark", 3), ("eagle3", 3), ("none", 0)):
        write_synthetic_run(
            tmp_path, method=method, n=n, dataset="prose", n_requests=400, sample=0.1
        )
    full = load_runs(tmp_path)
    assert (full.runs["sample"] == 0.1).all()
    recorded = full.steps["request_id"].nunique()
    assert 20 < recorded < 60
    monkeypatch.setenv(MAX_ROWS_ENV, str(len(full.positions) // 2))
    runs = load_runs(tmp_path)
    read = runs.steps["request_id"].nunique()
    assert len(runs.positions) <= len(full.positions) // 2 + 200  # the budget, to a request
    assert abs(read - recorded / 2) <= 1
    assert runs.runs["sample"].tolist() == pytest.approx([0.1 * read / recorded] * 3)


def test_a_bad_budget_is_one_line(store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MAX_ROWS_ENV, "lots")
    with pytest.raises(ConfigError, match="DSPARKLAB_MAX_ROWS='lots'"):
        load_runs(store)


def test_headline_counts_cover_every_request_past_the_budget(
    store: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Past the budget the frames hold a sample, but the counts DuckDB makes (the
    notebooks' heatmaps, AL and speedup; the report's findings) are over every request."""
    full = load_runs(store)
    by = ("method", "n", "dataset")
    want = compute_acceptance_by_position(full.positions, steps=full.steps, by=by, n_boot=0)
    scaling = compute_window_scaling(full.steps, by=("method", "dataset"), n_boot=0)
    findings = compute_findings(Catalog.of(store), tmp_path / "all", n_boot=0)
    monkeypatch.setenv(MAX_ROWS_ENV, str(len(full.positions) // 4))
    runs = load_runs(store)
    assert len(runs.positions) < len(full.positions)
    got = compute_acceptance_by_position(runs.acceptance_counts(), by=by, n_boot=0)
    keys = [*by, "position"]
    pd.testing.assert_frame_equal(
        got.sort_values(keys).reset_index(drop=True), want.sort_values(keys).reset_index(drop=True)
    )
    assert (got["n_requests"] == 40).all()
    counted = compute_window_scaling(runs.step_time_counts(), by=("method", "dataset"), n_boot=0)
    assert counted["n_steps"].tolist() == scaling["n_steps"].tolist()
    assert counted["speedup"].to_numpy() == pytest.approx(scaling["speedup"].to_numpy(), rel=1e-12)
    # notebook 05's deltas: per-prompt counts over every request, paired as the rows are
    counts = runs.acceptance_counts(by=("prompt_id",))
    for level in ("dataset", "position"):
        rows = [
            (full.positions[full.positions["method"] == m], full.steps[full.steps["method"] == m])
            for m in ("eagle3", "dspark")
        ]
        want = compute_regression_diff(
            rows[0][0], rows[1][0], base_steps=rows[0][1], new_steps=rows[1][1], level=level
        )
        got = compute_regression_diff(
            *(counts[counts["method"] == m] for m in ("eagle3", "dspark")), level=level
        )
        pd.testing.assert_frame_equal(got, want)
        assert (got["n_units_base"] == 40).all()
    # notebook 03's calibration and notebook 02's costs: counted over every request too
    by = ("method", "dataset")
    keys = [*by, "score", "position"]
    want = compute_calibration(full.positions, steps=full.steps, by=by).sort_values(keys)
    got = compute_calibration(runs.calibration_counts(), by=by).sort_values(keys)
    assert len(want) and got["n_rows"].tolist() == want["n_rows"].tolist()
    for name in ("ece", "brier", "auroc", "temperature"):
        np.testing.assert_allclose(got[name], want[name], rtol=1e-9, equal_nan=True)
    pd.testing.assert_frame_equal(
        fitted_cost_table(runs.step_time_counts(), by=["dataset"]),
        fitted_cost_table(full.steps, by=["dataset"]),
    )
    sampled = compute_findings(Catalog.of(store), tmp_path / "sampled", n_boot=0)
    assert sampled.acceptance == findings.acceptance and sampled.acceptance
    assert not any("hold a sample" in note for note in sampled.notes)


def test_calibration_counts_name_the_runs_without_a_confidence(tmp_path: Path) -> None:
    """Runs with no confidence head count no calibration row: the lab says which runs lack
    the input (a notebook section then reads "not computed"), the library counts nothing."""
    from dsparklab.analysis import aggregate_store
    from dsparklab.errors import MissingInputError

    for method, n in (("eagle3", 3), ("none", 0)):
        write_synthetic_run(tmp_path, method=method, n=n, dataset="prose", n_requests=4)
    runs = load_runs(tmp_path)
    with pytest.raises(MissingInputError, match="runs of eagle3 lack"):
        runs.calibration_counts()
    counts = aggregate_store(tmp_path, metric="calibration", by=("method",), per_request=False)
    assert counts.empty and compute_calibration(counts, by=("method",)).empty
