"""Property tests over random prefix-closed traces."""

from __future__ import annotations

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsparklab.analysis import (
    compute_acceptance_by_position,
    compute_acceptance_length,
    compute_regression_diff,
)
from tests.oracles import count_acceptance, count_acceptance_from_steps

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def traces(draw, full: bool = True):
    """Positions and steps of 1-2 runs: random windows, requests and accepted counts.

    ``full``: every step drafts and verifies all n positions; otherwise a step drafts
    D <= n, verifies V <= D (adaptive verification) and accepts A <= V.
    """
    positions, steps = [], []
    for run in range(draw(st.integers(1, 2))):
        n = draw(st.integers(1, 7))
        for r in range(draw(st.integers(1, 4))):
            for s in range(draw(st.integers(1, 12))):
                d = n if full else draw(st.integers(0, n))
                v = d if full else draw(st.integers(0, d))
                a = draw(st.integers(0, v))
                where = {"run_id": f"run{run}", "request_id": f"q{r}", "step": s}
                steps.append(
                    {
                        **where,
                        "prompt_id": f"p{r}",
                        "dataset": "d",
                        "n": n,
                        "num_drafted": d,
                        "num_verified": v,
                        "accepted_len": a,
                    }
                )
                positions += [
                    {**where, "position": i, "accepted": i < a, "dataset": "d", "n": n}
                    for i in range(d)
                ]
    columns = ["run_id", "request_id", "step", "position", "accepted", "dataset", "n"]
    return pd.DataFrame(positions, columns=columns), pd.DataFrame(steps)


@SETTINGS
@given(traces())
def test_rates_survival_and_length_stay_in_range(trace):
    positions, steps = trace
    table = compute_acceptance_by_position(positions, by="run_id", n_boot=20)
    rate = table["accept_rate"].dropna()
    assert ((rate >= 0) & (rate <= 1)).all()
    for _, part in table.groupby("run_id"):
        assert np.all(np.diff(part.sort_values("position")["survival"].to_numpy()) <= 1e-12)
    assert (table["accept_rate_lo"].dropna() <= table["accept_rate_hi"].dropna() + 1e-12).all()
    length = compute_acceptance_length(positions, by="run_id", n_boot=20)
    n = steps.groupby("run_id")["n"].first()
    for row in length.itertuples():
        assert 1.0 <= row.accept_len <= n[row.run_id] + 1
        assert row.accept_len_lo <= row.accept_len + 1e-12 <= row.accept_len_hi + 2e-12
        # every step drafts n positions, so AL = mean(accepted_len + 1)
        expected = steps.loc[steps["run_id"] == row.run_id, "accepted_len"].mean() + 1
        assert abs(row.accept_len - expected) < 1e-9


@SETTINGS
@given(traces())
def test_counts_add_up_to_the_rows(trace):
    positions, steps = trace
    counts = count_acceptance(positions, by="run_id")
    assert counts["n_drafted"].sum() == len(positions)
    assert counts["n_accepted"].sum() == steps["accepted_len"].sum()
    assert (counts["n_accepted"] <= counts["n_reached"]).all()
    assert (counts["n_reached"] <= counts["n_drafted"]).all()


@SETTINGS
@given(traces(), st.sampled_from(["dataset", "position", "prompt"]))
def test_diff_of_a_run_set_with_itself_is_zero(trace, level):
    positions, steps = trace
    diff = compute_regression_diff(
        positions, positions, base_steps=steps, new_steps=steps, level=level, n_boot=20
    )
    assert len(diff) > 0
    assert (diff["delta"].fillna(0) == 0).all()
    if level != "prompt":  # paired: the same resample on both sides
        assert (diff["delta_lo"].fillna(0) == 0).all()
        assert (diff["delta_hi"].fillna(0) == 0).all()
    else:
        assert (diff["delta_lo"].fillna(0) <= 0).all()
        assert (diff["delta_hi"].fillna(0) >= 0).all()
    unpaired = compute_regression_diff(positions, positions, n_boot=20)
    assert (unpaired["delta"] == 0).all()


@SETTINGS
@given(traces(full=False))
def test_counting_from_steps_equals_counting_rows(trace):
    positions, steps = trace
    rows = count_acceptance(positions, steps=steps, by=("run_id", "prompt_id"))
    from_steps = count_acceptance_from_steps(steps, by=("run_id", "prompt_id"))
    keys = ["run_id", "prompt_id", "request_id", "position"]
    pd.testing.assert_frame_equal(
        rows.sort_values(keys).reset_index(drop=True),
        from_steps.sort_values(keys).reset_index(drop=True),
        check_dtype=False,
    )
    survival = compute_acceptance_by_position(positions, steps=steps, by="run_id", n_boot=0)
    rate = survival["accept_rate"].dropna()
    assert ((rate >= 0) & (rate <= 1)).all()
    for _, part in survival.groupby("run_id"):
        assert np.all(np.diff(part["survival"].to_numpy()) <= 1e-12)
