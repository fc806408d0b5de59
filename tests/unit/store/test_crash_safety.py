"""A writer SIGKILLed mid-run keeps every row it had flushed, and the run stays valid."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd

from dsparklab.store import read_run_json, read_trace, validate_trace
from tests.conftest import numbered_requests

N = 4
BATCH = 25  # requests per flush
# The writer flushes after every BATCH requests and then prints how many requests it has
# flushed; it never stops by itself, so the kill lands while it is adding or writing rows.
WRITER = textwrap.dedent(
    f"""
    import sys
    from dsparklab.store import TraceWriter
    from tests.conftest import make_run_json, numbered_request
    with TraceWriter(sys.argv[1], make_run_json(num_speculative_tokens={N}),
                     flush_rows=10**9, flush_seconds=10**9) as w:
        for i in range(10**9):
            steps, positions = numbered_request(i, n={N})
            w.add_many("steps", steps)
            w.add_many("positions", positions)
            if (i + 1) % {BATCH} == 0:
                w.flush()
                print(i + 1, flush=True)
    """
)


def _rows(frame: pd.DataFrame, keys: list[str], columns: list[str]) -> pd.DataFrame:
    return frame[keys + columns].sort_values(keys).reset_index(drop=True)


def test_sigkill_mid_write_keeps_every_flushed_row(tmp_path: Path) -> None:
    run = tmp_path / "run"
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(run)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    flushed = 0
    try:
        deadline = time.monotonic() + 60
        while flushed < 8 * BATCH:
            line = proc.stdout.readline()
            assert line, f"writer exited early (code {proc.poll()})"
            assert time.monotonic() < deadline, "writer too slow"
            flushed = int(line)
        time.sleep(random.uniform(0.0, 0.02))  # somewhere in the next batch or its flush
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    assert read_run_json(run)["status"] == "running", "killed: never marked complete"
    steps, positions = read_trace(run, "steps"), read_trace(run, "positions")
    want_steps, want_positions = numbered_requests(flushed, n=N)
    step_keys, position_keys = ["request_id", "step"], ["request_id", "step", "position"]
    # every row flushed before the kill is there, exactly as written
    got = steps[steps["request_id"].isin(want_steps["request_id"])]
    pd.testing.assert_frame_equal(
        _rows(got, step_keys, ["accepted_len", "num_drafted", "context_len"]),
        _rows(want_steps, step_keys, ["accepted_len", "num_drafted", "context_len"]),
        check_dtype=False,
    )
    got = positions[positions["request_id"].isin(want_positions["request_id"])]
    pd.testing.assert_frame_equal(
        _rows(got, position_keys, ["accepted", "draft_token", "target_token"]),
        _rows(want_positions, position_keys, ["accepted", "draft_token", "target_token"]),
        check_dtype=False,
    )
    # what a flush interrupted by the kill left is whole batches (the steps part is written
    # before the positions part), so the store still validates: incomplete, not corrupt
    for frame in (steps, positions):
        assert frame["request_id"].nunique() % BATCH == 0
    (report,) = validate_trace(run)
    assert not report.complete
    assert report.ok, [str(v) for v in report.violations]
