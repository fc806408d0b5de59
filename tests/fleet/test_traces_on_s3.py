"""Trace stores on a real S3 server (SeaweedFS on loopback): many writers, a killed one,
and every command against the bucket, with good and bad credentials."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pandas as pd
import pytest
from seaweed_store import SeaweedS3, free_ports

from dsparklab.store import find_runs, read_run_json, read_trace, validate_trace
from dsparklab.store.layout import partition_values
from dsparklab.store.reader import store_runs
from tests.conftest import numbered_request, numbered_requests

ROOT = Path(__file__).resolve().parents[2]
N = 4
BATCH = 25  # requests per flush
WRITERS = 4
# Each writer records its own run into one store of a bucket: BATCH requests per part,
# LEASE s lease. argv: store URI, run_id, requests (0: until killed), lease seconds.
WRITER = textwrap.dedent(
    f"""
    import sys
    from dsparklab.store import TraceWriter
    from tests.conftest import make_run_json, numbered_request, request_row
    total = int(sys.argv[3])
    meta = make_run_json(num_speculative_tokens={N}, run_id=sys.argv[2])
    with TraceWriter(sys.argv[1], meta,
                     flush_rows=10**9, flush_seconds=10**9,
                     lease_seconds=float(sys.argv[4])) as w:
        i = 0
        while total == 0 or i < total:
            steps, positions = numbered_request(i, n={N})
            w.add_many("steps", steps)
            w.add_many("positions", positions)
            n_output = 1 + sum(s["emitted"] for s in steps)
            w.add("requests", request_row(f"r{{i}}", n_output=n_output))
            i += 1
            if i % {BATCH} == 0:
                w.flush()
                print(i, flush=True)
    """
)


def _env(seaweed: SeaweedS3, **extra: str) -> dict[str, str]:
    return {**os.environ, **seaweed.env(), "PYTHONPATH": str(ROOT), **extra}


def _same_rows(got: pd.DataFrame, want: pd.DataFrame, keys: list[str]) -> None:
    columns = [c for c in want.columns if c in got.columns]
    left = got[columns].sort_values(keys).reset_index(drop=True)
    right = want[columns].sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(left, right, check_dtype=False)


def test_four_writers_and_a_killed_one(
    seaweed: SeaweedS3, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    root = f"s3://{s3_bucket}/fleet"
    finishing = 4 * BATCH + 7  # the survivors' last part is a partial one
    procs = []
    for index in range(WRITERS):
        total = 0 if index == 0 else finishing
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WRITER, root, f"w{index}", str(total), "3"],
                cwd=ROOT,
                env=_env(seaweed),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    victim = procs[0]
    assert victim.stdout is not None
    flushed = [int(victim.stdout.readline()) for _ in range(3)]
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    for proc in procs[1:]:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    time.sleep(3.5)  # the killed writer's lease (3 s) runs out

    runs = {partition_values(r)["run_id"]: r for r in find_runs(root)}
    assert sorted(runs) == [f"w{i}" for i in range(WRITERS)]
    assert store_runs(root) == sorted(runs.values())  # one listing, below _runs only
    reports = {partition_values(r.path)["run_id"]: r for r in validate_trace(root)}
    assert all(r.ok for r in reports.values()), {k: r.violations for k, r in reports.items()}
    assert reports["w0"].status == "incomplete"
    assert "lease" in read_run_json(runs["w0"])["status_reason"]
    for index in range(1, WRITERS):
        assert reports[f"w{index}"].status == "complete"
        steps = read_trace(runs[f"w{index}"], "steps")
        positions = read_trace(runs[f"w{index}"], "positions")
        want_steps, want_positions = numbered_requests(finishing, n=N)
        _same_rows(steps, want_steps, ["request_id", "step"])
        _same_rows(positions, want_positions, ["request_id", "step", "position"])
    # the killed writer: every finished part reads back, whole, with nothing twice
    steps = read_trace(runs["w0"], "steps", statuses=["incomplete"])
    positions = read_trace(runs["w0"], "positions", statuses=["incomplete"])
    requests = steps["request_id"].nunique()
    assert requests % BATCH == 0 and requests >= flushed[-1]
    want_steps, want_positions = numbered_requests(requests, n=N)
    _same_rows(steps, want_steps, ["request_id", "step"])
    _same_rows(positions, want_positions, ["request_id", "step", "position"])
    assert not steps.duplicated(["request_id", "step"]).any()
    everything = read_trace(root, "steps", statuses=["complete", "incomplete"])
    assert not everything.duplicated(["run_id", "request_id", "step"]).any()
    assert len(everything) == 2 * ((WRITERS - 1) * finishing + requests)


def test_tensor_parallel_ranks_write_one_run_into_a_bucket(
    seaweed: SeaweedS3, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM's batch-sharded DSpark sampling on an object store: the owner (TP rank 0) and
    a joined writer (rank 1) send one run's files through their outboxes, as the plugin's
    writers do; read back it is one complete run holding both writers' rows."""
    from dsparklab.store import TraceWriter
    from dsparklab.store.outbox import Outbox
    from dsparklab.store.schema import JOINED_WRITERS
    from tests.conftest import make_run_json, request_row

    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    root = f"s3://{s3_bucket}/joined"
    meta = make_run_json(num_speculative_tokens=N, run_id="tp-run")
    owner = TraceWriter(root, {**meta, JOINED_WRITERS: ["tp1"]}, tag="tp0", outbox=Outbox())
    joiner = TraceWriter(root, meta, tag="tp1", outbox=Outbox(), joins="tp1")
    want_steps, want_positions = numbered_requests(6, n=N)
    with owner, joiner:
        for i in range(6):  # request r<i>'s drafts were sampled by rank i mod 2
            steps, positions = numbered_request(i, n=N)
            owner.add_many("steps", steps)
            owner.add(
                "requests", request_row(f"r{i}", n_output=1 + sum(s["emitted"] for s in steps))
            )
            (owner if i % 2 == 0 else joiner).add_many("positions", positions)
    (run,) = find_runs(root)
    meta = read_run_json(run)
    assert meta["status"] == "complete"
    assert meta["rows"]["positions"] == len(want_positions)
    (report,) = validate_trace(root)
    assert report.ok, [str(v) for v in report.violations]
    _same_rows(read_trace(run, "positions"), want_positions, ["request_id", "step", "position"])
    _same_rows(read_trace(run, "steps"), want_steps, ["request_id", "step"])


def _dsparklab(
    args: list[str], env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dsparklab", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_collect_validate_and_report_on_a_bucket(
    seaweed: SeaweedS3, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = _env(seaweed)
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    root = f"s3://{s3_bucket}/runs"
    collected = _dsparklab(
        [
            "collect",
            "--method",
            "dspark,none",
            "--n",
            "3",
            "--dataset",
            "humaneval",
            "--limit",
            "2",
            "--max-new-tokens",
            "8",
            "--out",
            root,
        ],
        env,
    )
    assert collected.returncode == 0, collected.stderr[-2000:]
    fixture = ROOT / "tests" / "unit" / "importers" / "fixtures" / "vllm_bench_result.json"
    imported = _dsparklab(["import", "vllm-bench", str(fixture), "--out", f"{root}/imported"], env)
    assert imported.returncode == 0, imported.stdout + imported.stderr
    checked = _dsparklab(["validate", root], env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "3 runs: 3 valid, 0 invalid" in checked.stdout
    report = _dsparklab(
        [
            "report",
            "--runs",
            root,
            "--out",
            str(tmp_path / "report"),
            "--notebook",
            "01_acceptance_heatmaps",
            "--no-png",
        ],
        env,
    )
    assert report.returncode == 0, report.stdout[-2000:] + report.stderr[-2000:]
    index = (tmp_path / "report" / "index.html").read_text()
    assert root in index
    for secret in (seaweed.secret_key, seaweed.access_key):
        assert secret not in index
        for path in (tmp_path / "report").rglob("*"):
            if path.is_file() and path.suffix in (".html", ".json", ".ipynb"):
                assert secret not in path.read_text(errors="replace"), path
    for run in find_runs(root):  # credentials never reach run.json
        text = (run / "run.json").read_text()
        assert seaweed.secret_key not in text and seaweed.access_key not in text


def _commands(root: str, tmp_path: Path) -> dict[str, list[str]]:
    fixture = ROOT / "tests" / "unit" / "importers" / "fixtures" / "vllm_bench_result.json"
    return {
        "validate": ["validate", root],
        "report": ["report", "--runs", root, "--out", str(tmp_path / "r"), "--no-png"],
        "compare": ["compare", "--base", "n=3", "--new", "n=5", "--runs", root],
        "collect": [
            "collect",
            "--method",
            "none",
            "--dataset",
            "humaneval",
            "--limit",
            "1",
            "--max-new-tokens",
            "2",
            "--out",
            root,
        ],
        "import": ["import", "vllm-bench", str(fixture), "--out", root],
        "lab": ["lab", "--runs", root],
        "serve": ["serve", str(ROOT / "data" / "zoo" / "tiny-target"), "--trace-dir", root],
    }


@pytest.mark.parametrize("fault", ["wrong secret", "wrong key", "endpoint down", "missing bucket"])
def test_a_bad_store_is_one_line_and_exit_2_in_every_command(
    seaweed: SeaweedS3, s3_bucket: str, tmp_path: Path, fault: str
) -> None:
    env = _env(seaweed)
    bucket = s3_bucket
    if fault == "wrong secret":
        env["AWS_SECRET_ACCESS_KEY"] = "not-the-secret-0123456789abcdef"
    elif fault == "wrong key":
        env["AWS_ACCESS_KEY_ID"] = "AKIANOTTHEKEY0000000"
    elif fault == "endpoint down":
        (port,) = free_ports(1)
        env["AWS_ENDPOINT_URL"] = env["AWS_ENDPOINT_URL_S3"] = f"http://127.0.0.1:{port}"
    else:
        bucket = f"missing-{s3_bucket}"
    secrets = {env["AWS_SECRET_ACCESS_KEY"], seaweed.secret_key}
    for name, args in _commands(f"s3://{bucket}/runs", tmp_path).items():
        done = _dsparklab(args, env, timeout=120)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2, (name, done.stdout[-1500:], done.stderr[-1500:])
        assert len(lines) == 1, (name, lines)
        assert f"s3://{bucket}" in lines[0], (name, lines[0])
        for secret in secrets:
            assert secret not in done.stdout + done.stderr, name
