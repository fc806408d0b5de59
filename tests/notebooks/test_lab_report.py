"""The report builder: offline pages, figures, index with provenance, failures, the CLI."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from lab_support import TEST_PARAMETERS
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook
from typer.testing import CliRunner

from dsparklab.cli.app import app
from dsparklab.lab.notebook import read_records
from dsparklab.lab.resources import notebooks_dir
from dsparklab.lab.server import LOOPBACK, lab_command
from dsparklab.report import ReportError, ReportResult, build_report, remote_resources
from dsparklab.report.figures import PLOTLYJS_NAME, find_chromium
from dsparklab.store import list_runs, read_run_json
from tests.conftest import copy_run

pytestmark = pytest.mark.notebooks

_LINK = re.compile(r"""(?:href|src)="([^"#?]+)["#?]""")


def test_every_page_opens_offline(report: ReportResult):
    pages = [report.index, *(nb.html for nb in report.notebooks), *report.figures.html]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert remote_resources(text) == [], page
        assert not re.search(r"<script[^>]+src=[\"']https?:", text, re.I), page
    plotlyjs = report.out / "figures" / PLOTLYJS_NAME
    assert plotlyjs.is_file() and plotlyjs.stat().st_size > 1_000_000
    for page in report.figures.html:
        assert re.search(r"<script[^>]* src=\"../plotly.min.js\"", page.read_text(encoding="utf-8"))
    notebook_page = report.notebooks[0].html.read_text(encoding="utf-8")
    assert "Plotly.newPlot" in notebook_page and "plotly.js v" in notebook_page.lower()


def test_index_links_resolve_and_carry_provenance(report: ReportResult):
    text = report.index.read_text(encoding="utf-8")
    links = [link for link in _LINK.findall(text) if not link.startswith(("http", "mailto"))]
    assert len(links) >= 6 + 2 * len(report.figures.html)
    for link in links:
        assert (report.out / link).exists(), link
    runs = list_runs(report.runs)
    for run_id in runs["run_id"]:
        assert f"<td>{run_id}</td>" in text
    target = read_run_json(runs["path"].iloc[0])["target"]
    assert target["name"] == "tiny-target" and target["content_hash"].startswith("sha256:")
    short = target["content_hash"].split(":", 1)[1][:12]
    assert f"tiny-target @{short}" in text, "target name @ content hash"
    assert set(runs["engine"]) == {"reference"}, "real reference-engine runs"
    assert text.count('class="ok"') == len(report.notebooks)


def test_pngs_where_chromium_is_found(report: ReportResult):
    if find_chromium() is None:
        assert report.figures.png == [] and "no Chrome/Chromium" in report.figures.png_message
        return
    assert report.figures.png_message == ""
    assert len(report.figures.png) == len(report.figures.html) >= 20
    for png in report.figures.png:
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000


def test_report_json(report: ReportResult):
    meta = json.loads((report.out / "report.json").read_text())
    assert meta["inputs"]["runs"].startswith("sha256:")
    assert meta["parameters"] == TEST_PARAMETERS
    assert [nb["name"] for nb in meta["notebooks"]] == [nb.name for nb in report.notebooks]
    assert all(nb["ok"] for nb in meta["notebooks"])
    assert meta["provenance"]["packages"]["papermill"] != "not installed"
    # the findings as records: every headline with the facts its sentences are written from
    findings = meta["findings"]
    assert findings["run_sets"] == ["tiny/reference"]
    titles = [h["title"] for h in findings["headlines"]]
    assert titles[:3] == [
        "Did speculation pay, and where did the time go?",
        "Which n?",
        "Where does the drafter lose its tokens?",
    ]
    assert all(h["text"] and h["facts"] for h in findings["headlines"]), titles
    assert findings["tables"]["windows"] and findings["tables"]["acceptance"]


def test_pages_print_no_raw_records(report: ReportResult):
    """Recorded values stay in the notebooks' outputs (read back above), never printed as
    JSON under a figure (``accept_len = [{"method": ...``)."""
    raw = re.compile(r"\b[a-z_][\w.-]* = [\[{]")
    code = re.compile(r"<(script|style)\b.*?</\1>", re.S)
    for nb in report.notebooks:
        assert read_records(nb.executed)
        assert nb.html is not None
        page = code.sub(" ", nb.html.read_text(encoding="utf-8"))
        shown = html.unescape(re.sub(r"<[^>]+>", " ", page))
        assert not raw.search(shown), (nb.name, raw.search(shown))


def _tiny_notebook(body: str) -> nbformat.NotebookNode:
    cells = [
        new_markdown_cell("# tiny"),
        new_code_cell("import dsparklab.lab.notebook as nb\nFRONT_END = nb.setup()"),
        new_code_cell('RUNS = ""\nOUT_DIR = ""'),
        new_code_cell(body),
    ]
    cells[2].metadata["tags"] = ["parameters"]
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    return nb


def test_a_failing_notebook_is_reported_and_the_rest_still_built(runs_dir: Path, tmp_path: Path):
    notebooks = tmp_path / "nbs"
    notebooks.mkdir()
    nbformat.write(
        _tiny_notebook('nb.record("runs", str(nb.resolve_runs(RUNS)))'), notebooks / "00_good.ipynb"
    )
    nbformat.write(
        _tiny_notebook('raise ValueError("broken on purpose")'), notebooks / "01_bad.ipynb"
    )
    with pytest.raises(ReportError, match=r"1 of 2 notebooks failed: 01_bad: ValueError"):
        build_report(runs_dir, tmp_path / "out", notebooks_dir=notebooks, png=False, progress=False)
    index = (tmp_path / "out" / "index.html").read_text()
    assert "failed: ValueError: broken on purpose" in index
    assert (tmp_path / "out" / "00_good.html").is_file()
    bad = (tmp_path / "out" / "01_bad.html").read_text()
    assert "broken on purpose" in bad, "the exported page shows the traceback"


def test_cli_report_one_notebook(runs_dir: Path, tmp_path: Path):
    result = CliRunner().invoke(
        app,
        [
            "report",
            "--runs",
            str(runs_dir),
            "--out",
            str(tmp_path / "r"),
            "--notebook",
            "04_markov_attribution",
            "--param",
            "N_BOOT=20",
            "--no-png",
        ],
    )
    assert result.exit_code == 0, result.output
    # the notebook's three figures, and the index's findings figures beside them (survival
    # beside published curves; the learning curve when the zoo's cards carry one)
    figures = tmp_path / "r" / "figures"
    assert len(list((figures / "04_markov_attribution").glob("*.html"))) == 3
    findings = len(list((figures / "findings").glob("*.html")))
    assert findings >= 1
    assert "report: " in result.output
    assert f"1 notebooks, {3 + findings} figures, 0 PNG" in result.output
    assert (tmp_path / "r" / "04_markov_attribution.html").is_file()
    unknown = CliRunner().invoke(
        app,
        ["report", "--runs", str(runs_dir), "--out", str(tmp_path / "x"), "--notebook", "99_nope"],
    )
    assert unknown.exit_code != 0 and "99_nope" in str(unknown.exception or unknown.output)


def test_lab_command_is_loopback_with_a_token():
    command = lab_command(port=8899, token="abc123", root_dir=notebooks_dir())
    assert f"--ServerApp.ip={LOOPBACK}" in command
    assert "--IdentityProvider.token=abc123" in command
    assert "--ServerApp.open_browser=False" in command
    assert any(
        arg.startswith("--ServerApp.root_dir=") and arg.endswith("notebooks") for arg in command
    )


def test_index_opens_with_findings_read_back_from_the_analysis(report: ReportResult):
    """The findings table's speedups are compute_window_scaling's on the report's runs (the
    test report reads only its tiny runs: SHIPPED is off)."""
    from dsparklab.analysis import compute_window_scaling
    from dsparklab.lab.notebook import load_runs

    index = report.index.read_text(encoding="utf-8")
    assert index.index('id="findings"') < index.index("<h2>Notebooks</h2>")
    assert "Findings (tiny/reference)" in index and 'id="seeds-answer"' in index
    assert 'id="acceptance"' in index
    # only the imported-bins section (no import among the tiny runs) is listed uncomputed
    assert index.count("section(s) not computed") == 1
    assert "Reliability as reported" in index
    runs = load_runs(report.runs)
    scaling = compute_window_scaling(runs.steps, by=("method", "dataset"), n_boot=0)
    for row in scaling[scaling["method"] != "none"].to_dict("records"):
        assert f"<td>{row['speedup']:.2f}x (" in index, row
    page = report.out / "figures" / "findings" / "survival_vs_published.html"
    assert "published: " in page.read_text(encoding="utf-8")
    # report.json's facts are the analysis's numbers: the speedup at each best window is
    # compute_window_scaling's, and the loss headline's first-bin ALs (where acceptance
    # falls with depth and context) are notebook 01's recorded ones (the counts:
    # tests/unit/analysis/test_binned_acceptance.py)
    meta = json.loads((report.out / "report.json").read_text())
    facts = {h["title"].split(",")[0]: h["facts"] for h in meta["findings"]["headlines"]}
    paid = [f for f in facts["Did speculation pay"] if "best_n" in f]
    assert paid
    for fact in paid:
        row = scaling[
            (scaling["method"] == fact["method"])
            & (scaling["dataset"] == fact["dataset"])
            & (scaling["n"] == fact["best_n"])
        ]
        assert fact["speedup"] == pytest.approx(float(row["speedup"].iloc[0]), rel=1e-9), fact
    page_01 = next(nb.executed for nb in report.notebooks if nb.name == "01_acceptance_heatmaps")
    for column in ("depth", "context"):
        recorded = pd.DataFrame(read_records(page_01)[f"accept_len_by_{column}"])
        top = recorded[recorded["n"] == recorded.groupby("method")["n"].transform("max")]
        told = [(k, part) for k, part in top.groupby(["method", "dataset"]) if len(part) > 1]
        assert told, f"no run spans two {column} bins"
        said = {
            (f["method"], f["dataset"]): f
            for f in facts["Where does the drafter lose its tokens?"]
            if f.get("bins") == f"{column}_bin"
        }
        for key, part in told:
            first = part.sort_values(f"{column}_bin").iloc[0]
            assert said[key]["n"] == first["n"], (key, said[key])
            assert said[key]["first_accept_len"] == pytest.approx(first["accept_len"]), key


def _import_fixture_runs(runs: Path) -> None:
    """`dsparklab import` of the committed vLLM Prometheus and DeepSpec fixtures into runs."""
    fixtures = Path(__file__).resolve().parents[1] / "unit" / "importers" / "fixtures"
    before, after = fixtures / "vllm_metrics_before.prom", fixtures / "vllm_metrics_after.prom"
    for command in (
        ["import", "vllm-metrics", str(before), str(after), "--out", str(runs)],
        ["import", "deepspec", str(fixtures / "deepspec_metrics.json"), "--out", str(runs)],
    ):
        made = CliRunner().invoke(app, command)
        assert made.exit_code == 0, made.output


def test_report_on_imported_runs_only(tmp_path: Path):
    """`dsparklab import` output alone: every notebook runs; the token-level sections say
    in one line that the runs hold no token-level rows; the findings are about the
    imported runs."""
    from dsparklab.errors import DSparkLabError

    runs = tmp_path / "runs"
    _import_fixture_runs(runs)
    report = build_report(runs, tmp_path / "r", png=False, progress=False)
    assert all(nb.ok for nb in report.notebooks), [nb.error for nb in report.notebooks]
    by_name = {nb.name: nb for nb in report.notebooks}
    assert by_name["06_imported_and_live"].figures, "the imported view draws them"
    for name in ("00_explorer", "02_window_scaling", "05_regression_diagnosis"):
        first = by_name[name].not_computed[0]
        assert "no token-level rows" in first["reason"] or "no runs under" in first["reason"]
    index = report.index.read_text(encoding="utf-8")
    assert "section(s) not computed" in index
    findings = json.loads((tmp_path / "r" / "report.json").read_text())["findings"]
    assert findings["run_sets"] == ["imported/deepspec", "imported/vllm"]
    imported = [
        (r["run set"], r["dataset"], r["method"], r["n"]) for r in findings["tables"]["acceptance"]
    ]
    assert ("imported/deepspec", "gsm8k", "unknown", 7) in imported, imported
    assert any("holds one window only" in note for note in findings["notes"])
    assert any("the seeds' question" in note for note in findings["notes"])
    # in a notebook cell a dsparklab error shows as its one line, not a traceback
    assert DSparkLabError("file x: field y: bad")._render_traceback_() == [
        "DSparkLabError: file x: field y: bad"
    ]


def test_report_on_a_mixed_store_without_baselines(runs_dir: Path, tmp_path: Path):
    """Imported runs beside Eagle3 token runs with no baseline, no confidence and no
    Markov fields: the report exits clean; what cannot be computed says why."""
    runs = tmp_path / "runs"
    for path in list_runs(runs_dir)["path"]:
        if "eagle3" in Path(path).name:
            copy_run(path, runs)
    _import_fixture_runs(runs)
    result = CliRunner().invoke(
        app,
        [
            "report",
            "--runs",
            str(runs),
            "--out",
            str(tmp_path / "r"),
            "--no-png",
            "--param",
            "N_BOOT=20",
        ],
    )
    assert result.exit_code == 0, result.output
    meta = json.loads((tmp_path / "r" / "report.json").read_text())
    skipped = {nb["name"]: [s["section"] for s in nb["not_computed"]] for nb in meta["notebooks"]}
    assert "Speedup" in skipped["02_window_scaling"]
    assert "ECE, Brier, AUROC" in skipped["03_confidence_calibration"]
    assert "Flip rates" in skipped["04_markov_attribution"]
    # Eagle3 n=3 against n=7: every acceptance view; the speedup needs the baseline
    assert skipped["05_regression_diagnosis"] == ["Where the speedup went"]
    findings = meta["findings"]
    notes = findings["notes"]
    assert any(
        "tiny/reference: speedup not measured: no target-only baseline run" in n for n in notes
    )
    eagle3 = [
        r
        for r in findings["tables"]["windows"]
        if (r["run set"], r["method"]) == ("tiny/reference", "eagle3")
    ]
    assert eagle3 and all(r["AL(3)"] and r["AL(7)"] for r in eagle3), "two windows"
    assert "imported/vllm" in findings["run_sets"]
