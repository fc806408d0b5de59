"""The speedup attribution: its four parts sum exactly to the change of log speedup, and
each part moves only when its own input does (synthetic runs with known costs)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsparklab.analysis import COMPONENTS, compute_speedup_attribution
from dsparklab.errors import MissingInputError


def _steps(
    method: str,
    n: int,
    *,
    prompts: int,
    emitted: float,
    draft: float,
    verify: float,
    other: float = 0.0,
    seed: int = 0,
    steps_per_prompt: int = 5,
) -> pd.DataFrame:
    """``steps_per_prompt`` steps per prompt; each step's emitted tokens and times are
    jittered around the given means (so prompts differ and the bootstrap has spread)."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(prompts):
        for k in range(steps_per_prompt):
            rows.append(
                {
                    "run_id": f"{method}-{n}",
                    "request_id": f"r{p}",
                    "prompt_id": f"p{p}",
                    "step": k,
                    "method": method,
                    "n": n,
                    "engine": "synthetic",
                    "target": "t",
                    "dataset": "code",
                    "temperature": 0.0,
                    "emitted": int(max(1, round(emitted + rng.normal(0, 0.5)))),
                    "draft_time_s": draft * rng.uniform(0.9, 1.1) if method != "none" else None,
                    "verify_time_s": verify * rng.uniform(0.9, 1.1),
                    "other_time_s": other,
                }
            )
    return pd.DataFrame(rows)


BASELINE = _steps("none", 0, prompts=6, emitted=1, draft=0.0, verify=0.01, seed=9)


@settings(max_examples=30, deadline=None)
@given(
    st.floats(1.0, 5.0),
    st.floats(1.0, 5.0),
    st.floats(0.0, 0.02),
    st.floats(0.0, 0.02),
    st.floats(0.005, 0.05),
    st.floats(0.005, 0.05),
    st.floats(0.0, 0.01),
    st.floats(0.0, 0.01),
)
def test_parts_sum_exactly_to_the_change_of_log_speedup(ea, eb, da, db, ua, ub, oa, ob):
    base = pd.concat(
        [_steps("eagle3", 3, prompts=6, emitted=ea, draft=da, verify=ua, other=oa), BASELINE]
    )
    new = pd.concat(
        [
            _steps("eagle3", 7, prompts=6, emitted=eb, draft=db, verify=ub, other=ob, seed=1),
            BASELINE,
        ]
    )
    table = compute_speedup_attribution(base, new, n_boot=20)
    assert table["component"].tolist() == list(COMPONENTS)
    total = np.log(table["new_speedup"].iloc[0] / table["base_speedup"].iloc[0])
    assert table["delta_log_speedup"].sum() == pytest.approx(total, abs=1e-9)
    assert table["total"].iloc[0] == pytest.approx(total, abs=1e-12)


def test_each_part_moves_with_its_own_input_only():
    """Only the draft time changes: all of delta log S is in `draft`; then only the tokens."""
    base = pd.concat([_steps("dspark", 3, prompts=8, emitted=3, draft=0.01, verify=0.02), BASELINE])
    slower = pd.concat(
        [_steps("dspark", 3, prompts=8, emitted=3, draft=0.03, verify=0.02), BASELINE]
    )
    parts = compute_speedup_attribution(base, slower, n_boot=50).set_index("component")
    assert parts.loc["tokens", "delta_log_speedup"] == pytest.approx(0.0, abs=1e-12)
    assert parts.loc["draft", "delta_log_speedup"] < 0
    for same in ("verify", "other"):  # the same seed: the same verify times and tokens
        assert parts.loc[same, "delta_log_speedup"] == pytest.approx(0.0, abs=1e-12)
    assert parts.loc["draft", "share"] > 0.9
    lo, hi = parts.loc["draft", ["lo", "hi"]]
    assert lo <= parts.loc["draft", "delta_log_speedup"] <= hi


def test_a_method_against_its_baseline_splits_its_own_speedup():
    method = pd.concat(
        [_steps("eagle3", 5, prompts=6, emitted=2.5, draft=0.005, verify=0.015), BASELINE]
    )
    table = compute_speedup_attribution(BASELINE, method, n_boot=0).set_index("component")
    assert table["base_speedup"].iloc[0] == pytest.approx(1.0)
    speedup = table["new_speedup"].iloc[0]
    assert table["delta_log_speedup"].sum() == pytest.approx(np.log(speedup), abs=1e-9)
    assert table.loc["tokens", "delta_log_speedup"] > 0 > table.loc["verify", "delta_log_speedup"]


def test_prompt_level_and_missing_inputs():
    base = pd.concat([_steps("eagle3", 3, prompts=4, emitted=2, draft=0.01, verify=0.02), BASELINE])
    new = pd.concat([_steps("eagle3", 7, prompts=4, emitted=3, draft=0.02, verify=0.03), BASELINE])
    per_prompt = compute_speedup_attribution(base, new, level="prompt", n_boot=0)
    assert per_prompt["prompt_id"].nunique() == 4 and len(per_prompt) == 16
    sums = per_prompt.groupby("prompt_id")["delta_log_speedup"].sum()
    assert np.allclose(sums, per_prompt.groupby("prompt_id")["total"].first(), atol=1e-9)
    with pytest.raises(MissingInputError, match="baseline"):
        compute_speedup_attribution(base[base["method"] != "none"], new)
    untimed = new.assign(verify_time_s=np.nan)
    with pytest.raises(MissingInputError, match="verify time"):
        compute_speedup_attribution(base, untimed)


def test_a_prompt_decoded_at_several_loads_counts_once():
    """Runs of two loads in one set (each with its baseline at that load): each side sums
    a prompt's loads and the prompt counts once, so the point value, the prompt count and
    the interval are those of the prompts, not of every pair of loads."""

    def at(load: int, frame: pd.DataFrame) -> pd.DataFrame:
        return frame.assign(concurrency=load, run_id=frame["run_id"] + f"-c{load}")

    base = pd.concat([_steps("eagle3", 3, prompts=6, emitted=2, draft=0.01, verify=0.02), BASELINE])
    new = pd.concat([_steps("eagle3", 7, prompts=6, emitted=3, draft=0.02, verify=0.03), BASELINE])
    one = compute_speedup_attribution(at(1, base), at(1, new), n_boot=200)
    both = compute_speedup_attribution(
        pd.concat([at(1, base), at(4, base)]), pd.concat([at(1, new), at(4, new)]), n_boot=200
    )
    assert (both["n_prompts"] == 6).all()
    # the same steps at both loads: the same split, and the same prompts to resample
    np.testing.assert_allclose(both["delta_log_speedup"], one["delta_log_speedup"], atol=1e-12)
    np.testing.assert_allclose(both[["lo", "hi"]], one[["lo", "hi"]], atol=1e-12)
    # one load against another (the regression notebook's BASE and NEW): prompts pair
    across = compute_speedup_attribution(at(1, base), at(4, new), n_boot=0)
    assert (across["n_prompts"] == 6).all()
    np.testing.assert_allclose(across["delta_log_speedup"], one["delta_log_speedup"], atol=1e-12)
