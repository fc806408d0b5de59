"""Issue 33: no secret in any output. A real `dsparklab serve ... --api-key K` with the taps
on, collected with the key in ``$VLLM_API_KEY`` (refused without it, in one line), then
reported: K appears in no file under the server's directory (its log included), the tap
directory, the store or the report, nor in the collector's or the report's output; the
run.json files keep the redacted option."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from dsparklab.provenance import REDACTED  # noqa: E402
from tests.vllm.serving import DSPARKLAB, ENV, collect_served, serve  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

KEY = "sk-dsparklab-test-6f1d2c9e8a7b"


def _files_holding(root: Path, secret: str) -> list[str]:
    return [
        str(path)
        for path in root.rglob("*")
        if path.is_file() and secret.encode() in path.read_bytes()
    ]


def test_an_api_key_reaches_no_file_and_no_output(tmp_path: Path) -> None:
    runs, report = tmp_path / "runs", tmp_path / "report"
    with serve(tmp_path / "serve", "secret-run", args=["--api-key", KEY]) as server:
        refused = collect_served(server, tmp_path / "refused", "--limit", "1")
        assert refused.returncode == 2, refused.stdout + refused.stderr
        (line,) = refused.stderr.strip().splitlines()
        assert "HTTP 401" in line, line
        made = collect_served(
            server, runs, "--dataset", "humaneval", "--limit", "2", "--max-new-tokens", "12",
            env={"VLLM_API_KEY": KEY},
        )  # fmt: skip
        assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-3000:]
        taps = server.taps
    done = subprocess.run(
        [DSPARKLAB, "report", "--runs", str(runs), "--out", str(report), "--no-png",
         "--param", "N_BOOT=10", "--notebook", "00_explorer"],  # its run table, index, json
        capture_output=True, text=True, timeout=600, env=ENV,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    # the server's own directory too: its log (vLLM prints its non-default arguments)
    for root in (tmp_path / "serve", taps, runs, report):
        assert _files_holding(root, KEY) == [], root
    for output in (refused, made, done):
        assert KEY not in output.stdout + output.stderr
    # the server's tap run recorded its command line, the key's value redacted
    argvs = [json.loads(path.read_text())["provenance"]["argv"] for path in taps.rglob("run.json")]
    assert argvs and all(argv[argv.index("--api-key") + 1] == REDACTED for argv in argvs)
