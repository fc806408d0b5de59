"""The recorder-cost benchmark's pass writes what its engine steps verified: every
request's every verified draft as one steps row and n positions rows, a valid run, the
accepted counts as the synthetic steps gave them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from dsparklab.store import read_trace, validate_trace
from tests.benchmark_scripts import BENCHMARKS, load_benchmark


def test_a_pass_writes_every_verified_draft(tmp_path: Path) -> None:
    bench = load_benchmark("recorder_cost")
    args = bench.parse_args(["--steps", "30", "--turn", "7", "--requests", "3", "--n", "4"])
    steps = bench.engine_steps(args.requests, args.n, args.steps)
    processing, writing = bench.one_pass(args, steps, str(tmp_path))
    assert processing > 0 and writing > 0
    got = read_trace(tmp_path, "steps")
    # step k verifies the drafts of step k - 1: 29 verified drafts per request
    assert len(got) == 29 * args.requests
    accepted = got.sort_values(["step", "request_id"])["accepted_len"].to_numpy()
    sampled = [s["num_sampled"] - 1 for s in steps[1:]]
    assert accepted.tolist() == [int(a) for row in sampled for a in row]
    positions = read_trace(tmp_path, "positions")
    assert len(positions) == 29 * args.requests * args.n
    assert positions["confidence"].notna().all()
    (report,) = validate_trace(tmp_path)
    assert report.ok, report


def test_the_script_prints_its_table() -> None:
    out = subprocess.run(
        [sys.executable, str(BENCHMARKS / "recorder_cost.py"), "--steps", "60", "--repeat", "1"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "processing |" in out and "writing |" in out
