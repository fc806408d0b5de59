"""Which window pays: truncated acceptance, profiles, the window prediction, the marginal
position and the best n, on synthetic runs whose drafts and costs are known."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
from analysis_synth import build_run, concat

from dsparklab.analysis import (
    compute_acceptance_by_position,
    compute_best_n,
    compute_position_payoff,
    compute_prefix_agreement,
    compute_projected_speedup,
    compute_required_survival,
    compute_truncated_acceptance,
    compute_window_prediction,
    cost_table_from_profile,
    cost_table_from_published,
    fitted_cost_table,
)
from dsparklab.errors import MissingInputError, TraceSchemaError, UnknownMethodError

ACCEPT = [0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2]
PROFILE = {
    "name": "test-gpu",
    "verify": {str(w): 1.0 + 0.01 * (w - 1) for w in range(1, 9)},
    "draft": {"eagle3": {"c0": 0.02, "c1": 0.05}, "dspark": {"c0": 0.1}},
}


def _sweep(method: str = "eagle3", ns=(3, 4, 5, 6, 7), **kw):
    runs = [
        build_run(
            run_id=f"{method}-{n}",
            method=method,
            n=n,
            accept=ACCEPT[:n],
            seed=n,
            n_requests=40,
            draft_time=lambda n: 0.001 * (1 + n),
            **kw,
        )
        for n in ns
    ]
    base = build_run(run_id="base", method="none", n=0, n_requests=40, seed=99)
    return concat(*runs, base)


def test_truncated_acceptance_is_the_survival_prefix_sum():
    positions, steps = _sweep(ns=(7,))
    table = compute_truncated_acceptance(positions, steps=steps, n_boot=0)
    survival = compute_acceptance_by_position(
        positions, steps=steps, by=("method", "dataset", "n"), n_boot=0
    )
    expected = 1 + np.cumsum(survival.sort_values("position")["survival"].to_numpy())
    assert table["n"].tolist() == list(range(1, 8)) and set(table["source_n"]) == {7}
    np.testing.assert_allclose(table["accept_len"], expected, rtol=1e-12)


def test_projection_on_a_profile_is_al_over_the_step_cost():
    positions, steps = _sweep(ns=(3, 7))
    acceptance = compute_truncated_acceptance(positions, steps=steps, n_boot=0)
    costs = cost_table_from_profile(PROFILE, methods=["eagle3"], ns=range(1, 8))
    projected = compute_projected_speedup(acceptance, costs)
    row = projected[projected["n"] == 5].iloc[0]
    assert row["speedup"] == pytest.approx(row["accept_len"] / (0.02 + 0.05 * 5 + 1.05))
    assert set(projected["label"]) == {"projected on test-gpu"}
    required = compute_required_survival(acceptance, costs)
    low, high = projected[projected["n"] == 1].iloc[0], projected[projected["n"] == 7].iloc[0]
    need = low["accept_len"] * (high["step_cost"] / low["step_cost"] - 1)
    assert required["needed_extra_al"].iloc[0] == pytest.approx(need)
    assert bool(required["rises"].iloc[0]) == (high["speedup"] >= low["speedup"])
    with pytest.raises(TraceSchemaError, match="verify.9") as err:
        cost_table_from_profile(PROFILE, methods=["eagle3"], ns=[8], source="p.json")
    assert "file p.json" in str(err.value)
    with pytest.raises(TraceSchemaError, match="draft.dflash"):
        cost_table_from_profile(PROFILE, methods=["dflash"], ns=[3])


def _published(
    setup: str, widths: dict[int, float], draft: float | None = 0.2, drafter: str = "dspark"
) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "setup": setup,
            "verify_tokens": pd.array(list(widths), dtype="Int64"),
            "cost_vs_decode": list(widths.values()),
            "draft_cost_vs_decode": draft,
            "how_obtained": [f"stated ({k})" for k in widths],
            "source": "a blog",
            "drafter_method": drafter,
        }
    )


def test_published_costs_interpolate_between_stated_widths_and_carry_their_source(
    caplog: pytest.LogCaptureFixture,
):
    table = pd.concat(
        [
            _published("big-moe", {1: 1.0, 4: 1.3, 8: 1.5}),
            _published("no-decode-row", {8: 1.0, 16: 1.01}),
            _published("chain", {1: 1.0, 8: 1.1}, draft=0.05, drafter="eagle3"),
        ]
    )
    costs = cost_table_from_published(
        table, setup="big-moe", methods=["dspark", "eagle3"], ns=range(1, 8)
    ).set_index(["method", "n"])
    assert set(costs["profile"]) == {"published: big-moe"}
    # stated widths as published; w = 6 two thirds of the way from k = 4 to k = 8
    assert costs.loc[("dspark", 3), "verify_cost"] == 1.3
    assert costs.loc[("dspark", 5), "verify_cost"] == pytest.approx(1.3 + 0.2 * 2 / 4)
    assert costs.loc[("dspark", 1), "verify_cost"] == pytest.approx(1.0 + 0.3 / 3)
    # the setup's own drafter (a block one) pays the pass once; another method's draft
    # cost was not published there
    assert costs.loc[("dspark", 7), "draft_cost"] == 0.2
    assert np.isnan(costs.loc[("eagle3", 7), "draft_cost"])
    assert "k=4 stated (4)" in costs.loc[("dspark", 3), "cost_source"]
    source_5 = costs.loc[("dspark", 5), "cost_source"]
    assert "interpolated between k=4 (stated (4)) and k=8 (stated (8))" in source_5
    assert costs["cost_source"].str.endswith("a blog").all()
    assert "not published for eagle3" in costs.loc[("eagle3", 2), "cost_source"]
    chain = cost_table_from_published(table, setup="chain", methods=["eagle3"], ns=[3])
    assert chain["draft_cost"].iloc[0] == pytest.approx(3 * 0.05)  # once per position
    acceptance = pd.DataFrame(
        {"method": ["dspark", "eagle3"], "n": [3, 3], "accept_len": [2.6, 2.2]}
    )
    with caplog.at_level(logging.INFO):
        projected = compute_projected_speedup(acceptance, costs.reset_index())
    assert "no step cost for ['eagle3']" in caplog.text
    assert projected["method"].tolist() == ["dspark"]
    assert projected["speedup"].iloc[0] == pytest.approx(2.6 / (0.2 + 1.3))
    assert projected["label"].iloc[0] == "projected on published: big-moe"
    with pytest.raises(MissingInputError, match="n = 8 verifies 9 tokens"):
        cost_table_from_published(table, setup="big-moe", methods=["dspark"], ns=[8])
    with pytest.raises(MissingInputError, match="field verify_tokens has no 1"):
        cost_table_from_published(table, setup="no-decode-row", methods=["dspark"], ns=[3])
    with pytest.raises(MissingInputError, match="known: \\['big-moe'"):
        cost_table_from_published(table, setup="other", methods=["dspark"], ns=[3])
    with pytest.raises(UnknownMethodError, match="mystery"):
        cost_table_from_published(table, setup="big-moe", methods=["mystery"], ns=[3])


def test_window_prediction_and_prefix_agreement_on_synthetic_runs():
    positions, steps = _sweep()
    prediction = compute_window_prediction(positions, steps)
    assert prediction["n"].tolist() == [3, 4, 5, 6] and set(prediction["source_n"]) == {7}
    # the same per-position acceptance at every n and fitted costs: the prediction holds
    assert (prediction["error"].abs() < 0.1).all(), prediction
    assert (prediction["prefix_agreement"] < 0.5).all(), "independent random drafts rarely agree"
    # make the first drafts of every smaller run those of the n = 7 run: agreement 1
    top = positions[(positions["n"] == 7) & (positions["step"] == 0)]
    prompt = steps.drop_duplicates("request_id").set_index("request_id")["prompt_id"]
    key = top.assign(prompt_id=top["request_id"].map(prompt)).set_index(["prompt_id", "position"])
    aligned = positions.assign(prompt_id=positions["request_id"].map(prompt))
    first = aligned["step"] == 0
    aligned.loc[first, "draft_token"] = [
        key["draft_token"].get((p, i), t)
        for p, i, t in aligned.loc[first, ["prompt_id", "position", "draft_token"]].itertuples(
            index=False
        )
    ]
    agreement = compute_prefix_agreement(aligned.drop(columns="prompt_id"), steps=steps)
    assert (agreement["prefix_agreement"] == 1.0).all() and len(agreement) == 3 + 4 + 5 + 6


def test_position_payoff_break_even_and_best_n():
    positions, steps = _sweep()
    costs = fitted_cost_table(steps)
    payoff = compute_position_payoff(positions, steps=steps, costs=costs, n_boot=50)
    step_cost = dict(zip(costs["n"], costs["draft_cost"] + costs["verify_cost"], strict=True))
    row = payoff[payoff["position"] == 3].iloc[0]
    survival = compute_acceptance_by_position(  # steps filtered alike: a run of steps alone counts
        positions[positions["n"] == 7], steps=steps[steps["n"] == 7], by=("n",), n_boot=0
    )
    s = survival.sort_values("position")["survival"].to_numpy()
    assert row["marginal_tokens"] == pytest.approx(s[3])
    assert row["marginal_cost"] == pytest.approx(step_cost[4] - step_cost[3])
    assert row["break_even"] == pytest.approx(
        (1 + s[:3].sum()) / step_cost[3] * row["marginal_cost"]
    )
    assert set(payoff["pays"]) <= {"yes", "no", "unclear"}
    # windows 3 and 7 only: one step 3 -> 7 adding positions 3..6
    gappy = compute_position_payoff(
        positions, steps=steps, costs=costs[costs["n"].isin([3, 7])], n_boot=0
    )
    (jump,) = gappy.to_dict("records")
    assert (jump["n_from"], jump["n_to"]) == (3, 7)
    assert jump["marginal_tokens"] == pytest.approx(s[3:7].sum())
    with pytest.raises(MissingInputError, match="fewer than two"):
        compute_position_payoff(positions, steps=steps, costs=costs[costs["n"] == 3], n_boot=0)
    # a whole-step table (no draft / verify split) prices the same steps by its step_cost
    whole = costs.assign(
        step_cost=costs["draft_cost"] + costs["verify_cost"], draft_cost=np.nan, verify_cost=np.nan
    )
    same = compute_position_payoff(positions, steps=steps, costs=whole, n_boot=50)
    pd.testing.assert_frame_equal(same, payoff)
    scaling = pd.DataFrame(
        {
            "dataset": "d",
            "method": "m",
            "n": [3, 4, 5],
            "speedup": [1.0, 1.3, 1.2],
            "speedup_lo": [0.9, 1.25, 1.1],
            "speedup_hi": [1.1, 1.35, 1.26],
        }
    )
    best = compute_best_n(scaling).iloc[0]
    assert best["best_n"] == 4 and best["indistinguishable"] == "4 5"
    with pytest.raises(MissingInputError, match="baselines"):
        compute_best_n(scaling.assign(speedup=np.nan))
    with pytest.raises(MissingInputError, match="baseline"):
        fitted_cost_table(steps[steps["method"] != "none"])


def test_coverage_reads_which_columns_a_run_filled():
    """A token-level run whose steps carry no verify time (a vLLM worker's taps): coverage
    says speedup is not available, and why, instead of trusting its granularity."""
    from dsparklab.analysis import compute_coverage

    timed = build_run(run_id="timed", method="dspark", n=3)
    untimed = build_run(run_id="vllm", method="eagle3", n=3, verify_time=float("nan"))
    positions, steps = concat(timed, untimed)
    runs = pd.DataFrame(
        {"run_id": ["timed", "vllm"], "method": ["dspark", "eagle3"], "granularity": "token"}
    )
    by_name = compute_coverage(runs).set_index(["run_id", "analysis"])
    assert by_name.loc[("vllm", "speedup"), "available"], "by granularity alone: available"
    table = compute_coverage(runs, steps=steps, positions=positions).set_index(
        ["run_id", "analysis"]
    )
    assert table.loc[("timed", "speedup"), "available"]
    assert not table.loc[("vllm", "speedup"), "available"]
    assert table.loc[("vllm", "speedup"), "reason"] == "its steps carry no verify_time_s"
    # a server's taps read directly: timed, but no emitted tokens (the collector fills them)
    tap_store = steps.assign(emitted=steps["emitted"].where(steps["run_id"] != "timed"))
    taps = compute_coverage(runs, steps=tap_store, positions=positions)
    reason = taps.set_index(["run_id", "analysis"]).loc[("timed", "speedup"), "reason"]
    assert reason == "its steps carry no emitted"
    assert table.loc[("timed", "calibration"), "available"]
