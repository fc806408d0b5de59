"""Acceptance by position and acceptance length: known answers and closed forms."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from analysis_synth import build_run, concat, write_run

from dsparklab.analysis import (
    compute_acceptance_by_position,
    compute_acceptance_length,
    compute_iid_accept_len,
)
from dsparklab.errors import DSparkLabError, TraceSchemaError
from dsparklab.store import read_trace
from tests.oracles import count_acceptance


def hand_positions(accepted: list[list[bool]], **extra) -> pd.DataFrame:
    """One run, one request; step k drafts len(accepted[k]) positions."""
    rows = [
        {"run_id": "r", "request_id": "q", "step": s, "position": i, "accepted": a, **extra}
        for s, flags in enumerate(accepted)
        for i, a in enumerate(flags)
    ]
    return pd.DataFrame(rows)


def test_hand_built_trace_gives_known_rates_survival_and_length():
    positions = hand_positions([[True, True, False], [False, False, False], [True, True, True]])
    table = compute_acceptance_by_position(positions, by=(), n_boot=0)
    assert table["n_reached"].tolist() == [3, 2, 2]
    assert table["n_accepted"].tolist() == [2, 2, 1]
    np.testing.assert_allclose(table["accept_rate"], [2 / 3, 1.0, 0.5])
    np.testing.assert_allclose(table["survival"], [2 / 3, 2 / 3, 1 / 3])
    length = compute_acceptance_length(positions, by=(), n_boot=0)
    # AL = 1 + sum(s) = mean(accepted_len + 1) = (3 + 1 + 4) / 3
    assert length["accept_len"].iloc[0] == pytest.approx(8 / 3)
    assert length["n_steps"].iloc[0] == 3


def test_rows_past_num_verified_are_not_reached():
    # step 0 verified only its first position (adaptive verification) and accepted it
    positions = hand_positions([[True, False, False], [True, True, False]])
    steps = pd.DataFrame(
        {
            "run_id": "r",
            "request_id": "q",
            "step": [0, 1],
            "prompt_id": "p",
            "num_drafted": [3, 3],
            "num_verified": [1, 3],
            "accepted_len": [1, 2],
        }
    )
    without = compute_acceptance_by_position(positions, by=(), n_boot=0)
    with_steps = compute_acceptance_by_position(positions, steps=steps, by=(), n_boot=0)
    assert without["n_reached"].tolist() == [2, 2, 1]
    assert with_steps["n_reached"].tolist() == [2, 1, 1]
    np.testing.assert_allclose(with_steps["accept_rate"], [1.0, 1.0, 0.0])


@pytest.mark.parametrize("rate", [0.3, 0.6, 0.85])
@pytest.mark.parametrize("n", [3, 7])
def test_iid_acceptance_matches_the_closed_form(rate, n):
    run = build_run(n=n, accept=rate, n_requests=100, steps_per_request=40, seed=n)
    length = compute_acceptance_length(run.positions, by=("n",), n_boot=0)
    observed = length["accept_len"].iloc[0]
    per_step = run.steps["accepted_len"].to_numpy() + 1.0
    stderr = per_step.std(ddof=1) / np.sqrt(len(per_step))
    expected = (1 - rate ** (n + 1)) / (1 - rate)
    assert compute_iid_accept_len(rate, n) == pytest.approx(expected)
    assert abs(observed - expected) < 4 * stderr
    # each conditional rate estimates the same a
    table = compute_acceptance_by_position(run.positions, by=("n",), n_boot=0)
    err = np.sqrt(rate * (1 - rate) / table["n_reached"])
    assert (np.abs(table["accept_rate"] - rate) < 5 * err).all()


def test_closed_form_limits():
    assert compute_iid_accept_len(1.0, 5) == pytest.approx(6.0)
    assert compute_iid_accept_len(0.0, 5) == pytest.approx(1.0)
    np.testing.assert_allclose(compute_iid_accept_len(0.5, np.array([1, 2])), [1.5, 1.75])


def test_closed_form_through_the_real_store(tmp_path):
    write_run(tmp_path, build_run(n=4, accept=0.7, n_requests=60, steps_per_request=30, seed=3))
    positions = read_trace(tmp_path, "positions")
    length = compute_acceptance_length(positions, by=("method", "n"), n_boot=0)
    steps = read_trace(tmp_path, "steps")
    per_step = steps["accepted_len"].to_numpy() + 1.0
    assert length["accept_len"].iloc[0] == pytest.approx(per_step.mean())
    stderr = per_step.std(ddof=1) / np.sqrt(len(per_step))
    assert abs(per_step.mean() - compute_iid_accept_len(0.7, 4)) < 4 * stderr


def test_bootstrap_intervals_are_seeded_and_bracket_the_estimate():
    a = build_run(run_id="a", n=5, accept=0.7, n_requests=30, seed=1)
    b = build_run(run_id="b", method="eagle3", n=5, accept=0.5, n_requests=30, seed=2)
    positions, _ = concat(a, b)
    first = compute_acceptance_length(positions, by="method", n_boot=300, seed=7)
    again = compute_acceptance_length(positions, by="method", n_boot=300, seed=7)
    other = compute_acceptance_length(positions, by="method", n_boot=300, seed=8)
    pd.testing.assert_frame_equal(first, again)
    assert not np.allclose(first["accept_len_lo"], other["accept_len_lo"])
    assert (first["accept_len_lo"] <= first["accept_len"]).all()
    assert (first["accept_len"] <= first["accept_len_hi"]).all()
    assert (first["accept_len_hi"] > first["accept_len_lo"]).all()
    # a group's interval does not depend on which other groups are present
    alone = compute_acceptance_length(a.positions, by="method", n_boot=300, seed=7)
    assert (
        alone["accept_len_lo"].iloc[0]
        == first.loc[first["method"] == "dspark", "accept_len_lo"].iloc[0]
    )
    table = compute_acceptance_by_position(positions, by="method", n_boot=300, seed=7)
    assert (table["accept_rate_lo"] <= table["accept_rate"]).all()
    assert (table["survival"] <= table["survival_hi"]).all()
    assert (table["n_requests"] == 30).all()


def test_interval_narrows_with_more_requests():
    small = build_run(n=4, accept=0.6, n_requests=10, seed=1)
    large = build_run(n=4, accept=0.6, n_requests=160, seed=1)
    w = [
        (t["accept_len_hi"] - t["accept_len_lo"]).iloc[0]
        for t in (compute_acceptance_length(r.positions, by=(), n_boot=400) for r in (small, large))
    ]
    assert w[1] < w[0] / 2


def test_counts_of_disjoint_runs_merge_by_addition():
    a = build_run(run_id="a", n=4, accept=0.6, seed=1)
    b = build_run(run_id="b", n=4, accept=0.8, seed=2)
    positions, _ = concat(a, b)
    merged = (
        pd.concat([count_acceptance(r.positions, by="n", per_request=False) for r in (a, b)])
        .groupby(["n", "position"], as_index=False)
        .sum()
    )
    together = count_acceptance(positions, by="n", per_request=False)
    pd.testing.assert_frame_equal(merged, together, check_dtype=False)
    assert compute_acceptance_length(merged, by="n", n_boot=0)["accept_len"].iloc[0] == (
        pytest.approx(compute_acceptance_length(positions, by="n", n_boot=0)["accept_len"].iloc[0])
    )


def test_grouping_by_prompt_needs_the_steps_table():
    run = build_run(n=3, n_requests=4)
    with pytest.raises(TraceSchemaError, match="prompt_id"):
        compute_acceptance_by_position(run.positions, by="prompt_id", n_boot=0)
    table = compute_acceptance_length(run.positions, steps=run.steps, by="prompt_id", n_boot=0)
    assert sorted(table["prompt_id"]) == ["p0000", "p0001", "p0002", "p0003"]


def test_bad_interval_level_is_refused():
    run = build_run(n=3, n_requests=2)
    with pytest.raises(DSparkLabError, match="ci must be"):
        compute_acceptance_length(run.positions, ci=95)
