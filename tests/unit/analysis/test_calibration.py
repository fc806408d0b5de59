"""Calibration: ECE, Brier, AUROC, reliability, temperature; agreement with scikit-learn."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from analysis_synth import build_run, concat, noisy_confidence, uniform_confidence
from sklearn.metrics import brier_score_loss, roc_auc_score

from dsparklab.analysis import (
    compute_acceptance_by_position,
    compute_auroc,
    compute_brier,
    compute_calibration,
    compute_ece,
    compute_reliability,
    compute_reliability_ece,
)
from dsparklab.errors import UnknownMethodError
from tests.oracles import count_calibration


def direct_ece(score: np.ndarray, label: np.ndarray, n_bins: int) -> float:
    """ECE written out the textbook way: loop over bins, weight |acc - conf| by size."""
    total = 0.0
    for b in range(n_bins):
        lo, hi = b / n_bins, (b + 1) / n_bins
        inside = (score >= lo) & ((score < hi) if b < n_bins - 1 else (score <= hi))
        if inside.any():
            total += inside.mean() * abs(label[inside].mean() - score[inside].mean())
    return total


def test_ece_on_a_known_example():
    score = np.array([0.05, 0.15, 0.15, 0.95, 0.95, 1.0])
    label = np.array([0, 0, 1, 1, 1, 0], dtype=bool)
    # bins: [0,.1): {.05|0} -> |0-.05|; [.1,.2): {.15,.15|0,1} -> |.5-.15|;
    # [.9,1]: {.95,.95,1|1,1,0} -> |2/3 - 2.9/3|
    expected = (1 / 6) * 0.05 + (2 / 6) * 0.35 + (3 / 6) * abs(2 / 3 - 2.9 / 3)
    assert compute_ece(score, label, n_bins=10) == pytest.approx(expected)
    assert direct_ece(score, label, 10) == pytest.approx(expected)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ece_equals_direct_implementation_and_auroc_brier_equal_sklearn(seed):
    rng = np.random.default_rng(seed)
    score = rng.random(2000)
    score[:300] = np.round(score[:300], 1)  # ties, and exact bin edges
    label = rng.random(2000) < score**1.5
    for n_bins in (5, 10, 15):
        assert compute_ece(score, label, n_bins=n_bins) == pytest.approx(
            direct_ece(score, label, n_bins), abs=1e-12
        )
    assert compute_auroc(score, label) == pytest.approx(roc_auc_score(label, score), abs=1e-12)
    assert compute_brier(score, label) == pytest.approx(brier_score_loss(label, score), abs=1e-12)


def test_auroc_on_a_grid_is_within_the_tie_bound():
    rng = np.random.default_rng(5)
    run = build_run(
        n=4, accept=[0.9, 0.7, 0.6, 0.5], n_requests=80, seed=5, confidence=noisy_confidence(0.25)
    )
    exact = compute_calibration(run.positions, by="n", per_position=False)
    grid = compute_calibration(run.positions, by="n", per_position=False, levels=1000)
    np.testing.assert_allclose(grid["auroc"], exact["auroc"], atol=1e-3)
    np.testing.assert_allclose(grid["brier"], exact["brier"], rtol=1e-12)
    np.testing.assert_allclose(grid["ece"], exact["ece"], rtol=1e-12)
    del rng


def test_per_position_rows_use_reached_rows_and_prefix_uses_the_running_product():
    run = build_run(n=4, accept=0.7, n_requests=30, seed=2, confidence=uniform_confidence(0.2, 1.0))
    table = compute_calibration(run.positions, by="n")
    acceptance = compute_acceptance_by_position(run.positions, by="n", n_boot=0)
    conditional = table[table["score"] == "confidence"].reset_index(drop=True)
    assert conditional["n_rows"].tolist() == acceptance["n_reached"].tolist()
    assert conditional["n_accepted"].tolist() == acceptance["n_accepted"].tolist()
    prefix = table[table["score"] == "prefix_confidence"].reset_index(drop=True)
    assert prefix["n_rows"].tolist() == acceptance["n_drafted"].tolist()
    # mean prefix score at position i = mean of cumprod of the step's confidences
    wide = run.positions.pivot_table(
        index=["request_id", "step"], columns="position", values="confidence"
    ).to_numpy(dtype=np.float64)
    np.testing.assert_allclose(prefix["mean_score"], np.cumprod(wide, axis=1).mean(axis=0))
    brier = (
        (
            np.cumprod(wide, axis=1)
            - run.positions.pivot_table(
                index=["request_id", "step"], columns="position", values="accepted"
            ).to_numpy(dtype=float)
        )
        ** 2
    ).mean(axis=0)
    np.testing.assert_allclose(prefix["brier"], brier)


def test_fitted_temperature_recovers_the_one_used_to_make_labels():
    rng = np.random.default_rng(0)
    logit = rng.normal(0.0, 2.0, 40_000)
    score = 1 / (1 + np.exp(-logit))
    true_t = 2.0  # labels follow sigmoid(logit / 2): the head is over-confident
    label = rng.random(len(logit)) < 1 / (1 + np.exp(-logit / true_t))
    part = pd.DataFrame(
        {
            "position": 0,
            "accepted": label,
            "confidence": score,
            "request_id": np.arange(len(score)) // 5,
            "step": np.arange(len(score)) % 5,
        }
    )
    part["position"] = 0
    counts = count_calibration(
        part.assign(step=np.arange(len(score))), by=(), scores=("confidence",), levels=None
    )
    row = compute_calibration(counts, by=(), scores=("confidence",)).iloc[0]
    assert row["temperature"] == pytest.approx(true_t, rel=0.05)
    assert row["ece_calibrated"] < row["ece"] / 3


def test_reliability_bins_add_up():
    run = build_run(n=3, accept=0.6, n_requests=40, seed=4, confidence=uniform_confidence(0, 1))
    rel = compute_reliability(run.positions, by="n", per_position=False, n_bins=8)
    summary = compute_calibration(run.positions, by="n", per_position=False, n_bins=8)
    for score, part in rel.groupby("score"):
        row = summary[summary["score"] == score].iloc[0]
        assert part["count"].sum() == row["n_rows"]
        assert (part["mean_score"] >= part["bin_lo"]).all()
        assert (part["mean_score"] <= part["bin_hi"]).all()
        weighted = (part["count"] * part["gap"].abs()).sum() / part["count"].sum()
        assert weighted == pytest.approx(row["ece"])


def test_bins_keep_their_edges_when_the_top_bins_are_empty():
    """Scores below 0.45 fill bins 0..4 of 10: bin 4 is [0.4, 0.5], not the last fifth."""
    run = build_run(n=3, accept=0.5, n_requests=30, seed=5, confidence=uniform_confidence(0, 0.45))
    rel = compute_reliability(run.positions, by=(), scores=("confidence",), n_bins=10)
    assert rel["bin"].max() == 4
    np.testing.assert_allclose(rel["bin_lo"], rel["bin"] / 10)
    np.testing.assert_allclose(rel["bin_hi"], (rel["bin"] + 1) / 10)
    assert (rel["mean_score"] >= rel["bin_lo"]).all() and (rel["mean_score"] <= rel["bin_hi"]).all()
    # the temperature-scaled ECE bins on the same 10 bins: counts pooled over a store agree
    counts = count_calibration(run.positions, by=(), scores=("confidence",), n_bins=10)
    direct = compute_calibration(run.positions, by=(), scores=("confidence",), n_bins=10)
    pooled = compute_calibration(counts, by=(), scores=("confidence",))
    np.testing.assert_allclose(pooled["ece_calibrated"], direct["ece_calibrated"])


def test_ece_of_the_reliability_bins_is_the_calibration_ece():
    run = build_run(n=4, accept=0.7, n_requests=30, seed=6, confidence=uniform_confidence(0.2, 1))
    rel = compute_reliability(run.positions, steps=run.steps, by="method", n_bins=12)
    summary = compute_calibration(run.positions, steps=run.steps, by="method", n_bins=12)
    keys = ["method", "score", "position"]
    ece = compute_reliability_ece(rel, by="method").merge(summary, on=keys, suffixes=("", "_cal"))
    assert len(ece) == len(summary)
    np.testing.assert_allclose(ece["ece"], ece["ece_cal"], rtol=1e-12)
    assert (ece["count"] == ece["n_rows"]).all()


def test_rows_without_confidence_are_skipped_and_unknown_scores_refused():
    dspark = build_run(run_id="d", n=3, n_requests=5, seed=1)
    eagle = build_run(run_id="e", method="eagle3", n=3, n_requests=5, seed=2)
    positions, _ = concat(dspark, eagle)
    table = compute_calibration(positions, by="method")
    assert set(table["method"]) == {"dspark"}
    with pytest.raises(UnknownMethodError, match="valid scores are"):
        compute_calibration(positions, scores=("entropy",))
