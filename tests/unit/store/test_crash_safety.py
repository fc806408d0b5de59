"""A writer SIGKILLed mid-run leaves every finished part readable and the run incomplete."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from dsparklab.store import read_run_json, read_trace, validate_trace

WRITER = textwrap.dedent(
    """
    import sys, time
    from dsparklab.store import TraceWriter
    from tests.conftest import make_run_json, step_rows
    run_dir = sys.argv[1]
    with TraceWriter(run_dir, make_run_json(num_speculative_tokens=4), flush_rows=40) as w:
        for i in range(100_000):
            steps, positions = step_rows([i % 5], n=4, request_id=f"r{i}")
            w.add_many("steps", steps)
            w.add_many("positions", positions)
            time.sleep(0.001)
    """
)


def test_sigkill_keeps_finished_parts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(run)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    try:
        deadline = time.monotonic() + 60
        while len(list((run / "positions").glob("part-*.parquet"))) < 5:
            assert proc.poll() is None, "writer exited early"
            assert time.monotonic() < deadline, "writer produced no parts"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    assert read_run_json(run)["status"] == "running"
    steps = read_trace(run, "steps")
    positions = read_trace(run, "positions")
    assert len(steps) > 0 and len(positions) > 0
    # a flush writes the steps part before the positions part, so whatever the kill
    # interrupted, every visible position row has its step row: the run is valid, only unfinished
    (report,) = validate_trace(run)
    assert not report.complete
    # finished parts are whole; steps/positions parts flush together, so per-part rows
    # are multiples of whole steps
    assert len(positions) % 4 == 0
    assert report.rows["positions"] == len(positions)
    hidden = list(run.rglob("*.tmp"))
    listed = {p.name for p in run.rglob("part-*.parquet")}
    assert not any(h.name in listed for h in hidden)
    assert report.ok, [str(v) for v in report.violations]
