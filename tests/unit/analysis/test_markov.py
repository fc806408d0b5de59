"""Markov attribution: flip rates, acceptance by flip, the base-argmax counterfactual."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from analysis_synth import build_run, concat

from dsparklab.analysis import compute_markov_attribution, compute_markov_bias_distribution


def single_position_rows(draft, target, flip, bias=None) -> pd.DataFrame:
    """n = 1: every row is its own step, so every row is reached."""
    draft = np.asarray(draft)
    n = len(draft)
    return pd.DataFrame(
        {
            "run_id": "r",
            "request_id": "q",
            "step": np.arange(n),
            "position": 0,
            "draft_token": draft,
            "target_token": np.asarray(target),
            "accepted": draft == np.asarray(target),
            "markov_flip": pd.array(np.asarray(flip), dtype="boolean"),
            "markov_bias": np.zeros(n) if bias is None else np.asarray(bias, float),
        }
    )


def test_hand_built_counts_and_bounds():
    #        accepted:  T  T  F  F  T  F
    #        flip:      T  F  T  F  F  F
    rows = single_position_rows(
        draft=[1, 2, 3, 4, 5, 6],
        target=[1, 2, 0, 0, 5, 0],
        flip=[True, False, True, False, False, False],
        bias=[2.0, 1.0, -1.0, 0.0, 3.0, 1.0],
    )
    row = compute_markov_attribution(rows, by=()).iloc[0]
    assert row["n_reached"] == 6
    assert row["n_flip"] == 2
    assert row["flip_rate"] == pytest.approx(2 / 6)
    assert row["accept_rate"] == pytest.approx(3 / 6)
    assert row["accept_rate_flip"] == pytest.approx(1 / 2)
    assert row["accept_rate_noflip"] == pytest.approx(2 / 4)
    assert row["n_flip_helped"] == 1
    assert row["n_flip_unknown"] == 1
    # base accepted: the 2 unflipped accepted rows, plus possibly the flipped rejected one
    assert row["base_accept_rate_lo"] == pytest.approx(2 / 6)
    assert row["base_accept_rate_hi"] == pytest.approx(3 / 6)
    assert row["bias_gain_lo"] == pytest.approx(0.0)
    assert row["bias_gain_hi"] == pytest.approx(1 / 6)
    assert row["mean_bias_accepted"] == pytest.approx((2 + 1 + 3) / 3)
    assert row["mean_bias_rejected"] == pytest.approx((-1 + 0 + 1) / 3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_counterfactual_bounds_contain_the_truth(seed):
    rng = np.random.default_rng(seed)
    n = 5000
    vocab = 6
    target = rng.integers(0, vocab, n)
    base = np.where(rng.random(n) < 0.5, target, rng.integers(0, vocab, n))  # base argmax
    flip = rng.random(n) < 0.3
    # a flip moves the choice off the base argmax, towards the target more often than not
    other = np.where(rng.random(n) < 0.6, target, rng.integers(0, vocab, n))
    other = np.where(other == base, (base + 1) % vocab, other)
    draft = np.where(flip, other, base)
    row = compute_markov_attribution(single_position_rows(draft, target, flip), by=()).iloc[0]
    truth = np.mean(base == target)
    assert row["base_accept_rate_lo"] <= truth <= row["base_accept_rate_hi"]
    gain = np.mean(draft == target) - truth
    assert row["bias_gain_lo"] <= gain <= row["bias_gain_hi"]


def test_only_reached_rows_with_a_markov_head_count():
    dspark = build_run(run_id="d", n=4, accept=0.6, n_requests=10, seed=1)
    eagle = build_run(run_id="e", method="eagle3", n=4, n_requests=10, seed=2)
    positions, _ = concat(dspark, eagle)
    table = compute_markov_attribution(positions, by="method")
    assert set(table["method"]) == {"dspark"}
    pos = dspark.positions
    reached_at_1 = pos[pos["position"] == 0]["accepted"].sum()
    assert table.loc[table["position"] == 1, "n_reached"].iloc[0] == reached_at_1
    pooled = compute_markov_attribution(positions, by="method", per_position=False)
    assert pooled["n_reached"].iloc[0] == table["n_reached"].sum()


def test_bias_histogram_densities_integrate_to_one():
    run = build_run(n=4, accept=0.6, n_requests=20, seed=3)
    hist = compute_markov_bias_distribution(run.positions, by="method", bins=12)
    for _, part in hist.groupby("accepted"):
        width = part["bin_hi"] - part["bin_lo"]
        assert (part["density"] * width).sum() == pytest.approx(1.0)
    pooled = compute_markov_attribution(run.positions, by="method", per_position=False)
    assert hist["count"].sum() == pooled["n_reached"].iloc[0]
    # the synthetic bias is higher on accepted rows
    assert pooled["mean_bias_accepted"].iloc[0] > pooled["mean_bias_rejected"].iloc[0]
