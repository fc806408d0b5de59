"""The reliability diagram draws a source's reported bins where its table puts them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest

from dsparklab.analysis import compute_reported_reliability
from dsparklab.importers import import_files
from dsparklab.plots import plot_reliability
from dsparklab.store import read_trace

FIXTURES = Path(__file__).parents[1] / "importers" / "fixtures"


@pytest.fixture
def reported(tmp_path: Path) -> pd.DataFrame:
    """DeepSpec's full-block fixture with position 3's only non-empty bins 13 and 17."""
    metrics = json.loads((FIXTURES / "deepspec_metrics.json").read_text())
    position = metrics["confidence"]["per_position"][3]
    position["reliability"] = [
        {"bin": 13, "range": [0.65, 0.7], "avg_pred": 0.671, "avg_target": 0.52, "weight": 68.0},
        {"bin": 17, "range": [0.85, 0.9], "avg_pred": 0.862, "avg_target": 0.9, "weight": 203.0},
    ]
    position["ece"] = (0.151 * 68 + 0.038 * 203) / 271
    path = tmp_path / "artifacts" / "step_2000" / "gsm8k" / "metrics.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(metrics))
    _, result = import_files("deepspec", [path], tmp_path / "runs")
    (run,) = result.written
    return compute_reported_reliability(read_trace(run, "calibration"), by=("method", "dataset"))


def _trace(fig: go.Figure, name: str) -> Any:
    (trace,) = [t for t in fig.data if t.name == name]
    return trace


def test_reported_bins_sit_at_their_mean_and_span_their_edges(reported: pd.DataFrame) -> None:
    fig = plot_reliability(reported, score="prefix_confidence")
    positions = sorted(reported["position"].unique())
    names = [t.name for t in fig.data if t.name != "perfect calibration"]
    assert names == [f"position {p} · reported by deepspec" for p in positions]
    table = reported[reported["position"] == 3].sort_values("mean_score")
    trace = _trace(fig, "position 3 · reported by deepspec")
    np.testing.assert_array_equal(trace.x, table["mean_score"])
    np.testing.assert_array_equal(trace.y, table["accept_rate"])
    count, index, lo, hi = np.asarray(trace.customdata, dtype=float).T
    assert index.tolist() == [13, 17] and count.tolist() == [68.0, 203.0]
    assert lo.tolist() == [0.65, 0.85] and hi.tolist() == [0.7, 0.9]
    # the horizontal bar spans the bin's edges as written
    x = np.asarray(trace.x)
    np.testing.assert_allclose(x - np.asarray(trace.error_x.arrayminus), [0.65, 0.85])
    np.testing.assert_allclose(x + np.asarray(trace.error_x.array), [0.7, 0.9])
    assert trace.line.dash == "dot" and "weight=" in trace.hovertemplate
    assert "bin %{customdata[1]:d}" in trace.hovertemplate


def test_token_level_and_reported_bins_stay_separate_lines(reported: pd.DataFrame) -> None:
    token = reported.drop(columns="source").assign(count=lambda f: f["count"].astype(int))
    both = pd.concat([token, reported], ignore_index=True)
    fig = plot_reliability(both, score="prefix_confidence", positions=[3])
    plain = _trace(fig, "position 3")
    assert plain.error_x.array is None and plain.line.dash == "solid"
    assert "rows=" in plain.hovertemplate
    np.testing.assert_array_equal(plain.x, _trace(fig, "position 3 · reported by deepspec").x)
    # the default score is the head's own confidence, which DeepSpec does not report
    empty = plot_reliability(reported)
    assert not empty.data and "no confidence recorded" in empty.layout.annotations[0].text
