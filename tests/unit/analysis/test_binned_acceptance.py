"""Acceptance by output depth and context length: DuckDB's counts equal a recount from the
parquet with pandas, per run, bin and position, including on a store past the row budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dsparklab.analysis.sql import aggregate_store
from dsparklab.analysis.sql.queries import BIN_EDGES
from dsparklab.errors import DSparkLabError
from dsparklab.lab.notebook import MAX_ROWS_ENV, SHIPPED_TRACES, load_runs
from dsparklab.store import read_trace
from tests.notebooks.lab_synth import write_synthetic_run


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("binned")
    for method, n in (("dspark", 3), ("dspark", 5), ("eagle3", 4), ("none", 0)):
        write_synthetic_run(
            root, method=method, n=n, dataset="prose", n_requests=12, tokens_per_request=400
        )
    return root


def recount(store: Path, column: str) -> pd.DataFrame:
    """Independently of the SQL: each step's bin from its context_len (less the request's
    first, for the depth), then per position i < num_drafted: reached when i <= accepted
    and i < num_verified, accepted when i < accepted."""
    steps = read_trace(store, "steps")
    steps = steps[steps["num_drafted"] > 0].copy()
    first = steps.groupby(["run_id", "request_id"])["context_len"].transform("min")
    value = steps["context_len"] - first if column == "depth_bin" else steps["context_len"]
    edges = np.array(BIN_EDGES[column])
    steps[column] = edges[np.searchsorted(edges, value.to_numpy(), side="right") - 1]
    rows = []
    for step in steps.itertuples():
        verified = min(step.num_verified, step.num_drafted)
        for i in range(int(step.num_drafted)):
            rows.append(
                {
                    "run_id": step.run_id,
                    column: int(getattr(step, column)),
                    "position": i,
                    "n_drafted": 1,
                    "n_reached": int(i <= step.accepted_len and i < verified),
                    "n_accepted": int(i < step.accepted_len),
                }
            )
    keys = ["run_id", column, "position"]
    return pd.DataFrame(rows).groupby(keys, as_index=False).sum().sort_values(keys)


@pytest.mark.parametrize("column", list(BIN_EDGES))
@pytest.mark.parametrize("where", ["synthetic", "shipped"])
def test_binned_counts_equal_a_recount_from_the_parquet(
    store: Path, column: str, where: str
) -> None:
    if where == "shipped":
        store = SHIPPED_TRACES  # the smol traces the project ships
    counted = aggregate_store(store, metric="acceptance", by=("run_id", column), per_request=False)
    want = recount(store, column)
    got = counted.astype({column: "int64"})[want.columns].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want.reset_index(drop=True), check_dtype=False)
    assert counted[column].nunique() > 1, "the runs span several bins"


def test_past_the_row_budget_the_bins_count_every_request(
    store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = load_runs(store).acceptance_counts(by=("depth_bin",))
    monkeypatch.setenv(MAX_ROWS_ENV, str(len(read_trace(store, "positions")) // 5))
    sampled = load_runs(store)
    assert (sampled.runs["sample"] < 1).all(), "the token-level tables hold a sample"
    counted = sampled.acceptance_counts(by=("depth_bin",))
    keys = ["run_id", "request_id", "depth_bin", "position"]
    pd.testing.assert_frame_equal(
        counted.sort_values(keys).reset_index(drop=True)[full.columns],
        full.sort_values(keys).reset_index(drop=True),
    )
    assert len(counted[["run_id", "request_id"]].drop_duplicates()) == 12 * 3


def test_bins_come_from_the_steps_only(store: Path) -> None:
    with pytest.raises(DSparkLabError, match="only for acceptance counted from the steps"):
        aggregate_store(store, metric="acceptance", by=("depth_bin",), source="positions")
    with pytest.raises(DSparkLabError, match="only for acceptance counted from the steps"):
        aggregate_store(store, metric="step_times", by=("context_bin",))
