"""A report over served runs alone (a real `vllm serve` of the zoo's Eagle3, collected by
`dsparklab collect --engine vllm-serve`): it exits 0, its findings are about those runs,
every section the runs cannot give says why in one line, and its index opens on headline
findings with a figure, no table (issue 34, item 5)."""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("vllm")

from tests.browser.index_screen import check_first_screen  # noqa: E402
from tests.vllm.serving import DSPARKLAB, ENV, N, Server, collect_served  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def _findings(index: Path) -> str:
    text = index.read_text(encoding="utf-8")
    part = text[text.index('id="findings"') : text.index("<h2>Notebooks</h2>")]
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", part)))


@pytest.fixture(scope="module")
def served_report(eagle3_server: Server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The report (PNG figures included) over the served runs alone; its directory."""
    root = tmp_path_factory.mktemp("served-report")
    runs = root / "runs"
    made = collect_served(
        eagle3_server, runs, "--dataset", "humaneval", "--limit", "3", "--max-new-tokens", "16"
    )
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-3000:]
    out = root / "report"
    done = subprocess.run(
        [DSPARKLAB, "report", "--runs", str(runs), "--out", str(out), "--param", "N_BOOT=20"],
        capture_output=True, text=True, timeout=600, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return out


def test_report_over_served_runs_only(served_report: Path) -> None:
    out = served_report
    meta = json.loads((out / "report.json").read_text())
    assert all(nb["ok"] for nb in meta["notebooks"]), meta["notebooks"]
    skipped = {
        nb["name"]: {s["section"]: s["reason"] for s in nb["not_computed"]}
        for nb in meta["notebooks"]
    }
    assert skipped["01_acceptance_heatmaps"] == {}, "acceptance is all there"
    assert "no target-only baseline" in skipped["02_window_scaling"]["Speedup"]
    assert "confidence" in skipped["03_confidence_calibration"]["ECE, Brier, AUROC"]
    assert "markov_flip" in skipped["04_markov_attribution"]["Flip rates"]
    findings = _findings(out / "index.html")
    # about the served runs: their run set (the models' tier and vLLM), dataset, method, n
    assert "Findings (tiny/vllm)" in findings
    assert f"tiny/vllm humaneval eagle3 {N}" in findings
    assert "tiny/vllm: speedup not measured: no target-only baseline run" in findings
    assert "holds one window only" in findings, "one n: window scaling says why"
    (out / "findings.txt").write_text(findings)


def test_the_served_only_index_opens_with_headline_findings(
    browser: Any, served_report: Path, screenshots: Path
) -> None:
    """No baseline, one window: the first screen still holds findings and a figure (where
    the drafter loses its tokens, what these runs cannot tell), no table."""
    shot = screenshots / "served_index_first_screen.png"
    headlines = check_first_screen(browser, served_report / "index.html", shot)
    assert "Where does the drafter lose its tokens?" in headlines
    assert "What these runs cannot tell" in headlines
