"""A report over served runs alone (a real `vllm serve` of the zoo's Eagle3, collected by
`dsparklab collect --engine vllm-serve`): it exits 0, its findings are about those runs,
and every section the runs cannot give says why in one line."""

from __future__ import annotations

import html
import json
import re
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from tests.vllm.serving import DSPARKLAB, ENV, N, Server, collect_served  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


def _findings(index: Path) -> str:
    text = index.read_text(encoding="utf-8")
    part = text[text.index('id="findings"') : text.index("<h2>Notebooks</h2>")]
    return html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", part)))


def test_report_over_served_runs_only(eagle3_server: Server, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    made = collect_served(
        eagle3_server, runs, "--dataset", "humaneval", "--limit", "3", "--max-new-tokens", "16"
    )
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-3000:]
    out = tmp_path / "report"
    done = subprocess.run(
        [DSPARKLAB, "report", "--runs", str(runs), "--out", str(out), "--no-png",
         "--param", "N_BOOT=20"],
        capture_output=True, text=True, timeout=600, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
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
