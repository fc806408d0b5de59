"""Which n at which load, in the lab (issue 32), on a synthetic store (test data, never a
measurement) where a window that pays at one request in flight loses at four: notebook
02's load section and its schedule, notebook 05 comparing two loads, and the findings'
best n per load."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import papermill as pm
import pytest
from lab_support import TEST_PARAMETERS, assert_ran_clean
from lab_synth import write_synthetic_run

from dsparklab import analysis as A
from dsparklab.analysis.sql import aggregate_store
from dsparklab.lab.notebook import HEADLESS_ENV, read_records
from dsparklab.store.catalog import Catalog

LOADS = (1, 4)
NS = (1, 3, 6)


@pytest.fixture(scope="module")
def load_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("loads")
    for concurrency in LOADS:
        write_synthetic_run(
            root, method="none", n=0, dataset="humaneval", concurrency=concurrency, n_requests=8
        )
        for n in NS:
            write_synthetic_run(
                root, method="eagle3", n=n, dataset="humaneval", concurrency=concurrency,
                n_requests=8,
            )  # fmt: skip
    return root


def _execute(notebook: Path, out: Path, **parameters: object) -> dict:
    pm.execute_notebook(
        str(notebook),
        str(out),
        cwd=str(out.parent),
        parameters={**parameters, **TEST_PARAMETERS},
        progress_bar=False,
        kernel_name="python3",
    )
    import nbformat

    assert_ran_clean(nbformat.read(out, as_version=4))
    return read_records(out)


def _by_load(store: Path) -> pd.DataFrame:
    counts = aggregate_store(
        store, metric="step_times", by=("method", "concurrency"), per_request=True
    )
    return A.compute_window_scaling(
        counts, by=("method", "concurrency"), n_boot=TEST_PARAMETERS["N_BOOT"]
    )


def test_window_scaling_schedules_the_n_of_each_load(
    load_store: Path, notebooks: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(HEADLESS_ENV, "1")
    records = _execute(notebooks["02_window_scaling"], tmp_path / "02.ipynb", RUNS=str(load_store))
    schedule = pd.DataFrame.from_records(records["schedule"]).set_index("concurrency")
    expected = A.compute_speculation_schedule(_by_load(load_store), by=("method",))
    assert schedule["n"].to_dict() == expected.set_index("concurrency")["n"].to_dict()
    # the wide window fills the batch: the load of four takes a smaller n than one
    assert schedule.loc[1, "n"] > schedule.loc[4, "n"] >= 1, schedule
    # why: verifying n + 1 tokens costs more target-only steps as the batch fills
    costs = pd.DataFrame.from_records(records["costs_by_load"]).set_index(["concurrency", "n"])
    assert costs.loc[(4, 6), "verify_cost"] > costs.loc[(1, 6), "verify_cost"] + 0.5, costs
    # every synthetic step ran its whole load, so by batch size is by load, number for number
    keys, values = ["method", "concurrency", "n"], ["draft_cost", "verify_cost"]
    by_load = costs.reset_index().set_index(keys).sort_index()[values]
    by_batch = pd.DataFrame.from_records(records["costs_by_batch_size"])
    by_batch = by_batch.rename(columns={"batch_size": "concurrency"}).set_index(keys).sort_index()
    pd.testing.assert_frame_equal(by_batch[values], by_load, check_exact=False, rtol=1e-9)


def test_regression_diagnosis_compares_two_loads(
    load_store: Path, notebooks: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """BASE and NEW select one window at two loads; each is measured against the baseline
    at its own load, and the attribution's parts sum to the change of log speedup."""
    monkeypatch.setenv(HEADLESS_ENV, "1")
    base = {"method": "eagle3", "n": 3, "concurrency": 1}
    new = {"method": "eagle3", "n": 3, "concurrency": 4}
    records = _execute(
        notebooks["05_regression_diagnosis"],
        tmp_path / "05.ipynb",
        RUNS=str(load_store),
        BASE=base,
        NEW=new,
    )
    parts = pd.DataFrame.from_records(records["speedup_attribution"])
    scaling = _by_load(load_store).set_index(["concurrency", "n"])
    change = math.log(scaling.loc[(4, 3), "speedup"] / scaling.loc[(1, 3), "speedup"])
    assert parts["delta_log_speedup"].sum() == pytest.approx(change, rel=1e-6)
    largest = parts.loc[parts["delta_log_speedup"].abs().idxmax()]
    assert largest["component"] == "verify" and largest["delta_log_speedup"] < 0, parts


def test_findings_give_the_best_n_per_load(load_store: Path, tmp_path: Path) -> None:
    from dsparklab.report.findings import compute_findings

    findings = compute_findings(Catalog.of(load_store), tmp_path, n_boot=50)
    best = findings.best_frame.set_index("concurrency")
    assert sorted(best.index) == list(LOADS)
    assert best.loc[1, "best_n"] > best.loc[4, "best_n"]
    assert {row["concurrency"] for row in findings.best_n} == set(LOADS)
    which = next(h for h in findings.headlines if h["title"] == "Which n?")
    assert "at 1 in flight" in which["text"] and "at 4 in flight" in which["text"], which


def test_the_schedule_command_writes_the_notebooks_schedule(load_store: Path, tmp_path: Path):
    """`dsparklab schedule` on the load store: vLLM's keys on stdout, each load's choice on
    stderr, and the --out document with every choice's interval and whether it pays."""
    import json

    from typer.testing import CliRunner

    from dsparklab.cli.app import app

    out = tmp_path / "schedule.json"
    args = ["schedule", str(load_store), "--method", "eagle3", "--n-boot", "50", "--out", str(out)]
    result = CliRunner().invoke(app, [*args, "--max-batch", "8"])
    assert result.exit_code == 0, result.output
    plan = A.compute_speculation_schedule(
        A.compute_window_scaling(
            aggregate_store(
                load_store, metric="step_times", by=("method", "concurrency"), per_request=True
            ),
            by=("method", "concurrency"),
            n_boot=50,
        ),
        by=("method",),
    )
    config = A.schedule_config(plan, max_batch=8)
    assert json.loads(result.stdout.splitlines()[0]) == config
    document = json.loads(out.read_text())
    assert document["speculative_config"] == config
    assert [c["n"] for c in document["choices"]] == plan["n"].tolist()
    assert [c["pays"] for c in document["choices"]] == plan["pays"].tolist()


def test_the_schedule_command_says_where_nothing_pays(tmp_path: Path):
    """Eight in flight, where every window is measurably slower: exit 2 in one line, after
    each load's choice and why (never an n = 0 the server would still draft for)."""
    import subprocess
    import sys

    root = tmp_path / "runs"
    write_synthetic_run(root, method="none", n=0, dataset="humaneval", concurrency=8, n_requests=8)
    for n in (1, 3):
        write_synthetic_run(
            root, method="eagle3", n=n, dataset="humaneval", concurrency=8, n_requests=8
        )
    done = subprocess.run(
        [sys.executable, "-c", "from dsparklab.cli.app import main; main()", "schedule"]
        + [str(root), "--method", "eagle3", "--n-boot", "50"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""  # no config to serve
    assert "(measured at concurrency 8): n = 1" in done.stderr
    assert "target-only is faster here" in done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "error: speculation pays at no measured load: serve without a speculative config"
    )
