"""The schedule rule (issue 32): the smallest window the evidence cannot tell from the
best at each load that may pay, marked where none does (never 0: vLLM's n = 0 still runs
the drafter), and batch-size ranges vLLM's own lookup reads as intended."""

from __future__ import annotations

import pandas as pd
import pytest

from dsparklab.analysis import compute_speculation_schedule, schedule_config
from dsparklab.errors import MissingInputError


def scaling(rows: list[tuple[int, int, float, float, float]]) -> pd.DataFrame:
    return pd.DataFrame(
        rows, columns=["concurrency", "n", "speedup", "speedup_lo", "speedup_hi"]
    ).assign(method="eagle3")


def test_each_load_takes_the_smallest_window_it_cannot_tell_from_the_best():
    table = scaling(
        [
            # at 1: n = 4 is best, n = 3 overlaps it, n = 1 and 2 do not
            (1, 1, 1.30, 1.25, 1.35),
            (1, 2, 1.50, 1.45, 1.55),
            (1, 3, 1.70, 1.60, 1.82),
            (1, 4, 1.75, 1.66, 1.84),
            # at 2: n = 2 is clearly best
            (2, 1, 1.10, 1.05, 1.15),
            (2, 2, 1.30, 1.25, 1.35),
            (2, 3, 1.12, 1.00, 1.20),
            # at 4: every window measurably slower than target-only
            (4, 1, 0.90, 0.85, 0.95),
            (4, 2, 0.80, 0.70, 0.90),
        ]
    )
    plan = compute_speculation_schedule(table, by=("method",)).set_index("concurrency")
    # at 4 no window pays: the cheapest window the server can run, marked, not an
    # unmeasured 0
    assert plan["n"].tolist() == [3, 2, 1]
    assert plan["pays"].tolist() == [True, True, False]
    assert plan["best_n"].tolist() == [4, 2, 1]
    assert plan.loc[1, "candidates"] == "3 4" and plan.loc[1, "speedup_lo"] == 1.60
    assert plan.loc[4, "speedup"] == 0.90 and plan.loc[4, "speedup_hi"] == 0.95
    assert plan["range_start"].tolist() == [1, 2, 4]
    assert plan["range_end"].tolist()[:2] == [1, 3] and pd.isna(plan.loc[4, "range_end"])
    config = schedule_config(plan.reset_index(), max_batch=8)
    assert config == {
        "num_speculative_tokens": 3,
        "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 3, 2], [4, 8, 1]],
    }


def test_the_choice_is_a_window_that_may_pay_where_one_does():
    # at 4: n = 3 is best and reaches 1; n = 1 cannot be told from it but is measurably
    # slower than the target alone, so the schedule serves n = 3
    table = scaling([(4, 1, 0.90, 0.85, 0.95), (4, 3, 0.98, 0.90, 1.05)])
    plan = compute_speculation_schedule(table).set_index("concurrency")
    assert plan.loc[4, "candidates"] == "1 3"
    assert plan.loc[4, "n"] == 3 and bool(plan.loc[4, "pays"])
    assert plan.loc[4, "speedup_hi"] == 1.05


def test_adjacent_ranges_of_one_window_merge():
    table = scaling([(1, 2, 1.3, 1.2, 1.4), (2, 2, 1.2, 1.1, 1.3), (4, 1, 1.1, 1.0, 1.2)])
    config = schedule_config(compute_speculation_schedule(table), max_batch=4)
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 3, 2], [4, 4, 1]]


def test_the_first_range_starts_at_one_and_vllm_reads_the_ranges_as_intended():
    vllm_utils = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    table = scaling([(2, 1, 1.2, 1.1, 1.3), (2, 3, 1.5, 1.4, 1.6), (8, 1, 1.1, 1.0, 1.2)])
    plan = compute_speculation_schedule(table)
    config = schedule_config(plan)
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 7, 3], [8, 8, 1]]
    lookup = vllm_utils.build_dynamic_sd_schedule_lookup(
        config["num_speculative_tokens_per_batch_size"], 16, config["num_speculative_tokens"]
    )
    assert lookup[1:] == [3] * 7 + [1] * 9  # vLLM carries the last range on


def test_nothing_to_schedule_is_one_line():
    with pytest.raises(MissingInputError, match="no measured speedup"):
        compute_speculation_schedule(scaling([(1, 2, float("nan"), 0.0, 0.0)]))
    slower = compute_speculation_schedule(scaling([(1, 2, 0.8, 0.7, 0.9)]))
    with pytest.raises(MissingInputError, match="pays at no measured load"):
        schedule_config(slower)
