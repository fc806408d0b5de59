"""notebooks/06_imported_and_live on a mixed run set: token-level, imported and live runs.

The run set: synthetic token-level runs (lab_synth), every importer fixture
(tests/unit/importers/fixtures, in the tools' own shapes) imported with ``dsparklab
import``, and a live run made of three scrapes. The notebook must run clean (no error, no
stderr), show its figures, and record the same values the analysis functions give on the
same tables; and the live view must follow a run that grows while it watches.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pandas as pd
import papermill as pm
import pytest
from lab_support import assert_ran_clean, count_figures
from lab_synth import write_synthetic_runs

import dsparklab.analysis as A
from dsparklab.importers import import_files
from dsparklab.lab.notebook import HEADLESS_ENV, load_any_runs, read_records
from dsparklab.store.layout import table_location
from dsparklab.widgets import LiveView, latest_live_run

FIXTURES = Path(__file__).parents[1] / "unit" / "importers" / "fixtures"
IMPORTS = {
    "vllm-metrics": ["vllm_metrics_before.prom", "vllm_metrics_after.prom"],
    "vllm-bench": ["vllm_bench_result.json"],
    "vllm-request": ["vllm_request_detailed.json"],
    "sglang": ["sglang_generate.jsonl"],
    "specdec-bench": ["specdec_acceptance_rate.json", "specdec_speculation_profile.json"],
    "deepspec": ["deepspec_metrics.json"],
}


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mixed")
    write_synthetic_runs(root, ns=(3, 5), n_requests=3, tokens_per_request=24)
    for fmt, names in IMPORTS.items():
        import_files(fmt, [FIXTURES / n for n in names], root, method=None, dataset=fmt)
    # DeepSpec with positions no proposal offered: rates only (the full-block one has counts)
    import_files("deepspec", [FIXTURES / "deepspec_metrics_short.json"], root, dataset="short")
    import_files(
        "vllm-metrics",
        [FIXTURES / "vllm_metrics_before.prom", FIXTURES / "vllm_metrics_after.prom", _third(root)],
        root,
        method="eagle3",
        dataset="live",
    )
    return root


def _third(root: Path) -> Path:
    """A later scrape: the 'after' counters of engine 0 doubled (more traffic)."""
    lines = []
    for line in (FIXTURES / "vllm_metrics_after.prom").read_text().splitlines():
        if line.startswith("vllm:spec_decode") and "_total" in line and 'engine="0"' in line:
            name, value = line.rsplit(" ", 1)
            line = f"{name} {2 * float(value)}"
        lines.append(line)
    path = root.parent / "third.prom"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def executed(mixed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("nb") / "06.ipynb"
    notebook = Path(__file__).parents[2] / "notebooks" / "06_imported_and_live.ipynb"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(HEADLESS_ENV, "1")
        pm.execute_notebook(
            str(notebook),
            str(out),
            cwd=str(out.parent),
            parameters={"RUNS": str(mixed), "N_BOOT": 50},
            progress_bar=False,
            kernel_name="python3",
        )
    return out


def test_runs_clean_with_figures(executed: Path) -> None:
    nb = nbformat.read(executed, as_version=4)
    assert_ran_clean(nb)
    assert count_figures(nb) >= 6


def test_records_match_the_analysis(executed: Path, mixed: Path) -> None:
    records = read_records(executed)
    runs = load_any_runs(mixed)
    assert records["n_runs"] == len(runs.runs)
    lengths = A.compute_acceptance_length(
        runs.positions,
        steps=runs.steps,
        counters=runs.counters,
        totals=runs.totals,
        by=("method", "n", "dataset"),
        n_boot=0,
    )
    mine = pd.DataFrame.from_records(records["accept_len"])
    merged = mine.merge(lengths, on=["method", "n", "dataset", "definition"], suffixes=("", "_lab"))
    assert len(merged) == len(lengths) == len(mine)
    assert (merged["accept_len"] - merged["accept_len_lab"]).abs().max() < 1e-12
    granularities = set(runs.runs["granularity"])
    assert granularities == {"token", "step", "request", "aggregate", "interval"}
    coverage = pd.DataFrame.from_records(records["coverage"])
    speedup = coverage[coverage["analysis"] == "speedup"].set_index("run_id")["available"]
    token = set(runs.runs.loc[runs.runs["granularity"] == "token", "run_id"])
    assert all(speedup[r] for r in token) and not any(
        speedup[r] for r in set(speedup.index) - token
    )
    assert records["live_intervals"] == 2
    survival = pd.DataFrame.from_records(records["survival"])
    assert set(survival["source"]) == {"counts", "reported rates"}
    # DeepSpec's reliability bins, drawn as reported: their ECE is the file's at each position
    reported = pd.DataFrame.from_records(records["reported_ece"])
    keys = ["method", "n", "dataset", "score", "position"]
    written = runs.calibration[runs.calibration["bin"].isna() & (runs.calibration["count"] > 0)]
    merged = reported.merge(written[[*keys, "ece"]], on=keys, suffixes=("", "_file"))
    assert len(merged) == len(written) == len(reported) > 0
    assert set(merged["dataset"]) == {"deepspec", "short"}
    assert (merged["ece"] - merged["ece_file"]).abs().max() < 1e-12


def test_live_view_follows_a_growing_run(mixed: Path, tmp_path: Path) -> None:
    """A run that gains an interval while the view is open: refresh() picks it up."""
    import shutil

    run = latest_live_run(mixed)
    assert run is not None
    shutil.copytree(mixed, tmp_path / "live")  # the run's store: its tables lie beside _runs
    copy = tmp_path / "live" / run.relative_to(mixed)
    meta = json.loads((copy / "run.json").read_text())
    meta["status"] = "running"
    (copy / "run.json").write_text(json.dumps(meta))
    counters_parts = sorted(Path(table_location(copy, "counters").path).glob("part-*.parquet"))
    totals_parts = sorted(Path(table_location(copy, "totals").path).glob("part-*.parquet"))
    # hide the second interval's rows, as if the watch had not written them yet
    import pyarrow.parquet as pq

    full_c, full_t = pq.read_table(counters_parts[0]), pq.read_table(totals_parts[0])
    first_c = full_c.filter(full_c.column("interval").to_numpy() == 0)
    first_t = full_t.filter(full_t.column("interval").to_numpy() == 0)
    pq.write_table(first_c, counters_parts[0])
    pq.write_table(first_t, totals_parts[0])
    view = LiveView(copy, refresh_s=0.1)
    assert view.widget is not None  # builds the figure widgets and the explorer
    assert view.intervals == 1 and view.explorer is not None
    before = view.figure_widgets["accept_len_over_time"].data[0].x
    pq.write_table(full_c, counters_parts[0])
    pq.write_table(full_t, totals_parts[0])
    meta["status"] = "complete"
    meta["stop_reason"] = "interrupted (Ctrl-C or SIGTERM)"
    (copy / "run.json").write_text(json.dumps(meta))
    assert view.refresh() and view.intervals == 2 and view.refreshes == 1
    after = view.figure_widgets["accept_len_over_time"].data[0].x
    assert len(after) == len(before) + 1
    assert "interrupted" in view.status.value
    assert view.explorer.updates["heatmap"] == 1
