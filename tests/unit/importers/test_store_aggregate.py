"""The store's tables for runs without token-level rows: written, read, validated.

Token-level runs are unchanged (no aggregate directories, the same ``rows`` in run.json,
still valid); a run of counters validates, and each broken invariant is reported with its
file, row and field.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

import dsparklab.analysis as A
from dsparklab.store import TraceWriter, list_runs, read_run_json, read_trace, validate_trace
from dsparklab.store.rows import counter_row, totals_row
from tests.conftest import make_run_json, write_run


def _counts_run(
    root: Path, counters: list[dict[str, Any]], totals: list[dict[str, Any]], **meta: Any
) -> Path:
    fields = dict(run_id="agg", granularity="aggregate") | meta
    with TraceWriter(root / "r", make_run_json(**fields)) as writer:
        if counters:
            writer.add_many("counters", counters)
        if totals:
            writer.add_many("totals", totals)
    return Path(writer.run_dir.path)


def _good_counters(scope: str = "run", **unit: Any) -> list[dict[str, Any]]:
    return [
        counter_row(0, scope=scope, n_reached=10, n_accepted=7, **unit),
        counter_row(1, scope=scope, n_reached=7, n_accepted=4, **unit),
        counter_row(2, scope=scope, n_reached=4, n_accepted=1, **unit),
    ]


def test_token_runs_are_unchanged(tmp_path: Path) -> None:
    run = write_run(tmp_path / "tok")
    assert sorted(p.name for p in (tmp_path / "tok").iterdir() if p.name[0] != "_") == [
        "positions",
        "requests",
        "runs",
        "steps",
    ]
    meta = read_run_json(run)
    assert set(meta["rows"]) == {"steps", "positions", "requests"}
    assert "granularity" not in meta
    (report,) = validate_trace(run)
    assert report.ok
    assert set(report.rows) == {"steps", "positions", "requests"}
    assert list_runs(tmp_path)["granularity"].tolist() == ["token"]


def test_a_counters_run_round_trips_and_validates(tmp_path: Path) -> None:
    run = _counts_run(
        tmp_path, _good_counters(), [totals_row(num_drafts=10, num_accepted_tokens=12)]
    )
    (report,) = validate_trace(run)
    assert report.ok
    assert report.complete
    assert report.rows["counters"] == 3
    counters = read_trace(run, "counters")
    assert counters["n_accepted"].tolist() == [7, 4, 1]
    assert set(counters["run_id"]) == {"agg"}
    length = A.compute_acceptance_length(counters=counters, n_boot=0)
    assert length["accept_len"].iloc[0] == pytest.approx(1 + 12 / 10)
    assert json.loads((run / "run.json").read_text())["rows"]["counters"] == 3


@pytest.mark.parametrize(
    ("case", "edit", "field"),
    [
        ("accepted above reached", lambda c, t: c[1].update(n_accepted=9), "n_accepted"),
        ("not prefix-closed", lambda c, t: c[2].update(n_reached=6, n_accepted=5), "n_accepted"),
        ("position outside n", lambda c, t: c[2].update(position=5), "position"),
        (
            "rate above one",
            lambda c, t: c[0].update(n_reached=None, n_accepted=None, survival=1.5),
            "survival",
        ),
        (
            "neither counts nor rates",
            lambda c, t: c[0].update(n_reached=None, n_accepted=None),
            "n_accepted",
        ),
        (
            "duplicate position",
            lambda c, t: c[2].update(position=1, n_reached=4, n_accepted=4),
            "position",
        ),
        ("request scope without id", lambda c, t: c[0].update(scope="request"), "request_id"),
        (
            "totals disagree",
            lambda c, t: t[0].update(num_accepted_tokens=13),
            "num_accepted_tokens",
        ),
        (
            "percent stored",
            lambda c, t: t[0].update(reported_accept_rate=41.5),
            "reported_accept_rate",
        ),
        (
            "unknown AL definition",
            lambda c, t: t[0].update(
                reported_accept_len=2.2, reported_accept_len_definition="mean"
            ),
            "reported_accept_len_definition",
        ),
        (
            "AL with no definition",
            lambda c, t: t[0].update(reported_accept_len=2.2),
            "reported_accept_len_definition",
        ),
    ],
)
def test_broken_counters_are_reported(tmp_path: Path, case: str, edit: Any, field: str) -> None:
    counters = _good_counters()
    totals = [totals_row(num_drafts=10, num_draft_tokens=30, num_accepted_tokens=12)]
    edit(counters, totals)
    run = _counts_run(tmp_path, counters, totals)
    (report,) = validate_trace(run)
    assert not report.ok, case
    assert any(
        v.field == field and "counters" in v.file or v.field == field for v in report.violations
    ), [str(v) for v in report.violations]
    assert all(v.file.startswith(str(tmp_path / "r")) for v in report.violations)  # its store


def test_granularity_must_match_the_tables(tmp_path: Path) -> None:
    run = _counts_run(tmp_path, [], [])
    (report,) = validate_trace(run)
    assert not report.ok
    assert "holds no counters or totals" in str(report.violations[0])
    other = write_run(tmp_path / "tok", meta=make_run_json(run_id="x", granularity="aggregate"))
    (report,) = validate_trace(other)
    assert not report.ok
    assert report.violations[0].field == "granularity"
    bad = _counts_run(tmp_path / "g", _good_counters(), [], granularity="hourly")
    (report,) = validate_trace(bad)
    assert not report.ok
    assert report.violations[0].field == "granularity"


def test_rate_only_runs_average_unweighted_and_say_so(tmp_path: Path) -> None:
    rows = []
    for run_id, survival in (("a", [0.8, 0.4]), ("b", [0.6, 0.2])):
        for i, s in enumerate(survival):
            rows.append(counter_row(i, survival=s) | {"run_id": run_id, "method": "m", "n": 2})
    counters = pd.DataFrame(rows)
    per_run = A.compute_rate_acceptance(counters, by=("run_id",))
    assert per_run["survival"].tolist() == [0.8, 0.4, 0.6, 0.2]
    pooled = A.compute_rate_acceptance(counters, by=("method",))
    assert pooled["survival"].tolist() == pytest.approx([0.7, 0.3])
    assert pooled["accept_rate"].tolist() == pytest.approx([0.7, 0.3 / 0.7])
    assert pooled["n_runs"].tolist() == [2, 2]
    assert pooled["n_accepted"].isna().all()


def test_coverage_says_why(tmp_path: Path) -> None:
    runs = pd.DataFrame(
        [
            {"run_id": "t", "method": "dspark", "granularity": "token"},
            {"run_id": "e", "method": "eagle3", "granularity": "token"},
            {"run_id": "s", "method": "eagle3", "granularity": "step"},
            {"run_id": "g", "method": "eagle3", "granularity": "aggregate"},
            {"run_id": "l", "method": "eagle3", "granularity": "interval"},
        ]
    )
    table = A.compute_coverage(runs).set_index(["run_id", "analysis"])
    assert table.loc[("t", "calibration"), "available"]
    assert table.loc[("e", "calibration"), "reason"] == "eagle3 has no confidence head"
    assert table.loc[("s", "token_classes"), "reason"] == "step run: no drafted or target tokens"
    assert not table.loc[("g", "acceptance_intervals"), "available"]
    assert table.loc[("s", "acceptance_intervals"), "available"]
    assert table.loc[("l", "acceptance_over_time"), "available"]
    assert (
        table.loc[("g", "speedup"), "reason"] == "aggregate run: no per-step draft / verify timings"
    )
    assert table["reason"].where(~table["available"], "x").str.len().min() > 0
