"""Window scaling, measured speedup and the speedup model on traces with known timings."""

from __future__ import annotations

import logging

import numpy as np
import pandas as pd
import pytest
from analysis_synth import build_run, concat

from dsparklab.analysis import (
    compute_speedup_model,
    compute_window_scaling,
    fit_speedup_model,
)
from dsparklab.errors import TraceSchemaError, UnknownMethodError
from tests.oracles import count_step_times

RUN = {"engine": "synthetic", "target": "t", "temperature": 0.0}


def steps_of(run_id, method, n, accepted_len, draft, verify, dataset="d", n_requests=2):
    """``len(accepted_len)`` steps per request with constant draft/verify times."""
    rows = []
    for r in range(n_requests):
        for s, a in enumerate(accepted_len):
            rows.append(
                {
                    **RUN,
                    "run_id": run_id,
                    "method": method,
                    "n": n,
                    "dataset": dataset,
                    "request_id": f"{run_id}/{r}",
                    "prompt_id": f"p{r}",
                    "step": s,
                    "accepted_len": a,
                    "emitted": a + 1,
                    "num_drafted": n,
                    "num_verified": n,
                    "draft_time_s": draft,
                    "verify_time_s": verify,
                }
            )
    return pd.DataFrame(rows)


def timed_steps() -> pd.DataFrame:
    return pd.concat(
        [
            steps_of("base", "none", 0, [0] * 5, np.nan, 0.010),
            steps_of("ds3", "dspark", 3, [3, 1, 2, 0], 0.003, 0.012),
            steps_of("ds5", "dspark", 5, [5, 1, 2, 4], 0.003, 0.012),
            steps_of("e2", "eagle3", 2, [2, 0, 1, 1], 0.002, 0.011),
            steps_of("e4", "eagle3", 4, [4, 0, 1, 3], 0.004, 0.011),
        ],
        ignore_index=True,
    )


def test_measured_speedup_costs_and_marginals_on_known_timings():
    table = compute_window_scaling(timed_steps(), by="method", n_boot=0).set_index(["method", "n"])
    ds3 = table.loc[("dspark", 3)]
    assert ds3["tokens_per_step"] == pytest.approx(2.5)
    assert ds3["time_per_token"] == pytest.approx(0.015 / 2.5)
    assert ds3["baseline_time_per_token"] == pytest.approx(0.010)
    assert ds3["speedup"] == pytest.approx(0.010 / (0.015 / 2.5))
    assert ds3["draft_cost"] == pytest.approx(0.3)
    assert ds3["verify_cost"] == pytest.approx(0.2)
    # speedup = tokens per step / (1 + c + v)
    assert ds3["speedup"] == pytest.approx(2.5 / (1 + 0.3 + 0.2))
    ds5 = table.loc[("dspark", 5)]
    assert ds5["tokens_per_step"] == pytest.approx(4.0)
    assert np.isnan(ds3["marginal_speedup"])  # no n=2 run
    assert np.isnan(ds5["marginal_speedup"])  # n=4 was not run for dspark
    e4 = table.loc[("eagle3", 4)]
    assert e4["draft_cost"] == pytest.approx(0.4)
    assert e4["tokens_per_step"] == pytest.approx(3.0)
    assert np.isnan(e4["marginal_tokens_per_step"])  # n=3 was not run


def test_step_time_counters_give_what_the_steps_give():
    """Per-request counters (what aggregate_store counts) stand in for the steps, intervals
    included; counters summed over requests are refused, not resampled as requests."""
    steps = timed_steps()
    counts = count_step_times(steps, by="method")
    want = compute_window_scaling(steps, by="method", n_boot=50)
    got = compute_window_scaling(counts, by="method", n_boot=50)
    pd.testing.assert_frame_equal(got, want)
    summed = count_step_times(steps, by="method", per_request=False)
    with pytest.raises(TraceSchemaError, match="per-request step-time counts"):
        compute_window_scaling(summed, by="method", n_boot=50)


def test_marginal_value_of_one_more_position():
    steps = pd.concat(
        [
            steps_of("base", "none", 0, [0] * 3, np.nan, 0.010),
            steps_of("d3", "dspark", 3, [3, 1], 0.003, 0.012),
            steps_of("d4", "dspark", 4, [4, 1], 0.003, 0.012),
        ]
    )
    table = compute_window_scaling(steps, by="method", n_boot=0)
    d4 = table[table["n"] == 4].iloc[0]
    d3 = table[table["n"] == 3].iloc[0]
    assert d4["marginal_tokens_per_step"] == pytest.approx(0.5)
    assert d4["marginal_speedup"] == pytest.approx(d4["speedup"] - d3["speedup"])


def test_speedup_model_recovers_block_and_autoregressive_costs():
    params = fit_speedup_model(timed_steps()).set_index(["method", "n"])
    assert params.loc[("dspark", 3), "kind"] == "block"
    assert params.loc[("dspark", 3), "c0"] == pytest.approx(0.3)
    assert params.loc[("dspark", 5), "c1"] == 0.0
    assert params.loc[("dspark", 5), "verify_cost_fit"] == pytest.approx(0.2)
    assert params.loc[("eagle3", 4), "kind"] == "autoregressive"
    assert params.loc[("eagle3", 4), "c1"] == pytest.approx(0.1)  # per drafted position
    assert params.loc[("eagle3", 4), "c0"] == pytest.approx(0.0, abs=1e-12)
    assert params.loc[("eagle3", 2), "verify_cost_fit"] == pytest.approx(0.1)
    model = compute_speedup_model(timed_steps(), by="method", n_boot=0)
    np.testing.assert_allclose(model["model_error"], 0.0, atol=1e-12)
    np.testing.assert_allclose(model["speedup_model"], model["speedup"])


def test_verify_cost_is_one_value_per_window_shared_by_the_methods():
    """Two methods at the same n with different verify times: the model pools them, and
    its error says by how much each one's measured speedup differs from the pooled cost."""
    steps = pd.concat(
        [
            steps_of("base", "none", 0, [0] * 5, np.nan, 0.010),
            steps_of("ds3", "dspark", 3, [3, 1, 2, 0], 0.003, 0.013),
            steps_of("e3", "eagle3", 3, [3, 1, 2, 0], 0.003, 0.011),
        ],
        ignore_index=True,
    )
    params = fit_speedup_model(steps)
    np.testing.assert_allclose(params["verify_cost_fit"], 0.2)  # (0.3 + 0.1) / 2
    model = compute_speedup_model(steps, by="method", n_boot=0).set_index("method")
    assert model.loc["dspark", "model_error"] == pytest.approx((1 + 0.3 + 0.3) / 1.5 - 1)
    assert model.loc["eagle3", "model_error"] == pytest.approx((1 + 0.3 + 0.1) / 1.5 - 1)


def test_model_against_noisy_timings():
    runs = [build_run(run_id="base", method="none", n=0, verify_time=0.01, seed=1)]
    for n in (3, 5, 7):
        runs.append(
            build_run(run_id=f"d{n}", n=n, accept=0.8, draft_time=0.003, verify_time=0.011, seed=n)
        )
        runs.append(
            build_run(
                run_id=f"e{n}",
                method="eagle3",
                n=n,
                accept=0.8,
                draft_time=lambda k: 0.001 * k,
                verify_time=0.011,
                seed=10 + n,
            )
        )
    positions, steps = concat(*runs)
    model = compute_speedup_model(steps, by=("method", "dataset"), n_boot=200)
    assert (model["model_error"].abs() < 0.03).all()
    assert (model["speedup_lo"] <= model["speedup"]).all()
    assert (model["speedup"] <= model["speedup_hi"]).all()
    params = fit_speedup_model(steps).set_index(["method", "n"])
    assert params.loc[("dspark", 5), "c0"] == pytest.approx(0.3, rel=0.05)
    assert params.loc[("eagle3", 5), "c1"] == pytest.approx(0.1, rel=0.05)
    scaling = compute_window_scaling(steps, positions=positions, n_boot=200)
    # with every step drafting n positions, AL from positions = tokens per step
    np.testing.assert_allclose(scaling["accept_len"], scaling["tokens_per_step"])
    assert (scaling["accept_len_lo"] <= scaling["accept_len"]).all()


def test_missing_baseline_gives_nan_and_a_warning(caplog):
    steps = steps_of("ds3", "dspark", 3, [3, 1, 2, 0], 0.003, 0.012)
    with caplog.at_level(logging.WARNING):
        table = compute_window_scaling(steps, by="method", n_boot=50)
    assert np.isnan(table["speedup"]).all()
    assert table["tokens_per_step"].iloc[0] == pytest.approx(2.5)
    assert "no 'none' baseline run" in caplog.text


def test_unknown_drafter_kind_lists_the_known_methods():
    steps = pd.concat(
        [
            steps_of("base", "none", 0, [0] * 3, np.nan, 0.010),
            steps_of("m", "medusa", 3, [1, 2], 0.001, 0.012),
        ]
    )
    with pytest.raises(UnknownMethodError, match="known methods are"):
        fit_speedup_model(steps)
    params = fit_speedup_model(steps, kinds={"medusa": "block"})
    assert params["c0"].iloc[0] == pytest.approx(0.1)


def test_each_load_is_measured_against_the_baseline_at_that_load():
    """Issue 32: a method run at concurrency C pairs with the target-only run at C (the
    baseline's step slows with load too), and grouping by concurrency gives speedup(n, C)
    and the best n per load."""
    from dsparklab.analysis import compute_best_n

    loads = []
    for c, base_verify, verify in ((1, 0.010, 0.012), (4, 0.020, 0.040)):
        parts = [
            steps_of(f"base-c{c}", "none", 0, [0] * 5, np.nan, base_verify),
            steps_of(f"ds3-c{c}", "dspark", 3, [3, 1, 2, 0], 0.003, verify),
            steps_of(f"ds5-c{c}", "dspark", 5, [5, 1, 2, 4], 0.003, verify * (2 if c > 1 else 1)),
        ]
        loads.append(pd.concat(parts, ignore_index=True).assign(concurrency=c))
    steps = pd.concat(loads, ignore_index=True)
    table = compute_window_scaling(steps, by=("method", "concurrency"), n_boot=0)
    table = table.set_index(["concurrency", "n"])
    # at 1: tokens per step over (draft + verify) in baseline steps
    assert table.loc[(1, 3), "speedup"] == pytest.approx(2.5 / (0.015 / 0.010))
    assert table.loc[(1, 5), "speedup"] == pytest.approx(4.0 / (0.015 / 0.010))
    # at 4: the baseline at 4 (0.020 a step), not the one at 1
    assert table.loc[(4, 3), "speedup"] == pytest.approx(2.5 / (0.043 / 0.020))
    assert table.loc[(4, 5), "speedup"] == pytest.approx(4.0 / (0.083 / 0.020))
    best = compute_best_n(
        table.reset_index().assign(
            speedup_lo=lambda t: t["speedup"], speedup_hi=lambda t: t["speedup"]
        ),
        by=("method", "concurrency"),
    ).set_index("concurrency")
    assert best.loc[1, "best_n"] == 5 and best.loc[4, "best_n"] == 3
    # a frame without the column (built by hand) is one load, as before
    pooled = compute_window_scaling(loads[0].drop(columns="concurrency"), by="method", n_boot=0)
    assert pooled.set_index("n").loc[3, "speedup"] == pytest.approx(table.loc[(1, 3), "speedup"])
