"""A path a command cannot write (``--out`` under a file) or a model directory that is not
there: one line naming the path, exit 2, no traceback, through the console entry point."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

FIXTURE = Path(__file__).parent / "importers" / "fixtures" / "vllm_bench_result.json"
SHIPPED = Path(__file__).parents[2] / "data" / "traces" / "smol"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dsparklab.cli.app", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.parametrize(
    "command",
    [
        ["import", "vllm-bench", str(FIXTURE), "--dataset", "humaneval", "--out"],
        ["count", str(SHIPPED), "--out"],
    ],
    ids=["import", "count"],
)
def test_an_out_under_a_file_is_one_line(tmp_path: Path, command: list[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = _cli(*command, str(blocker / "below" / "out.csv"))
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: ") and str(blocker) in line, line
    assert blocker.read_text() == "not a directory"  # nothing written over it


def test_serving_a_missing_model_directory_is_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-model"
    proc = _cli("serve", str(missing))
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line == f"error: {missing}: no such model directory"
