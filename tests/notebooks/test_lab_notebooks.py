"""Every notebook under papermill: it runs clean, and its recorded values are the analysis'.

The notebooks are executed once, by the real report builder (papermill, headless), on
the session's reference-engine runs on the zoo's tiny checkpoints (tests/reference_runs.py);
each test reads one executed notebook back and recomputes its numbers with
dsparklab.analysis on the same runs.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Sequence
from pathlib import Path

import nbformat
import numpy as np
import pandas as pd
import papermill as pm
import pytest
from lab_support import EXPECTED_NOTEBOOKS, TEST_PARAMETERS, assert_ran_clean, count_figures

from dsparklab import analysis as A
from dsparklab.lab.notebook import (
    HEADLESS_ENV,
    PLOTLY_MIMETYPE,
    load_published_verify_costs,
    load_runs,
    read_records,
)
from dsparklab.lab.published import DEFAULT_COST_PROFILES
from dsparklab.lab.resources import PUBLISHED_SPEEDUPS, cost_profile_file, published_file
from dsparklab.report import ReportResult
from tests.reference_runs import DATASETS, METHODS, NS

pytestmark = pytest.mark.notebooks

SPECULATIVE = [m for m in METHODS if m != "none"]


def executed(report: ReportResult, name: str) -> Path:
    (result,) = [nb for nb in report.notebooks if nb.name == name]
    assert result.ok, result.error
    return result.executed


def assert_frame_matches(
    recorded: list[dict], expected: pd.DataFrame, keys: Sequence[str], value: str
) -> None:
    """The recorded rows equal ``expected[keys + [value]]`` row for row (NaN == None)."""
    got = pd.DataFrame.from_records(recorded)
    want = expected[[*keys, value]].reset_index(drop=True)
    assert len(got) == len(want) > 0, (len(got), len(want))
    merged = want.merge(got, on=list(keys), how="outer", suffixes=("_want", "_got"), indicator=True)
    assert (merged["_merge"] == "both").all(), merged.loc[merged["_merge"] != "both"]
    for w, g in zip(merged[f"{value}_want"], merged[f"{value}_got"], strict=True):
        if w is None or (isinstance(w, float) and math.isnan(w)):
            assert g is None or (isinstance(g, float) and math.isnan(g)), (w, g)
        else:
            assert g == pytest.approx(float(w), rel=1e-9, abs=1e-12), (w, g)


REPORTED_BINS_SECTION = "Reliability as reported"


@pytest.fixture(scope="module")
def tables(runs_dir: Path):
    return load_runs(runs_dir, datasets=list(DATASETS), methods=SPECULATIVE, n_values=list(NS))


def test_every_notebook_is_in_the_report(report: ReportResult, notebooks: dict[str, Path]):
    assert sorted(notebooks) == sorted(EXPECTED_NOTEBOOKS)
    assert [nb.name for nb in report.notebooks] == sorted(notebooks)
    assert all(nb.ok for nb in report.notebooks), [nb.error for nb in report.notebooks]
    # the full tiny run set holds every input but source-reported reliability bins (only
    # an import has them, e.g. DeepSpec's metrics.json): no other section goes uncomputed
    expected = {nb.name: [] for nb in report.notebooks} | {
        "06_imported_and_live": [REPORTED_BINS_SECTION]
    }
    assert {nb.name: [x["section"] for x in nb.not_computed] for nb in report.notebooks} == (
        expected
    )


@pytest.mark.parametrize("name", EXPECTED_NOTEBOOKS)
def test_notebook_runs_clean(report: ReportResult, name: str):
    """No error output and nothing on stderr; parameters injected; figures shown."""
    nb = nbformat.read(executed(report, name), as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    injected = [c for c in nb.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and len(injected) == 1
    assert "N_BOOT = 50" in injected[0].source and "RUNS = " in injected[0].source
    assert_ran_clean(nb)
    assert count_figures(nb) >= 3


@pytest.mark.parametrize("name", EXPECTED_NOTEBOOKS)
def test_notebook_is_thin(notebooks: dict[str, Path], name: str):
    """STYLE: H1 title, setup, one parameters cell of UPPER_CASE literals, then only
    ``%%section`` cells (each records the values it computes, so a section the runs cannot
    give leaves the others' records); no def, no loops, short cells."""
    nb = nbformat.read(notebooks[name], as_version=4)
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    headings = [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "markdown"]
    assert headings[1] == "## 0 Setup"
    code = [c for c in nb.cells if c.cell_type == "code"]
    (params,) = [c for c in code if "parameters" in c.metadata.get("tags", [])]
    for node in ast.parse(params.source).body:
        assert isinstance(node, ast.Assign) and len(node.targets) == 1
        assert node.targets[0].id.isupper()
        ast.literal_eval(node.value)
    sections = code[code.index(params) + 1 :]
    assert sections and all(c.source.startswith("%%section ") for c in sections)
    assert any("nb.record(" in c.source for c in sections)
    for cell in code:
        body = cell.source.split("\n", 1)[1] if cell.source.startswith("%%") else cell.source
        tree = ast.parse(body)
        statement_lines = sum(
            n.end_lineno - n.lineno + 1
            for n in tree.body
            if not isinstance(n, (ast.Import, ast.ImportFrom))
        )
        assert statement_lines <= 10, cell.source
        banned = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.For, ast.While)
        assert not any(isinstance(n, banned) for n in ast.walk(tree))
    assert not any(c.get("outputs") for c in nb.cells if c.cell_type == "code"), "commit clean"


def test_explorer_records(report: ReportResult, tables):
    records = read_records(executed(report, "00_explorer"))
    assert records["n_runs"] == len(tables.runs) == 22
    lengths = A.compute_acceptance_length(
        tables.positions, steps=tables.steps, by=("method", "n", "dataset"), n_boot=0
    )
    assert_frame_matches(records["accept_len"], lengths, ["method", "n", "dataset"], "accept_len")
    by_position = A.compute_acceptance_by_position(
        tables.positions, steps=tables.steps, by=("method", "n", "dataset"), n_boot=0
    )
    assert_frame_matches(
        records["accept_rate"], by_position, ["method", "n", "dataset", "position"], "accept_rate"
    )


def test_explorer_static_figures_follow_the_first_controls(report: ReportResult):
    """Headless, the dashboard draws its three figures for the first dataset/method/n."""
    result = next(nb for nb in report.notebooks if nb.name == "00_explorer")
    assert result.figures == ["explorer_heatmap", "explorer_strip", "explorer_survival"]
    nb = nbformat.read(result.executed, as_version=4)
    widget_views = [
        o
        for c in nb.cells
        for o in c.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert widget_views == [], "no widget outputs without a front end"
    heatmap = next(
        o["data"][PLOTLY_MIMETYPE]
        for c in nb.cells
        for o in c.get("outputs", [])
        if PLOTLY_MIMETYPE in o.get("data", {})
        and o["data"][PLOTLY_MIMETYPE]["layout"]["meta"]["dsparklab_figure"] == "explorer_heatmap"
    )
    assert "(n = 3 outlined)" in heatmap["layout"]["title"]["text"]
    assert heatmap["data"][0]["name"] == "dspark · humaneval"


def test_acceptance_heatmaps_records(report: ReportResult, tables):
    records = read_records(executed(report, "01_acceptance_heatmaps"))
    by_position = A.compute_acceptance_by_position(
        tables.positions, steps=tables.steps, by=("method", "n", "dataset"), n_boot=0
    )
    keys = ["method", "n", "dataset", "position"]
    assert_frame_matches(records["accept_rate"], by_position, keys, "accept_rate")
    assert_frame_matches(records["survival"], by_position, keys, "survival")
    lengths = A.compute_acceptance_length(
        tables.positions, steps=tables.steps, by=("method", "n", "dataset"), n_boot=0
    )
    assert_frame_matches(records["accept_len"], lengths, ["method", "n", "dataset"], "accept_len")
    # by output depth and context: each step binned (the counts equal a recount from the
    # parquet: tests/unit/analysis/test_binned_acceptance.py)
    for column in ("depth", "context"):
        binned = pd.DataFrame(records[f"accept_len_by_{column}"])
        assert binned[f"{column}_bin"].notna().all() and binned[f"{column}_bin"].nunique() > 1
        assert set(binned["method"]) == {"dspark", "eagle3"}
        assert binned["accept_len"].between(1, binned["n"] + 1).all()


def test_window_scaling_records(report: ReportResult, tables):
    records = read_records(executed(report, "02_window_scaling"))
    scaling = A.compute_window_scaling(
        tables.steps, positions=tables.positions, by=("method", "dataset"), n_boot=0
    )
    keys = ["method", "dataset", "n"]
    assert_frame_matches(records["accept_len"], scaling, keys, "accept_len")
    model = A.compute_speedup_model(tables.steps, by=("method", "dataset"), n_boot=0)
    assert_frame_matches(records["speedup"], model, keys, "speedup")
    assert_frame_matches(records["speedup_model"], model, keys, "speedup_model")
    assert records["n_published_rows"] == len(pd.read_csv(published_file(PUBLISHED_SPEEDUPS))) == 20
    # projected on the default profiles: a published setup (DSpark only: its sourced costs)
    # and the lab's assumption (both drafters)
    published, assumed = DEFAULT_COST_PROFILES
    methods = sorted(set(tables.positions["method"]))
    ns = range(1, int(tables.positions["n"].max()) + 1)
    costs = pd.concat(
        [
            A.cost_table_from_published(
                load_published_verify_costs(),
                setup=published.removeprefix("published:"),
                methods=methods,
                ns=ns,
            ),
            A.cost_table_from_profile(
                json.loads(cost_profile_file(assumed).read_text()), methods=methods, ns=ns
            ),
        ]
    )
    projected = A.compute_projected_speedup(scaling, costs)
    recorded = pd.DataFrame(records["projected_speedup"])
    assert set(recorded["profile"]) == {published.replace(":", ": ", 1), assumed}
    assert set(recorded.loc[recorded["profile"] == assumed, "method"]) == {"dspark", "eagle3"}
    assert set(recorded.loc[recorded["profile"] != assumed, "method"]) == {"dspark"}
    for profile, part in projected.groupby("profile"):
        mine = recorded[recorded["profile"] == profile].to_dict("records")
        assert_frame_matches(mine, part, keys, "speedup")


def test_confidence_calibration_records(report: ReportResult, tables):
    records = read_records(executed(report, "03_confidence_calibration"))
    calibration = A.compute_calibration(
        tables.positions, steps=tables.steps, by=("method", "dataset")
    )
    keys = ["method", "dataset", "score", "position"]
    assert_frame_matches(records["ece"], calibration, keys, "ece")
    assert_frame_matches(records["auroc"], calibration, keys, "auroc")
    assert {r["method"] for r in records["ece"]} == {"dspark"}, "only DSpark has a confidence"
    adaptive = A.compute_adaptive_verification(
        tables.positions, steps=tables.steps, by=("method", "n")
    )
    assert_frame_matches(
        records["adaptive_tokens_per_step"], adaptive, ["method", "n", "tau"], "tokens_per_step"
    )


def test_markov_attribution_records(report: ReportResult, tables):
    records = read_records(executed(report, "04_markov_attribution"))
    pooled = A.compute_markov_attribution(
        tables.positions, steps=tables.steps, by=("method", "n"), per_position=False
    )
    for value in ("flip_rate", "bias_gain_lo", "bias_gain_hi"):
        assert_frame_matches(records[value], pooled, ["method", "n"], value)
    assert {r["method"] for r in records["flip_rate"]} == {"dspark"}


def test_regression_diagnosis_records(report: ReportResult, runs_dir: Path):
    """With BASE and NEW left empty, the runs decide: Eagle3 at its smallest window
    against its largest, on every dataset both hold."""
    records = read_records(executed(report, "05_regression_diagnosis"))
    assert records["comparison"] == ["eagle3 n=3", "eagle3 n=7"]
    base = load_runs(runs_dir, methods=["eagle3"], n_values=[3], baseline=False)
    new = load_runs(runs_dir, methods=["eagle3"], n_values=[7], baseline=False)
    sides = dict(base_steps=base.steps, new_steps=new.steps, n_boot=0)
    overall = A.compute_regression_diff(base.positions, new.positions, **sides)
    assert_frame_matches(records["accept_len_delta"], overall, ["dataset"], "delta")
    prompts = A.compute_regression_diff(base.positions, new.positions, level="prompt", **sides)
    worst = A.compute_worst_prompts(prompts, k=4)
    assert records["worst_prompts"] == worst["prompt_id"].tolist()
    by_position = A.compute_regression_diff(
        base.positions, new.positions, level="position", **sides
    )
    assert_frame_matches(
        records["position_delta"], by_position, ["dataset", "position", "metric"], "delta"
    )
    # the attribution is counted by DuckDB; in memory, from the steps with their baselines
    with_baselines = [load_runs(runs_dir, methods=["eagle3"], n_values=[n]) for n in (3, 7)]
    attribution = A.compute_speedup_attribution(*(r.steps for r in with_baselines), n_boot=0)
    assert_frame_matches(
        records["speedup_attribution"], attribution, ["dataset", "component"], "delta_log_speedup"
    )


@pytest.mark.parametrize("name", EXPECTED_NOTEBOOKS)
def test_exported_html_contains_every_figure(report: ReportResult, name: str):
    """Each figure shown is in the page (by its div id), saved as JSON, HTML and (PNG)."""
    result = next(nb for nb in report.notebooks if nb.name == name)
    html = result.html.read_text(encoding="utf-8")
    assert result.n_plotly_outputs == len(result.figures) >= 3
    assert html.count('class="plotly-graph-div"') == result.n_plotly_outputs
    for figure in result.figures:
        assert f'id="dsparklab-{figure}"' in html
        page = report.out / "figures" / name / f"{figure}.html"
        assert page in report.figures.html and page.is_file()
    assert html.count("Plotly.newPlot") >= result.n_plotly_outputs


def test_parameters_select_the_runs(
    runs_dir: Path, notebooks: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """Papermill parameters reach the notebook: one dataset and one method only."""
    monkeypatch.setenv(HEADLESS_ENV, "1")
    out = tmp_path / "01.ipynb"
    pm.execute_notebook(
        str(notebooks["01_acceptance_heatmaps"]),
        str(out),
        cwd=str(tmp_path),
        parameters={
            "RUNS": str(runs_dir),
            "DATASETS": ["prose"],
            "METHODS": ["eagle3"],
            "N_VALUES": [3, 7],
            **TEST_PARAMETERS,
        },
        progress_bar=False,
        kernel_name="python3",
    )
    records = read_records(out)
    rows = pd.DataFrame.from_records(records["accept_len"])
    assert set(zip(rows["method"], rows["n"], rows["dataset"], strict=True)) == {
        ("eagle3", 3, "prose"),
        ("eagle3", 7, "prose"),
    }
    tables = load_runs(runs_dir, datasets=["prose"], methods=["eagle3"], n_values=[3, 7])
    lengths = A.compute_acceptance_length(
        tables.positions, steps=tables.steps, by=("method", "n", "dataset"), n_boot=0
    )
    assert_frame_matches(records["accept_len"], lengths, ["method", "n", "dataset"], "accept_len")
    assert not (tmp_path / "figures").exists(), "OUT_DIR empty: nothing written"
    assert np.isfinite(rows["accept_len"]).all()
