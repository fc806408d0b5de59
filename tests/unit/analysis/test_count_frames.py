"""count_frames on frames built by hand: runs told apart, grouping columns checked, and a
label the store does not know (a run set) grouped by as the numpy oracle groups it."""

from __future__ import annotations

import pandas as pd
import pytest

from dsparklab.analysis import annotate_positions, count_frames
from dsparklab.errors import DSparkLabError, TraceSchemaError
from tests.oracles import count_acceptance_from_steps


def _steps(method: str, accepted: list[int], **extra: object) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "method": method,
            "n": 3,
            "request_id": "q",
            "step": range(len(accepted)),
            "num_drafted": 3,
            "num_verified": 3,
            "accepted_len": accepted,
            **extra,
        }
    )


def _same(got: pd.DataFrame, want: pd.DataFrame) -> None:
    columns = ["position", "n_drafted", "n_reached", "n_accepted"]
    pd.testing.assert_frame_equal(
        got[columns].reset_index(drop=True), want[columns].reset_index(drop=True)
    )


def test_rows_of_two_runs_without_run_ids_stay_two_runs() -> None:
    a, b = _steps("dspark", [3, 2, 0]), _steps("eagle3", [0, 0, 1])
    got = count_frames(steps=pd.concat([a, b]), by=("method",), per_request=False)
    assert sorted(got["method"].unique()) == ["dspark", "eagle3"]
    for method, rows in (("dspark", a), ("eagle3", b)):
        want = count_acceptance_from_steps(rows, by=("method",), per_request=False)
        _same(got[got["method"] == method], want)


def test_rows_without_run_ids_or_run_columns_are_one_run() -> None:
    rows = _steps("dspark", [3, 2, 0]).drop(columns=["method", "n"])
    got = count_frames(steps=rows, per_request=False)
    _same(got, count_acceptance_from_steps(rows.assign(run_id="run"), per_request=False))


def test_rows_of_one_run_id_that_disagree_are_the_runs_they_are() -> None:
    """Two roots' runs may share a run_id (the shipped traces and a demo): their rows are
    counted apart, each under that run_id, as the rows' own run columns say."""
    a, b = _steps("dspark", [3, 2], tier="smol"), _steps("dspark", [0, 1], tier="tiny")
    rows = pd.concat([a, b]).assign(run_id="r")
    got = count_frames(steps=rows, by=("tier",), per_request=True)
    assert set(got["run_id"]) == {"r"} and sorted(got["tier"].unique()) == ["smol", "tiny"]
    for tier, part in (("smol", a), ("tiny", b)):
        want = count_acceptance_from_steps(part.assign(run_id="r"), by=("tier",))
        _same(got[got["tier"] == tier], want)
    # a table that lacks the column telling them apart cannot be joined: one line
    positions = pd.DataFrame(
        {"run_id": "r", "request_id": "q", "step": 0, "position": [0], "accepted": [True]}
    )
    with pytest.raises(DSparkLabError, match="the positions rows lack tier"):
        count_frames(positions=positions, steps=rows, by=("tier",))


def test_a_missing_grouping_column_is_named() -> None:
    with pytest.raises(TraceSchemaError, match="dataset"):
        count_frames(steps=_steps("dspark", [1, 2]), by=("method", "dataset"))


def test_a_label_per_run_groups_as_the_oracle_does() -> None:
    rows = pd.concat(
        [
            _steps("dspark", [3, 2], run_id="a", run_set="base"),
            _steps("dspark", [0, 1], run_id="b", run_set="new"),
            _steps("dspark", [2, 2], run_id="c", run_set="new"),
        ]
    )
    got = count_frames(steps=rows, by=("run_set",), per_request=False)
    want = count_acceptance_from_steps(rows, by=("run_set",), per_request=False)
    assert got["run_set"].tolist() == want["run_set"].tolist()
    _same(got, want)


def test_positions_and_steps_without_run_ids_join_on_the_run_columns_they_share() -> None:
    """Hand-built positions and steps are labelled alike: by the run columns both hold
    (positions' dataset is not in the steps), numbers as numbers (n 3 vs 3.0)."""
    positions = pd.DataFrame(
        {
            "dataset": ["he", "he", "pr", "pr"],
            "n": [2, 2, 2, 2],
            "request_id": ["he/0", "he/0", "pr/0", "pr/0"],
            "step": 0,
            "position": [0, 1, 0, 1],
            "accepted": [True, False, True, True],
        }
    )
    steps = pd.DataFrame(
        {
            "n": [2.0, 2.0],
            "request_id": ["he/0", "pr/0"],
            "step": 0,
            "prompt_id": ["p-he", "p-pr"],
            "num_drafted": 2,
            "num_verified": [2, 1],  # pr/0's second draft was never verified
            "accepted_len": [1, 1],
        }
    )
    annotated = annotate_positions(positions, steps=steps)
    assert annotated["prompt_id"].tolist() == ["p-he", "p-he", "p-pr", "p-pr"]
    assert annotated["reached"].tolist() == [True, True, True, False]
    got = count_frames(positions=positions, steps=steps, per_request=False)
    assert got[["position", "n_reached", "n_accepted"]].values.tolist() == [[0, 2, 2], [1, 1, 0]]


def test_runs_sharing_a_run_id_join_whatever_the_number_type() -> None:
    """Two runs under one run_id told apart by n, held as int in the positions and as float
    in the steps: each run's positions still meet its own steps (the n = 3 step verified
    one draft only, so its second position was never reached: the steps say so)."""
    positions = pd.DataFrame(
        {
            "run_id": "r",
            "n": [3, 3, 4, 4],
            "request_id": "q",
            "step": 0,
            "position": [0, 1, 0, 1],
            "accepted": [True, False, False, False],
        }
    )
    steps = pd.DataFrame(
        {
            "run_id": "r",
            "n": [3.0, 4.0],
            "request_id": "q",
            "step": 0,
            "num_drafted": [3, 4],
            "num_verified": [1, 4],
            "accepted_len": [1, 0],
        }
    )
    got = count_frames(positions=positions, steps=steps, by=("n",), per_request=False)
    reached = got.set_index(["n", "position"])["n_reached"].to_dict()
    assert reached == {(3, 0): 1, (3, 1): 0, (4, 0): 1, (4, 1): 0}
