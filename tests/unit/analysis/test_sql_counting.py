"""The SQL counting stage on DuckDB equals the in-process counters on every store shape.

One store holds every shape the contract allows (counting_cases.py); it is read as
TraceWriter wrote it (many small parts per run) and compacted into the table layout (large
sorted files), which DuckDB reads with its own parquet reader; a store it cannot read so
(one run as the root; an object store) it scans as the store's pyarrow dataset. Spark runs
the same query texts in tests/spark; DuckDB over an S3 store in
tests/fleet/test_counting_on_s3.py.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from counting_cases import CASES, Case, assert_same_counts, in_process, write_store

from dsparklab.analysis import (
    acceptance_stats,
    aggregate_store,
    compute_regression_diff,
    count_frames,
)
from dsparklab.analysis.sql import COUNTERS, open_engine, render, select_runs
from dsparklab.errors import DSparkLabError, UnknownMethodError
from dsparklab.store import hive_table, read_trace
from dsparklab.store.compact import compact_store
from tests.oracles import count_acceptance, count_calibration

IMPORTED = ["import/vllm-bench/gsm8k", "import/sglang/gsm8k"]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    written = write_store(str(tmp_path_factory.mktemp("written")))
    table = tmp_path_factory.mktemp("table")
    compact_store(written, out=table)
    return {"written": written, "table": str(table)}


@pytest.fixture(scope="module")
def expected(stores: dict[str, str]) -> dict[str, pd.DataFrame]:
    return {case.name: in_process(stores["written"], case) for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_duckdb_counts_equal_the_in_process_counts(
    stores: dict[str, str], expected: dict[str, pd.DataFrame], case: Case
) -> None:
    for layout, root in stores.items():
        got = aggregate_store(root, **case.store_args())
        assert_same_counts(got, expected[case.name], what=f"{layout}: {case.name}")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_frames_in_memory_count_as_the_store_does(
    stores: dict[str, str], expected: dict[str, pd.DataFrame], case: Case
) -> None:
    """count_frames runs the same query texts by DuckDB over the rows read_trace returns:
    the table equals the numpy oracle's (and so aggregate_store's)."""
    root = stores["written"]
    args = case.store_args()
    source = args.pop("source", "steps")
    steps = read_trace(root, "steps")
    positions = read_trace(root, "positions") if case.metric == "calibration" else None
    if source == "positions":
        positions = read_trace(root, "positions")
    got = count_frames(positions=positions, steps=steps, **args)
    assert_same_counts(got, expected[case.name], what=f"frames: {case.name}")


def _views(root: str) -> dict[str, str]:
    runs, _ = select_runs(root)
    with open_engine("duckdb", root, runs, COUNTERS["acceptance"].tables) as engine:
        views = engine.query("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal")
    return dict(zip(views["view_name"], views["sql"], strict=True))


def test_the_table_layout_is_read_natively(stores: dict[str, str]) -> None:
    """DuckDB's own parquet reader over a store in the table layout; a store it cannot read
    so (here one run given as the root) through the store's pyarrow dataset."""
    table = stores["table"]
    assert hive_table(table, "positions") is not None
    assert "read_parquet" in _views(table)["positions"]
    # run ids hold '/', escaped in the partition names: read back unescaped
    runs, _ = select_runs(table)
    with open_engine("duckdb", table, runs, ("positions",)) as engine:
        ids = set(engine.query("SELECT DISTINCT run_id FROM positions")["run_id"])
    assert ids == set(read_trace(table, "positions")["run_id"]), ids

    (run,) = runs.loc[runs["run_id"] == "ref/humaneval/dspark-n4-adaptive", "path"]
    assert hive_table(run, "positions") is None
    assert "read_parquet" not in _views(run)["positions"]
    for case in CASES:
        got = aggregate_store(run, **case.store_args())
        assert_same_counts(got, in_process(run, case), what=f"one run: {case.name}")


def test_runs_selected_by_status_and_filter(stores: dict[str, str]) -> None:
    written = stores["written"]
    statuses = ("complete",)
    filters = {"method": ["dspark", "eagle3"], "dataset": "gsm8k"}
    positions = read_trace(written, "positions", statuses=statuses, filters=filters)
    steps = read_trace(written, "steps", statuses=statuses, filters=filters)
    assert "ref/gsm8k/dspark-n3-crashed" not in set(steps["run_id"])  # failed: left out

    for root in stores.values():
        got = aggregate_store(
            root,
            by="run_id",
            statuses=statuses,
            filters=filters,
            source="positions",
            per_request=False,
        )
        want = count_acceptance(positions, steps=steps, by="run_id", per_request=False)
        assert_same_counts(got, want, what=f"acceptance {root}")
        got = aggregate_store(
            root,
            metric="calibration",
            by="n",
            statuses=statuses,
            filters=filters,
            levels=None,
            per_request=False,
        )
        want = count_calibration(positions, steps=steps, by="n", levels=None)
        assert_same_counts(got, want, what=f"calibration {root}")


def test_runs_without_the_rows_contribute_nothing(stores: dict[str, str]) -> None:
    """Imported aggregate and request counters hold no steps or positions; a step-granularity
    run counts from its steps only; baselines draft nothing."""
    for root in stores.values():
        for metric in ("acceptance", "calibration", "step_times"):
            for source in ("steps", "positions"):
                only = aggregate_store(
                    root, metric=metric, source=source, filters={"run_id": IMPORTED}
                )
                assert only.empty, (root, metric, source, only)
        stepwise = {"run_id": "import/vllm/steps"}
        assert len(aggregate_store(root, filters=stepwise, per_request=False)) == 3  # 0..2
        assert aggregate_store(root, filters=stepwise, source="positions").empty
        baselines = {"method": "none"}
        assert aggregate_store(root, filters=baselines).empty
        flat = aggregate_store(root, metric="step_times", filters=baselines, per_request=False)
        assert len(flat) == 2


def test_per_prompt_counts_are_what_the_regression_diff_compares(stores: dict[str, str]) -> None:
    """compute_regression_diff(level="prompt") compares each prompt's AL over its reached
    rows: the same number as AL from the per-prompt acceptance counts."""
    written = stores["written"]
    sides = {"base": {"method": "eagle3", "n": 4}, "new": {"method": "dspark", "n": 3}}
    frames = {
        side: (read_trace(written, "positions", filters=f), read_trace(written, "steps", filters=f))
        for side, f in sides.items()
    }
    diff = compute_regression_diff(
        frames["base"][0],
        frames["new"][0],
        base_steps=frames["base"][1],
        new_steps=frames["new"][1],
        level="prompt",
        n_boot=0,
    ).set_index(["dataset", "prompt_id"])
    for side, selection in sides.items():
        counts = aggregate_store(
            stores["table"],
            by=("dataset", "prompt_id"),
            filters=selection,
            source="positions",
            per_request=False,
        )
        for (dataset, prompt), cells in counts.groupby(["dataset", "prompt_id"]):
            reached = np.zeros(5)
            accepted = np.zeros(5)
            reached[cells["position"]] = cells["n_reached"]
            accepted[cells["position"]] = cells["n_accepted"]
            (length,) = acceptance_stats(reached[None], accepted[None])[2]
            assert diff.loc[(dataset, prompt), side] == pytest.approx(length), (side, prompt)


def test_one_query_text_per_counter() -> None:
    """The texts name only the three relations and plain SQL both engines parse."""
    for name in COUNTERS:
        text = render(name, keys=("method", "n", "request_id"), n_positions=4)
        assert "FROM runs" not in text and "JOIN runs r" in text
        assert '"' not in text and "`" not in text and "::" not in text
    text = render("calibration", keys=(), n_positions=3, score="prefix_confidence", levels=None)
    # the prefix product multiplied left to right, as numpy's running product
    assert "k.c0 * k.c1 * k.c2 AS pp2" in text
    with pytest.raises(DSparkLabError, match="step_times needs"):
        render("step_times", keys=())


def test_spark_needs_the_table_layout(stores: dict[str, str]) -> None:
    """Checked before any Spark session starts: a one-line error naming the command (here
    for one run given as the root, which no engine reads as a table directory)."""
    runs, _ = select_runs(stores["table"])
    with pytest.raises(DSparkLabError, match=r"run `dsparklab compact ") as err:
        aggregate_store(runs["path"].iloc[0], engine="spark")
    assert "\n" not in str(err.value)
    with pytest.raises(UnknownMethodError, match="valid engines are"):
        aggregate_store(stores["table"], engine="polars")


def test_an_empty_selection_is_an_empty_table(stores: dict[str, str]) -> None:
    for root in stores.values():
        empty = aggregate_store(root, metric="step_times", filters={"method": "medusa"})
        assert empty.empty
        assert list(empty.columns)[-5:] == [
            "n_steps",
            "sum_tokens",
            "sum_time",
            "sum_draft",
            "sum_verify",
        ]


def test_only_the_generation_run_json_names_is_counted(
    stores: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A compaction killed before its commit leaves parts of the next generation beside the
    current ones: the native read takes the parts dsparklab lists, never both."""
    root = tmp_path_factory.mktemp("killed") / "store"
    shutil.copytree(stores["table"], root)
    for table in ("positions", "steps"):
        for part in sorted(root.glob(f"{table}/**/part-c001-*.parquet")):
            shutil.copy(part, part.with_name(part.name.replace("c001", "c002")))
    assert hive_table(root, "positions") is not None
    for case in CASES:
        if case.metric != "calibration":
            assert_same_counts(
                aggregate_store(root, **case.store_args()),
                aggregate_store(stores["table"], **case.store_args()),
                what=case.name,
            )


def test_duckdb_settings_change_no_count(
    stores: dict[str, str],
    expected: dict[str, pd.DataFrame],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One thread and a memory limit (past which DuckDB spills, below the system's temporary
    directory rather than the working directory's .tmp) give the same counters."""
    monkeypatch.chdir(tmp_path)
    case = next(c for c in CASES if c.name == "calibration/exact/run")
    got = aggregate_store(stores["table"], threads=1, memory_limit="64MB", **case.store_args())
    assert_same_counts(got, expected[case.name], what=case.name)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("counter", ["acceptance", "calibration"])
def test_without_adaptive_verification_a_window_finds_the_reached_rows(
    stores: dict[str, str], counter: str
) -> None:
    """Where no step verified fewer positions than it drafted, reached rows are found by a
    window over each step (no join with the steps table) and the counts are the join's;
    with adaptive verification the window would count unverified rows as reached, so
    aggregate_store asks the steps first (UNVERIFIED_STEPS)."""
    from dsparklab.analysis.sql.queries import UNVERIFIED_STEPS

    runs, _ = select_runs(stores["table"])
    keys = ["run_id"]
    kept = runs[runs["method"] != "none"]
    for adaptive in (False, True):
        chosen = kept[kept["run_id"].str.endswith("-adaptive") == adaptive]
        with open_engine("duckdb", stores["table"], chosen, COUNTERS[counter].tables) as engine:
            unverified = int(engine.query(UNVERIFIED_STEPS)["n"].iloc[0])
            texts = [
                render(counter, keys=keys, n_positions=7, all_verified=window)
                for window in (False, True)
            ]
            counts = [engine.query(text) for text in texts]
        counts = [c.sort_values(list(c.columns)).reset_index(drop=True) for c in counts]
        assert (unverified > 0) == adaptive and len(counts[0])
        if adaptive:
            assert not counts[0].equals(counts[1]), "the window ignores num_verified"
        else:
            pd.testing.assert_frame_equal(counts[0], counts[1], check_dtype=False)
    text = render(counter, keys=keys, n_positions=7, all_verified=True)
    assert "OVER (PARTITION BY" in text and "LEFT JOIN steps" not in text
    assert "LEFT JOIN steps" in render(counter, keys=["prompt_id"], all_verified=True)
