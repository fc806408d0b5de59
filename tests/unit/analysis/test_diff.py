"""Regression diff between run sets, worst prompts and token-class breakdown."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from analysis_synth import Run, build_run

from dsparklab.analysis import (
    TOKEN_CLASSES,
    classify_token,
    compute_acceptance_length,
    compute_iid_accept_len,
    compute_regression_diff,
    compute_token_class_acceptance,
    compute_token_class_diff,
    compute_worst_prompts,
)
from dsparklab.errors import DSparkLabError, UnknownMethodError
from tests.oracles import count_acceptance


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("    ", "whitespace"),
        ("\n\t", "whitespace"),
        (" ", "whitespace"),
        ("(", "punctuation"),
        ("):", "punctuation"),
        (" +=", "punctuation"),
        ("->", "punctuation"),
        ("foo", "identifier"),
        (" bar_baz", "identifier"),
        ("ing", "identifier"),
        ("def", "keyword"),
        (" return", "keyword"),
        ("const", "keyword"),
        ("42", "number"),
        (" 3.14", "number"),
        ("1e-3", "number"),
        ("0xFF", "number"),
        ("", "other"),
        ("foo(", "other"),
        ("a b", "other"),
    ],
)
def test_classify_token(text, expected):
    assert classify_token(text) == expected
    assert expected in TOKEN_CLASSES


def regression_diff(base: Run, new: Run, **options) -> pd.DataFrame:
    """compute_regression_diff of new against base, each side with its own steps."""
    return compute_regression_diff(
        base.positions, new.positions, base_steps=base.steps, new_steps=new.steps, **options
    )


def test_shifted_acceptance_gives_the_closed_form_delta():
    base = build_run(run_id="b", n=4, accept=0.5, n_requests=80, seed=1)
    new = build_run(run_id="n", n=4, accept=0.8, n_requests=80, seed=2)
    diff = regression_diff(base, new, n_boot=400)
    row = diff.iloc[0]
    assert row["metric"] == "accept_len"
    expected = compute_iid_accept_len(0.8, 4) - compute_iid_accept_len(0.5, 4)
    # the interval is ~4 standard errors wide: the truth is within one width of the estimate
    assert abs(row["delta"] - expected) < row["delta_hi"] - row["delta_lo"]
    assert row["delta_lo"] > 0
    assert row["base"] == pytest.approx(
        compute_acceptance_length(base.positions, by=(), n_boot=0)["accept_len"].iloc[0]
    )
    assert row["n_units_base"] == row["n_units_new"] == 80


def test_position_level_finds_the_position_that_regressed():
    base = build_run(run_id="b", n=4, accept=[0.8, 0.8, 0.8, 0.8], n_requests=60, seed=1)
    new = build_run(run_id="n", n=4, accept=[0.8, 0.8, 0.3, 0.8], n_requests=60, seed=2)
    diff = regression_diff(base, new, level="position", n_boot=300)
    rates = diff[diff["metric"] == "accept_rate"].set_index("position")
    significant = rates[(rates["delta_hi"] < 0) | (rates["delta_lo"] > 0)].index.tolist()
    assert significant == [2]
    survival = diff[diff["metric"] == "survival"].set_index("position")
    assert (survival.loc[[2, 3], "delta_hi"] < 0).all()


def test_worst_prompts_are_the_ones_made_worse():
    base = build_run(run_id="b", n=4, accept=0.8, n_requests=12, steps_per_request=40, seed=1)
    new = build_run(run_id="n", n=4, accept=0.8, n_requests=12, steps_per_request=40, seed=2)
    hurt = new.positions["request_id"].isin(["n/req0003", "n/req0007"])
    # those two prompts now reject everything from position 1 on
    new.positions.loc[hurt & (new.positions["position"] >= 1), "accepted"] = False
    prompt_diff = regression_diff(base, new, level="prompt", n_boot=200)
    worst = compute_worst_prompts(prompt_diff, k=2)
    assert sorted(worst["prompt_id"]) == ["p0003", "p0007"]
    assert worst["significant"].all()


@pytest.mark.parametrize("level", ["dataset", "position"])
@pytest.mark.parametrize("paired", [True, False], ids=["per-prompt", "per-request"])
def test_counts_give_the_diff_the_rows_give(level, paired):
    """Per-prompt (or per-request) counts, as the lab counts them over a whole store, give
    the rows' diff exactly, bootstrap bounds included: a unit's counts are its rows summed."""
    base = build_run(run_id="b", n=4, accept=0.5, n_requests=30, seed=1)
    new = build_run(run_id="n", n=4, accept=0.7, n_requests=30, seed=2)
    by = ("dataset", "prompt_id") if paired else ("dataset",)
    counts = [count_acceptance(r.positions, steps=r.steps, by=by) for r in (base, new)]
    steps = {"base_steps": base.steps, "new_steps": new.steps} if paired else {}
    from_rows = compute_regression_diff(
        base.positions, new.positions, level=level, n_boot=200, **steps
    )
    from_counts = compute_regression_diff(*counts, level=level, n_boot=200)
    assert len(from_rows) and from_rows["delta_lo"].notna().all()
    pd.testing.assert_frame_equal(from_counts, from_rows)


def test_levels_and_inputs_are_checked():
    run = build_run(n=3, n_requests=3)
    with pytest.raises(UnknownMethodError, match="valid levels are"):
        compute_regression_diff(run.positions, run.positions, level="token")
    with pytest.raises(DSparkLabError, match="needs base_steps"):
        compute_regression_diff(run.positions, run.positions, level="prompt")
    counts = count_acceptance(run.positions, steps=run.steps, by=("dataset", "prompt_id"))
    with pytest.raises(DSparkLabError, match="resamples each prompt's steps"):
        compute_regression_diff(counts, counts, level="prompt")
    with pytest.raises(DSparkLabError, match="like with like"):
        compute_regression_diff(counts, run.positions)


TEXT = {i: t for i, t in enumerate(["    ", "(", ")", "foo", "bar", "def", "7", "é!"])}


def classed_run(run_id, seed, reject_class=None):
    run = build_run(run_id=run_id, n=3, accept=0.9, n_requests=40, seed=seed)
    rng = np.random.default_rng(seed)
    pos = run.positions
    pos["target_token"] = rng.integers(0, len(TEXT), len(pos))
    if reject_class is not None:
        ids = [i for i, t in TEXT.items() if classify_token(t) == reject_class]
        bad = pos["target_token"].isin(ids).to_numpy()
        # reject rows of that class and everything after them in the step
        key = pos["request_id"] + "/" + pos["step"].astype(str)
        first_bad = (
            pd.Series(np.where(bad, pos["position"], 99)).groupby(key.to_numpy()).transform("min")
        )
        pos.loc[pos["position"].to_numpy() >= first_bad.to_numpy(), "accepted"] = False
    return run


def test_token_class_acceptance_and_diff():
    base = classed_run("b", 1)
    new = classed_run("n", 2, reject_class="punctuation")
    table = compute_token_class_acceptance(new.positions, token_text=TEXT, by="method")
    rates = table.set_index("token_class")["accept_rate"]
    assert rates["punctuation"] == 0.0
    assert rates["identifier"] > 0.5
    assert set(table["token_class"]) == {
        "whitespace",
        "punctuation",
        "identifier",
        "keyword",
        "number",
        "other",
    }
    diff = compute_token_class_diff(
        base.positions,
        new.positions,
        token_text=TEXT.get,
        base_steps=base.steps,
        new_steps=new.steps,
        n_boot=200,
    ).set_index("token_class")
    assert diff.loc["punctuation", "delta_hi"] < -0.5
    others = diff.drop(index="punctuation")
    assert (others["delta_lo"] < 0.1).all()
    assert (others["delta"].abs() < 0.15).all()


def test_a_dataset_one_side_lacks_gives_nan_not_an_error() -> None:
    """A sample (or a partial run set) can leave a dataset with no units on one side."""
    base = [build_run(run_id=f"b-{d}", n=3, dataset=d, seed=i) for i, d in enumerate(("a", "b"))]
    new = build_run(run_id="n-a", n=3, dataset="a", seed=7)
    positions = pd.concat([r.positions for r in base], ignore_index=True)
    steps = pd.concat([r.steps for r in base], ignore_index=True)
    prompts = compute_regression_diff(
        positions, new.positions, base_steps=steps, new_steps=new.steps, level="prompt", n_boot=20
    )
    assert set(prompts["dataset"]) <= {"a", "b"} and len(prompts)
