"""Adaptive-verification what-if: tokens and verified positions per step over tau."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from analysis_synth import build_run, noisy_confidence

from dsparklab.analysis import compute_adaptive_verification
from dsparklab.errors import DSparkLabError, MissingInputError


def one_step_positions(accepted: list[bool], confidence: list[float]) -> pd.DataFrame:
    """Positions rows of a single step (run "r", request "q"), one row per drafted position."""
    return pd.DataFrame(
        {
            "run_id": "r",
            "request_id": "q",
            "step": 0,
            "position": range(len(accepted)),
            "accepted": accepted,
            "confidence": confidence,
        }
    )


def test_one_step_known_answers():
    # prefix confidence: 0.9, 0.72, 0.36
    positions = one_step_positions([True, True, False], [0.9, 0.8, 0.5])
    table = compute_adaptive_verification(positions, by=(), taus=[0.0, 0.3, 0.5, 0.8, 0.95])
    assert table["verified_per_step"].tolist() == [3, 3, 2, 1, 0]
    assert table["tokens_per_step"].tolist() == [3, 3, 3, 2, 1]
    assert (table["tokens_per_step_full"] == 3).all()
    assert (table["verified_per_step_full"] == 3).all()
    assert table["tokens_per_verified"].tolist() == pytest.approx([3 / 4, 3 / 4, 1, 1, 1])


def test_full_verification_at_tau_zero_and_monotone_in_tau():
    run = build_run(n=5, accept=0.7, n_requests=30, seed=1, confidence=noisy_confidence(0.2))
    table = compute_adaptive_verification(run.positions, by="n")
    first = table.iloc[0]
    assert first["tau"] == 0.0
    assert first["tokens_per_step"] == pytest.approx((run.steps["accepted_len"] + 1).mean())
    assert first["verified_per_step"] == pytest.approx(5.0)
    assert np.all(np.diff(table["tokens_per_step"]) <= 0)
    assert np.all(np.diff(table["verified_per_step"]) <= 0)
    assert (table["tokens_per_step"] >= 1).all()


def test_runs_without_confidence_say_so_and_empty_taus_refused():
    eagle = build_run(method="eagle3", n=3, n_requests=4)
    with pytest.raises(MissingInputError, match="needs confidence, which the runs of eagle3 lack"):
        compute_adaptive_verification(eagle.positions)
    with pytest.raises(DSparkLabError, match="taus is empty"):
        compute_adaptive_verification(eagle.positions, taus=[])


def test_censored_steps_are_counted():
    # recorded run verified only 1 of 3 positions and accepted it: the rest is unknown
    positions = one_step_positions([True, False, False], [0.99, 0.99, 0.99])
    steps = pd.DataFrame({"run_id": "r", "request_id": "q", "step": [0], "num_verified": [1]})
    table = compute_adaptive_verification(positions, steps=steps, by=(), taus=[0.0, 0.995])
    assert table["n_censored"].tolist() == [1, 0]
    assert table["tokens_per_step"].tolist() == [2, 1]
