"""The seeds' question on known curves: rises, flat (overlapping intervals), falls."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dsparklab.analysis.findings import seeds_answer, speedup_trend


def _scaling(rows):
    return pd.DataFrame(
        rows, columns=["dataset", "method", "n", "speedup", "speedup_lo", "speedup_hi"]
    )


def test_trend_classes_follow_the_intervals():
    scaling = _scaling(
        [
            ("gsm8k", "dspark", 3, 1.50, 1.45, 1.55),
            ("gsm8k", "dspark", 5, 1.70, 1.60, 1.80),
            ("gsm8k", "dspark", 7, 1.80, 1.70, 1.90),  # 1.70 > 1.55: rises
            ("gsm8k", "eagle3", 3, 1.60, 1.50, 1.70),
            ("gsm8k", "eagle3", 7, 1.55, 1.45, 1.65),  # overlap: flat
            ("code", "dspark", 3, 1.40, 1.35, 1.45),
            ("code", "dspark", 7, 1.45, 1.40, 1.50),  # overlap: flat
            ("code", "eagle3", 3, 1.60, 1.55, 1.65),
            ("code", "eagle3", 7, 1.30, 1.25, 1.35),  # 1.35 < 1.55: falls
        ]
    )
    trend = speedup_trend(scaling).set_index(["dataset", "method"])
    assert trend.loc[("gsm8k", "dspark"), "trend"] == "rises"
    assert trend.loc[("gsm8k", "eagle3"), "trend"] == "flat"
    assert trend.loc[("code", "dspark"), "trend"] == "flat"
    assert trend.loc[("code", "eagle3"), "trend"] == "falls"
    assert trend.loc[("gsm8k", "dspark"), "change"] == pytest.approx(0.30)
    assert trend.loc[("gsm8k", "dspark"), "low_n"] == 3
    answer = seeds_answer(speedup_trend(scaling)).set_index("dataset")
    assert bool(answer.loc["gsm8k", "published_shape"]) is True
    assert bool(answer.loc["code", "published_shape"]) is False
    assert answer.loc["gsm8k", "faster_at_high_n"] == "dspark"  # 1.70 > 1.65
    assert answer.loc["code", "faster_at_high_n"] == "dspark"  # 1.40 > 1.35
    # the same points with overlapping intervals name no winner
    close = scaling.assign(
        speedup_lo=np.where(scaling["n"] == 7, scaling["speedup"] - 0.2, scaling["speedup_lo"])
    )
    answer = seeds_answer(speedup_trend(close)).set_index("dataset")
    assert answer.loc["code", "faster_at_high_n"] == "cannot tell"


def test_without_intervals_the_points_decide_and_single_windows_are_skipped():
    scaling = _scaling(
        [
            ("d", "dspark", 3, 1.0, np.nan, np.nan),
            ("d", "dspark", 7, 1.1, np.nan, np.nan),
            ("d", "eagle3", 3, 1.0, np.nan, np.nan),  # only one window: no trend
        ]
    )
    trend = speedup_trend(scaling)
    assert trend[["method", "trend"]].values.tolist() == [["dspark", "rises"]]
    assert seeds_answer(trend).empty  # eagle3 has no trend in this dataset


def test_calibrated_confidence_divides_the_logit_by_each_positions_temperature():
    from dsparklab.analysis import calibrate_confidence

    positions = pd.DataFrame(
        {
            "run_id": ["a", "a", "a", "b"],
            "position": [0, 1, 5, 0],
            "confidence": [0.8, 0.5, 0.9, 0.7],
        }
    )
    out = calibrate_confidence(positions, {"a": [2.0, 0.5]})
    logit = np.log(0.8 / 0.2) / 2.0
    assert out["confidence_calibrated"].iloc[0] == pytest.approx(1 / (1 + np.exp(-logit)))
    assert out["confidence_calibrated"].iloc[1] == pytest.approx(0.5)  # logit 0 stays 0
    # beyond the fitted positions the last temperature holds
    assert out["confidence_calibrated"].iloc[2] == pytest.approx(
        1 / (1 + np.exp(-np.log(9.0) / 0.5))
    )
    assert np.isnan(out["confidence_calibrated"].iloc[3])  # run b: not calibrated
    assert "confidence_calibrated" not in positions  # input untouched
