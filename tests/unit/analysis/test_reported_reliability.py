"""Reliability bins a source reported (DeepSpec's metrics.json), imported into the store.

The bins keep the index and the ``range`` edges the file wrote (a position whose only
non-empty bins are 13 and 17 has exactly those two rows), the table has the shape of the
token-level one, and the ECE recomputed from the bins equals the file's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from analysis_synth import build_run, uniform_confidence

from dsparklab.analysis import (
    compute_reliability,
    compute_reliability_ece,
    compute_reported_reliability,
)
from dsparklab.errors import DSparkLabError, MissingInputError
from dsparklab.importers import import_files
from dsparklab.store import read_trace
from dsparklab.store.location import Location

FIXTURES = Path(__file__).parents[1] / "importers" / "fixtures"
BINS_13_17: list[dict[str, Any]] = [
    {"bin": 13, "range": [0.65, 0.7], "avg_pred": 0.671, "avg_target": 0.52, "weight": 68.0},
    {"bin": 17, "range": [0.85, 0.9], "avg_pred": 0.862, "avg_target": 0.9, "weight": 203.0},
]


def _ece(bins: list[dict[str, Any]]) -> float:
    """DeepSpec's ECE: sum_b |avg_pred_b - avg_target_b| weight_b / sum_b weight_b."""
    err = sum(abs(b["avg_pred"] - b["avg_target"]) * b["weight"] for b in bins)
    return err / sum(b["weight"] for b in bins)


def _bins_13_and_17() -> dict[str, Any]:
    """The full-block fixture with position 3's non-empty bins only 13 and 17 (upstream
    layout: empty bins are not listed), its ECE the one those bins give."""
    metrics = json.loads((FIXTURES / "deepspec_metrics.json").read_text())
    position = metrics["confidence"]["per_position"][3]
    assert position["total_weight"] == sum(b["weight"] for b in BINS_13_17)
    position["reliability"] = BINS_13_17
    position["ece"] = _ece(BINS_13_17)
    return metrics


def _import(tmp_path: Path, metrics: dict[str, Any], name: str = "gsm8k") -> Location:
    path = tmp_path / "artifacts" / "step_2000" / name / "metrics.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(metrics))
    _, result = import_files("deepspec", [path], tmp_path / "runs")
    (run,) = result.written
    return run


def test_bins_13_and_17_keep_their_index_edges_and_ece(tmp_path: Path) -> None:
    metrics = _bins_13_and_17()
    calibration = read_trace(_import(tmp_path, metrics), "calibration")
    reliability = compute_reported_reliability(calibration)
    at3 = reliability[reliability["position"] == 3]
    assert at3["bin"].tolist() == [13, 17]
    assert at3[["bin_lo", "bin_hi"]].to_numpy().tolist() == [[0.65, 0.7], [0.85, 0.9]]
    # the mean prediction and observed rate as written (w p / w: up to rounding)
    np.testing.assert_allclose(at3["mean_score"], [0.671, 0.862], rtol=1e-15)
    np.testing.assert_allclose(at3["accept_rate"], [0.52, 0.9], rtol=1e-15)
    assert at3["count"].tolist() == [68.0, 203.0]
    np.testing.assert_allclose(at3["gap"], [0.52 - 0.671, 0.9 - 0.862])
    assert set(at3["source"]) == {"reported by deepspec"}
    # every other position: each bin the file lists, at its index and edges, nothing more
    written = metrics["confidence"]["per_position"]
    in_file = [(p["position"], b["bin"], *b["range"]) for p in written for b in p["reliability"]]
    stored = reliability[["position", "bin", "bin_lo", "bin_hi"]].itertuples(index=False)
    assert [(int(p), int(b), lo, hi) for p, b, lo, hi in stored] == in_file
    # the ECE of the bins is the file's, at every position
    ece = compute_reliability_ece(reliability).set_index("position")
    assert ece.loc[3, "ece"] == pytest.approx(_ece(BINS_13_17), rel=1e-12)
    assert (ece.loc[3, "n_bins"], ece.loc[3, "count"]) == (2, 271.0)
    for p in written:
        assert ece.loc[p["position"], "ece"] == pytest.approx(p["ece"], rel=1e-12)


def test_reported_table_has_the_token_level_shape(tmp_path: Path) -> None:
    run = build_run(confidence=uniform_confidence(0.2, 1.0))
    token = compute_reliability(run.positions, steps=run.steps, by="method")
    reported = compute_reported_reliability(
        read_trace(_import(tmp_path, _bins_13_and_17()), "calibration"), by="method"
    )
    assert list(reported.columns) == [*token.columns, "source"]
    assert reported["bin"].dtype == token["bin"].dtype


def test_runs_pool_by_weight_and_groups_without_bins_are_refused(tmp_path: Path) -> None:
    first = read_trace(_import(tmp_path / "a", _bins_13_and_17()), "calibration")
    second = read_trace(_import(tmp_path / "b", _bins_13_and_17(), "other"), "calibration")
    both = pd.concat([first, second], ignore_index=True)
    pooled = compute_reported_reliability(both, by=())
    at3 = pooled[pooled["position"] == 3]
    assert at3["bin"].tolist() == [13, 17] and at3["count"].tolist() == [136.0, 406.0]
    np.testing.assert_allclose(at3["mean_score"], [0.671, 0.862])
    # one bin index with two sets of edges cannot be pooled
    moved = second.copy()
    moved.loc[moved["bin"] == 13, "bin_lo"] = 0.6
    with pytest.raises(DSparkLabError, match="reported bin 13 has bin_lo"):
        compute_reported_reliability(pd.concat([first, moved]), by=())
    with pytest.raises(MissingInputError, match="reliability bins"):
        compute_reported_reliability(first[first["bin"].isna()])


def test_bins_pooled_over_positions_give_the_pooled_ece(tmp_path: Path) -> None:
    metrics = _bins_13_and_17()
    calibration = read_trace(_import(tmp_path, metrics), "calibration")
    pooled = compute_reported_reliability(calibration, per_position=False)
    every = [b for p in metrics["confidence"]["per_position"] for b in p["reliability"]]
    assert pooled["count"].sum() == pytest.approx(sum(b["weight"] for b in every))
    assert list(pooled["bin"]) == sorted({b["bin"] for b in every})
    (ece,) = compute_reliability_ece(pooled, per_position=False)["ece"]
    by_bin: dict[int, list[float]] = {}
    for b in every:
        w, p, t = by_bin.setdefault(b["bin"], [0.0, 0.0, 0.0])
        by_bin[b["bin"]] = [w + b["weight"], p + b["weight"] * b["avg_pred"],
                            t + b["weight"] * b["avg_target"]]  # fmt: skip
    expected = sum(abs(p - t) for _, p, t in by_bin.values()) / sum(
        w for w, _, _ in by_bin.values()
    )
    assert ece == pytest.approx(expected, rel=1e-12)
