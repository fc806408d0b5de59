"""Acceptance length of groups that mix counted and rate-only runs (compute_*_any)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dsparklab.analysis import compute_acceptance_length


def _run_counters(run_id: str, dataset: str, n: int, **columns: object) -> pd.DataFrame:
    """One run's counters rows at positions 0..n-1: counts NA, rates NaN but ``columns``."""
    missing = pd.array([pd.NA] * n, dtype="Int64")
    base: dict[str, object] = {
        "run_id": run_id,
        "dataset": dataset,
        "scope": "run",
        "request_id": None,
        "interval": missing,
        "position": np.arange(n),
        "n_drafted": missing,
        "n_reached": missing,
        "n_accepted": missing,
        "accept_rate": np.nan,
        "survival": np.nan,
    }
    return pd.DataFrame(base | columns)


def _counted(run_id: str, dataset: str, reached: list[int], accepted: list[int]) -> pd.DataFrame:
    return _run_counters(
        run_id,
        dataset,
        len(reached),
        n_drafted=reached[0],
        n_reached=pd.array(reached, dtype="Int64"),
        n_accepted=pd.array(accepted, dtype="Int64"),
    )


def _rates(run_id: str, dataset: str, survival: list[float]) -> pd.DataFrame:
    return _run_counters(run_id, dataset, len(survival), survival=survival)


@pytest.fixture
def counters() -> pd.DataFrame:
    return pd.concat(
        [
            # dataset "mixed": a counted run (AL = 1 + .7 + .4 + .1 = 2.2) and a rate-only
            # run (AL = 1 + .9 + .6 + .3 = 2.8)
            _counted("a", "mixed", [10, 7, 4], [7, 4, 1]),
            _rates("b", "mixed", [0.9, 0.6, 0.3]),
            _counted("c", "counted", [20, 10, 5], [10, 5, 0]),  # AL 1.75
            _rates("d", "rates", [0.5, 0.25]),  # AL 1.75
        ],
        ignore_index=True,
    )


def test_a_group_mixing_counts_and_rates_gets_one_row(counters: pd.DataFrame) -> None:
    lengths = compute_acceptance_length(counters=counters, by="dataset", n_boot=0)
    assert sorted(lengths["dataset"]) == ["counted", "mixed", "rates"], lengths
    by_dataset = lengths.set_index("dataset")
    # the runs cannot be weighted against each other: the mean over runs of each run's AL
    assert by_dataset.loc["mixed", "accept_len"] == pytest.approx((2.2 + 2.8) / 2)
    assert by_dataset.loc["counted", "accept_len"] == pytest.approx(1.75)
    assert by_dataset.loc["rates", "accept_len"] == pytest.approx(1.75)
    assert set(lengths["definition"]) == {"per_step"}
    # the mixed row carries no counts: they would be the counted run's alone
    assert pd.isna(by_dataset.loc["mixed", "n_accepted"])
    assert by_dataset.loc["counted", "n_accepted"] == 15


def test_one_group_over_everything_is_one_row(counters: pd.DataFrame) -> None:
    (length,) = compute_acceptance_length(counters=counters, by=(), n_boot=0)["accept_len"]
    assert length == pytest.approx(np.mean([2.2, 2.8, 1.75, 1.75]))


def test_groups_by_run_are_unchanged(counters: pd.DataFrame) -> None:
    lengths = compute_acceptance_length(counters=counters, n_boot=0).set_index("run_id")
    assert lengths["accept_len"].to_dict() == pytest.approx(
        {"a": 2.2, "b": 2.8, "c": 1.75, "d": 1.75}
    )


def test_runs_counted_already_join_the_stored_counters(counters: pd.DataFrame) -> None:
    """Run "a" given as per-request counts (aggregate_store's table) instead of counters:
    every group's length is unchanged, and positions never drafted count nothing."""
    counts = pd.DataFrame(
        {
            "run_id": "a",
            "request_id": ["r0", "r0", "r0", "r0"],
            "dataset": "mixed",
            "position": [0, 1, 2, 3],
            "n_drafted": [10, 10, 10, 0],
            "n_reached": [10, 7, 4, 0],
            "n_accepted": [7, 4, 1, 0],
        }
    )
    rest = counters[counters["run_id"] != "a"]
    want = compute_acceptance_length(counters=counters, by="dataset", n_boot=0)
    got = compute_acceptance_length(counters=rest, counts=counts, by="dataset", n_boot=0)
    assert got.set_index("dataset")["accept_len"].to_dict() == pytest.approx(
        want.set_index("dataset")["accept_len"].to_dict()
    )
    by_run = compute_acceptance_length(counts=counts, n_boot=0)
    assert by_run["accept_len"].tolist() == pytest.approx([2.2])
