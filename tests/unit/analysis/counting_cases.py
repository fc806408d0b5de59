"""Stores of every shape the trace contract allows, and the counters to compare on them.

The SQL counting stage (``aggregate_store`` on DuckDB and on Spark) must give exactly the
table of the in-process ``count_*`` function on the rows ``read_trace`` reads. The store
written here holds, through the real ``TraceWriter``:

- DSpark at n = 3 with an informative head and some null confidences, under run ids with
  ``/`` (escaped in the table layout's partition names);
- DSpark at n = 4 verifying adaptively (``num_verified < num_drafted``), another dataset;
- DSpark at n = 7 accepting long prefixes (prefix products of up to 7 float32 factors,
  whose rounding depends on the order they are multiplied in);
- Eagle3 at n = 4 (no confidence head: every confidence null), with steps missing their
  verify time and steps whose output was cut (``emitted < accepted_len + 1``);
- the target-only baseline (steps, no positions);
- a run imported at step granularity (steps, no positions);
- runs imported as aggregate and request counters (``counters``/``totals`` only, no
  temperature): they hold none of the rows counted, and contribute nothing;
- a failed run (left out by ``statuses``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from analysis_synth import Run, _plain, build_run, noisy_confidence

from dsparklab.analysis.sql import metric_keys
from dsparklab.store import POSITIONS_SCHEMA, STEPS_SCHEMA, TraceWriter, new_run_json, read_trace
from dsparklab.store.rows import counter_row, totals_row
from tests.oracles import (
    count_acceptance,
    count_acceptance_from_steps,
    count_calibration,
    count_step_times,
)

# the match key of step times: engine, target, dataset, temperature (count_step_times)
STEP_TIME_BY: tuple[str, ...] = ("method", "dataset")


def _null_some_confidence(run: Run, fraction: float, seed: int) -> Run:
    rng = np.random.default_rng(seed)
    positions = run.positions.copy()
    positions.loc[rng.random(len(positions)) < fraction, "confidence"] = np.nan
    return Run(run.meta, run.steps, positions)


def _untimed_and_cut(run: Run, seed: int) -> Run:
    """Some steps without a verify time; each request's last step cut to one token."""
    rng = np.random.default_rng(seed)
    steps = run.steps.copy()
    steps.loc[rng.random(len(steps)) < 0.05, "verify_time_s"] = np.nan
    last = steps.groupby("request_id")["step"].transform("max") == steps["step"]
    steps.loc[last, "emitted"] = 1
    return Run(run.meta, steps, run.positions)


def token_runs() -> list[Run]:
    """The runs with rows (see the module docstring)."""
    ds3 = build_run(
        run_id="ref/gsm8k/dspark-n3",
        n=3,
        accept=[0.8, 0.6, 0.5],
        n_requests=9,
        steps_per_request=[4, 7, 1, 5, 6, 2, 8, 3, 5],
        seed=11,
        confidence=noisy_confidence(0.25),
    )
    ada = build_run(
        run_id="ref/humaneval/dspark-n4-adaptive",
        n=4,
        dataset="humaneval",
        accept=0.75,
        n_requests=7,
        seed=12,
        confidence=noisy_confidence(0.15),
        num_verified=lambda d, g: np.where(g.random(len(d)) < 0.4, d, g.integers(1, 4, len(d))),
    )
    ds7 = build_run(
        run_id="ref/mtbench/dspark-n7",
        n=7,
        dataset="mtbench",
        accept=[0.95, 0.9, 0.9, 0.85, 0.85, 0.8, 0.8],
        n_requests=6,
        seed=18,
        confidence=noisy_confidence(0.1),
    )
    e4 = build_run(
        run_id="ref/gsm8k/eagle3-n4", method="eagle3", n=4, accept=0.6, n_requests=8, seed=13
    )
    base = build_run(run_id="ref/gsm8k/none", method="none", n=0, n_requests=5, seed=14)
    base_he = build_run(
        run_id="ref/humaneval/none", method="none", n=0, dataset="humaneval", seed=15
    )
    return [
        _null_some_confidence(ds3, 0.1, 21),
        ada,
        ds7,
        _untimed_and_cut(e4, 22),
        base,
        base_he,
    ]


def _writer(root: str, meta: Mapping[str, Any], **options: Any) -> TraceWriter:
    """A TraceWriter of ``meta``'s run into the store ``root`` (its table layout)."""
    return TraceWriter(root, meta, **options)


def _write_rows(root: str, run: Run, *, status: str = "complete") -> None:
    step_cols = [f.name for f in STEPS_SCHEMA]
    pos_cols = [f.name for f in POSITIONS_SCHEMA]
    writer = _writer(root, run.meta, flush_rows=97)
    writer.__enter__()
    # one step at a time, as an engine writes: parts hold many requests' rows
    positions = run.positions[pos_cols].to_dict("records")
    by_step: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in positions:
        by_step.setdefault((row["request_id"], row["step"]), []).append(_plain(row))
    for rec in run.steps[step_cols].to_dict("records"):
        writer.add("steps", _plain(rec))
        writer.add_many("positions", by_step.get((rec["request_id"], rec["step"]), []))
    writer.close(status=status)


def _imported_meta(run_id: str, granularity: str, n: int) -> dict[str, Any]:
    return new_run_json(
        run_id=run_id,
        engine={"name": "vllm", "version": "0.32"},
        method="dspark",
        num_speculative_tokens=n,
        target={"name": "kimi"},
        drafter={"name": "dspark-kimi"},
        dataset="gsm8k",
        sampling={"temperature": None},  # what an exported file does not say
        granularity=granularity,
        tier="imported",
    )


def _write_imported(root: str) -> None:
    meta = _imported_meta("import/vllm-bench/gsm8k", "aggregate", 3)
    with _writer(root, meta) as writer:
        for i, (reached, accepted) in enumerate([(10, 7), (7, 4), (4, 1)]):
            writer.add("counters", counter_row(i, n_reached=reached, n_accepted=accepted))
        writer.add("totals", totals_row(num_drafts=10, num_accepted_tokens=12))
    meta = _imported_meta("import/sglang/gsm8k", "request", 2)
    with _writer(root, meta) as writer:
        for request in ("a", "b"):
            unit = {"scope": "request", "request_id": request}
            writer.add("counters", counter_row(0, n_reached=5, n_accepted=3, **unit))
            writer.add("counters", counter_row(1, n_reached=3, n_accepted=1, **unit))
            writer.add("totals", totals_row(num_drafts=5, num_accepted_tokens=4, **unit))
    # step granularity: per-step accepted counts, no drafted tokens
    stepwise = build_run(run_id="import/vllm/steps", method="eagle3", n=3, n_requests=4, seed=16)
    meta = {**stepwise.meta, "granularity": "step"}
    with _writer(root, meta) as writer:
        for rec in stepwise.steps[[f.name for f in STEPS_SCHEMA]].to_dict("records"):
            writer.add("steps", _plain(rec))


def write_store(root: str) -> str:
    """Write every shape below ``root`` (a local directory or ``s3://bucket/prefix``)."""
    for run in token_runs():
        _write_rows(root, run)
    failed = build_run(run_id="ref/gsm8k/dspark-n3-crashed", n=3, n_requests=3, seed=17)
    _write_rows(root, failed, status="failed")
    _write_imported(root)
    return root


@dataclass(frozen=True)
class Case:
    """One counter table to compare: ``aggregate_store`` arguments and the in-process call."""

    name: str
    metric: str
    by: tuple[str, ...] = ("run_id",)
    per_request: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)

    def store_args(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "by": self.by,
            "per_request": self.per_request,
            **self.options,
        }


CASES = [
    Case("acceptance/steps/run", "acceptance"),
    Case("acceptance/steps/method-n-request", "acceptance", ("method", "n"), per_request=True),
    Case("acceptance/steps/all", "acceptance", ()),
    Case("acceptance/positions/run", "acceptance", options={"source": "positions"}),
    Case(
        "acceptance/positions/dataset-request",
        "acceptance",
        ("dataset",),
        per_request=True,
        options={"source": "positions"},
    ),
    # the per-prompt counts a regression diff compares (paired over dataset, prompt_id)
    Case("prompts/steps", "acceptance", ("dataset", "prompt_id")),
    Case(
        "prompts/positions", "acceptance", ("dataset", "prompt_id"), options={"source": "positions"}
    ),
    Case("calibration/exact/run", "calibration", options={"levels": None}),
    Case(
        "calibration/grid/n-request",
        "calibration",
        ("n",),
        per_request=True,
        options={"levels": 1000, "n_bins": 15},
    ),
    Case("calibration/prompt", "calibration", ("prompt_id",), options={"levels": 50}),
    Case("step_times/method-dataset", "step_times", STEP_TIME_BY),
    Case("step_times/run-request", "step_times", ("run_id",), per_request=True),
]


def in_process(root: Any, case: Case, *, statuses: tuple[str, ...] | None = None) -> pd.DataFrame:
    """The in-process counter table of ``case`` on the rows ``read_trace`` reads."""
    kwargs = {} if statuses is None else {"statuses": statuses}
    positions = read_trace(root, "positions", **kwargs)
    steps = read_trace(root, "steps", **kwargs)
    options = dict(case.options)
    if case.metric == "acceptance":
        if options.get("source", "steps") == "steps":
            return count_acceptance_from_steps(steps, by=case.by, per_request=case.per_request)
        return count_acceptance(positions, steps=steps, by=case.by, per_request=case.per_request)
    if case.metric == "calibration":
        keys = metric_keys("calibration", case.by, per_request=case.per_request)
        return count_calibration(
            positions,
            steps=steps,
            by=keys,
            n_bins=options.get("n_bins", 10),
            levels=options.get("levels", 1000),
        )
    return count_step_times(steps, by=case.by, per_request=case.per_request)


FLOATS = ("sum_score", "sum_score_sq", "sum_tokens", "sum_time", "sum_draft", "sum_verify")


def assert_same_counts(got: pd.DataFrame, want: pd.DataFrame, *, what: str = "") -> None:
    """Equal counter tables: the same columns and key rows, integer counts equal, float sums
    equal up to summation order (rtol 1e-12)."""
    assert list(got.columns) == list(want.columns), (what, list(got.columns), list(want.columns))
    keys = [c for c in want.columns if c not in FLOATS and not c.startswith("n_") and c != "count"]
    got = got.sort_values(keys, kind="stable").reset_index(drop=True)
    want = want.sort_values(keys, kind="stable").reset_index(drop=True)
    assert len(got) == len(want), (what, len(got), len(want))
    for name in want.columns:
        left, right = got[name].to_numpy(), want[name].to_numpy()
        if name in FLOATS:
            np.testing.assert_allclose(
                left.astype(float), right.astype(float), rtol=1e-12, err_msg=f"{what}: {name}"
            )
        elif name in ("bin_lo", "bin_hi", "level", "temperature"):
            # computed the same way (a division, the score itself): bit for bit
            np.testing.assert_array_equal(left.astype(float), right.astype(float), what)
        else:
            same = [a == b or (pd.isna(a) and pd.isna(b)) for a, b in zip(left, right, strict=True)]
            assert all(same), (what, name, got[name][~np.array(same)].head(), want[name].head())
