"""`make demo`'s pipeline at a small size: the smol target prepared, a live subset
collected (tier smol-live, apart from the shipped traces), the report built with the
findings computed on the shipped smol traces."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dsparklab.report.demo import DEMO_PARAMETERS, DEMO_TIER, collect_demo_runs, run_demo
from dsparklab.store import list_runs, validate_trace

pytestmark = [pytest.mark.notebooks, pytest.mark.slow]


def test_demo_collects_live_runs_and_reports_the_findings(tmp_path: Path):
    small = dict(
        runs=tmp_path / "runs",
        out=tmp_path / "report",
        limit=1,
        max_new_tokens=16,
        ns=(3,),
        datasets=("gsm8k",),
        parameters={**DEMO_PARAMETERS, "N_BOOT": 50},
        png=False,
        progress=False,
    )
    result = run_demo(**small)
    runs = list_runs(result.runs)
    assert set(runs["tier"]) == {DEMO_TIER} and set(runs["status"]) == {"complete"}
    assert set(runs["method"]) == {"dspark", "eagle3", "none"}
    assert all(not r.violations for r in validate_trace(result.runs))
    index = result.report.index.read_text(encoding="utf-8")
    # the findings are about the demo's runs: the live subset and the shipped traces
    assert f"Findings ({DEMO_TIER}/reference, smol/reference)" in index
    assert 'id="seeds-answer"' in index and 'id="window-table"' in index
    # the live runs are listed with their tier beside the shipped ones
    assert re.search(rf"<td>{DEMO_TIER}</td>", index)
    # the same checkpoints and limits: every run is kept (the report half is the same code)
    kept = {k: v for k, v in small.items() if k not in ("out", "parameters", "png")}
    assert not collect_demo_runs(**kept)
