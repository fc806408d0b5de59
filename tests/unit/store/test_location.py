"""The store layer on a local disk: hidden runs, unique part names, leases, the outbox,
sampling and secrets. The same code against a real S3 server: tests/fleet."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from dsparklab.store import find_runs, list_runs, read_run_json, read_trace, validate_trace
from dsparklab.store.location import Location, StoreAccessError, redact
from dsparklab.store.outbox import Outbox
from dsparklab.store.reader import part_files, store_runs
from dsparklab.store.sampling import request_sampled, request_unit
from dsparklab.store.writer import TraceWriter
from tests.conftest import make_run_json, step_rows, write_run


def test_hidden_run_directories_are_not_runs(tmp_path: Path) -> None:
    """An import in progress (or a killed one) writes below ``.<name>.tmp-PID/``: readers
    must not count its run a second time."""
    run = write_run(tmp_path / "runs" / "a")
    shutil.copytree(tmp_path / "runs" / "a", tmp_path / "runs" / f".a.tmp-{os.getpid()}")
    shutil.copytree(tmp_path / "runs" / "a", tmp_path / "runs" / ".cache" / "b")
    assert find_runs(tmp_path / "runs") == [Location.of(run)]
    assert store_runs(tmp_path / "runs" / "a") == [Location.of(run)]
    runs = list_runs(tmp_path / "runs")
    assert len(runs) == 1
    steps = read_trace(tmp_path / "runs", "steps")
    assert len(steps) == len(read_trace(run, "steps"))
    assert not steps.duplicated(["run_id", "request_id", "step"]).any()


def test_part_names_are_unique_and_keep_the_writers_order(tmp_path: Path) -> None:
    with TraceWriter(
        tmp_path / "run", make_run_json(num_speculative_tokens=4), tag="tp3"
    ) as writer:
        for i in range(3):
            steps, positions = step_rows([1, 2], n=4, request_id=f"r{i}")
            writer.add_many("steps", steps)
            writer.add_many("positions", positions)
            writer.flush()
    names = [p.name for p in part_files(tmp_path / "run", "steps")]
    assert len(names) == 3
    assert all(f"-{os.getpid()}-tp3.parquet" in n for n in names), names
    assert names == sorted(names) and names[0].startswith("part-00000-")
    assert (
        read_trace(tmp_path / "run", "steps")["request_id"].tolist()
        == ["r0"] * 2 + ["r1"] * 2 + ["r2"] * 2
    )


def test_a_run_whose_lease_ended_reads_incomplete(tmp_path: Path) -> None:
    writer = TraceWriter(
        tmp_path / "run", make_run_json(num_speculative_tokens=4), lease_seconds=60
    )
    writer.__enter__()
    steps, positions = step_rows([2, 0], n=4)
    writer.add_many("steps", steps)
    writer.add_many("positions", positions)
    writer.flush()
    assert read_run_json(tmp_path / "run")["status"] == "running"
    # the writer is gone (never closed): move its lease into the past
    path = Path(writer.run_dir.path) / "run.json"
    meta = json.loads(path.read_text())
    past = datetime.now(timezone.utc) - timedelta(seconds=1)
    meta["lease_expires_at"] = past.isoformat(timespec="seconds")
    path.write_text(json.dumps(meta))
    derived = read_run_json(tmp_path / "run")
    assert derived["status"] == "incomplete"
    assert "lease ended" in derived["status_reason"]
    assert read_run_json(tmp_path / "run", derive_status=False)["status"] == "running"
    (report,) = validate_trace(tmp_path / "run")
    assert report.ok and report.status == "incomplete", report.violations
    assert len(read_trace(tmp_path / "run", "steps", statuses=["incomplete"])) == 2


def test_closing_ends_the_lease(tmp_path: Path) -> None:
    with TraceWriter(tmp_path / "run", make_run_json(num_speculative_tokens=4)) as writer:
        assert "lease_expires_at" in json.loads((writer.run_dir / "run.json").read_text())
        writer.add_many("steps", step_rows([1], n=4)[0])
    meta = read_run_json(tmp_path / "run")
    assert meta["status"] == "complete" and "lease_expires_at" not in meta


def test_a_batch_writer_publishes_run_json_last(tmp_path: Path) -> None:
    run = tmp_path / "run"
    writer = TraceWriter(run, make_run_json(num_speculative_tokens=4), publish="last")
    writer.__enter__()
    writer.add_many("steps", step_rows([1], n=4)[0])
    writer.flush()
    assert part_files(writer.run_dir, "steps") and not (writer.run_dir / "run.json").exists()
    with pytest.raises(Exception, match="no run.json"):
        find_runs(tmp_path)
    writer.close()
    assert read_run_json(run)["status"] == "complete"


def _blocked(tmp_path: Path) -> tuple[Location, Path]:
    """A run directory whose parent is a plain file: every write fails until it goes."""
    blocker = tmp_path / "store"
    blocker.write_text("not a directory")
    return Location.of(blocker / "run"), blocker


def test_outbox_buffers_while_the_store_fails_and_sends_the_rest(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run, blocker = _blocked(tmp_path)
    outbox = Outbox(max_bytes=2**30, name="test store")
    with caplog.at_level(logging.WARNING, logger="dsparklab.store"):
        writer = TraceWriter(
            run, make_run_json(num_speculative_tokens=4), outbox=outbox, flush_seconds=1e9
        )
        writer.__enter__()  # never waits for the store
        for i in range(5):
            steps, positions = step_rows([1, 3], n=4, request_id=f"r{i}")
            writer.add_many("steps", steps)
            writer.add_many("positions", positions)
            writer.flush()
        assert not outbox.drain(1.0), "the store is down: nothing can have been sent"
        blocker.unlink()
        writer.close()
    assert outbox.counts.failures > 0
    assert outbox.counts.sent_parts == {"steps": 5, "positions": 5}
    meta = read_run_json(run)
    assert meta["status"] == "complete" and meta["dropped"] is None
    assert meta["rows"]["steps"] == 10
    assert len(read_trace(run, "steps")) == 10
    text = caplog.text
    assert "unreachable" in text and "is back after" in text


def test_a_live_run_json_keeps_its_place_and_the_final_one_goes_last(tmp_path: Path) -> None:
    """Issue 33: each new live run.json used to go to the back of the queue, so under a slow
    store with parts always queued it never landed (nor its lease and drop counts)."""
    run, blocker = _blocked(tmp_path)
    outbox = Outbox(max_bytes=2**30, name="test store")
    meta, parts = run / "run.json", [run / f"steps-{i}.parquet" for i in range(3)]
    outbox.put(meta, b'{"v": 1}', table=None)
    for i, part in enumerate(parts):
        outbox.put(part, b"rows", table="steps", rows=1, batch=i)
        outbox.put(meta, b'{"v": %d}' % (i + 2), table=None)
    blocker.unlink()
    assert outbox.drain(30.0)
    sent_at = {p.name: Path(p.path).stat().st_mtime_ns for p in [meta, *parts]}
    assert meta.read_bytes() == b'{"v": 4}'  # the newest, in the first one's place
    assert sent_at["run.json"] <= min(sent_at[p.name] for p in parts)
    outbox.put(parts[0], b"more", table="steps", rows=1, batch=3)
    outbox.put(meta, b'{"v": "final"}', table=None, final=True)
    assert outbox.close(30.0)
    assert Path(meta.path).stat().st_mtime_ns >= Path(parts[0].path).stat().st_mtime_ns


def test_a_flush_whose_first_part_was_sent_is_never_cut(tmp_path: Path) -> None:
    """Issue 33: with the store failing between a flush's parts, the bound used to drop the
    rest of a flush already half sent; it drops a whole later flush instead."""
    good, (late, blocker) = Location.of(tmp_path / "good"), _blocked(tmp_path)
    outbox = Outbox(max_bytes=2**30, name="test store")
    outbox.put(good / "steps-0.parquet", b"steps", table="steps", rows=2, batch=0)
    outbox.put(late / "positions-0.parquet", b"positions", table="positions", rows=8, batch=0)
    deadline = time.monotonic() + 10
    while not (outbox.counts.sent_parts and outbox.counts.failures) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert outbox.counts.sent_parts == {"steps": 1} and outbox.counts.failures
    outbox.max_bytes = len(b"positions")  # room for the half-sent flush's rest only
    outbox.put(good / "steps-1.parquet", b"steps", table="steps", rows=2, batch=1)
    assert outbox.counts.dropped_parts == {"steps": 1}, "the later flush, whole"
    blocker.unlink()
    assert outbox.close(30.0)
    assert (late / "positions-0.parquet").read_bytes() == b"positions"


def test_outbox_drops_the_oldest_parts_past_its_bound_and_counts_them(tmp_path: Path) -> None:
    run, blocker = _blocked(tmp_path)
    outbox = Outbox(max_bytes=1, name="test store")  # room for nothing but run.json
    writer = TraceWriter(
        run, make_run_json(num_speculative_tokens=4), outbox=outbox, flush_seconds=1e9
    )
    writer.__enter__()
    for i in range(3):
        steps, positions = step_rows([1, 3], n=4, request_id=f"r{i}")
        writer.add_many("steps", steps)
        writer.add_many("positions", positions)
        writer.flush()
    blocker.unlink()
    # after the outage: these parts fit once the queue has drained
    assert outbox.drain(30.0)
    outbox.max_bytes = 2**30
    steps, positions = step_rows([2], n=4, request_id="after")
    writer.add_many("steps", steps)
    writer.add_many("positions", positions)
    writer.close()
    meta = read_run_json(run)
    assert meta["dropped"] == {
        "parts": {"steps": 3, "positions": 3},
        "rows": {"steps": 6, "positions": 24},
    }
    assert meta["rows"]["steps"] == 1
    assert meta["status"] == "incomplete" and "dropped" in meta["status_reason"]
    steps = read_trace(run, "steps", statuses=["incomplete"])
    assert steps["request_id"].tolist() == ["after"]
    (report,) = validate_trace(run)
    assert report.ok, report.violations


def test_sampling_is_a_pure_function_of_the_request_id() -> None:
    ids = [f"chatcmpl-{i:05d}" for i in range(20_000)]
    chosen = {r for r in ids if request_sampled(r, 0.1)}
    assert 0.09 < len(chosen) / len(ids) < 0.11
    assert all(request_sampled(r, 1.0) for r in ids[:100])
    assert {r for r in ids if request_sampled(r, 0.05)} <= chosen  # nested fractions
    # another process (another rank, another server) decides the same
    code = (
        "from dsparklab.store.sampling import request_sampled\n"
        f"print(sum(request_sampled(f'chatcmpl-{{i:05d}}', 0.1) for i in range({len(ids)})))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "12345"},
    )
    assert int(out.stdout) == len(chosen)
    assert 0.0 <= request_unit("x") < 1.0


def test_secrets_are_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value-xyz")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLE")
    text = redact("denied for AKIAEXAMPLE with s3cr3t-value-xyz; Signature=abcdef&x=1")
    assert "s3cr3t" not in text and "AKIAEXAMPLE" not in text and "abcdef" not in text
    err = StoreAccessError("refused s3cr3t-value-xyz", location="s3://b/p")
    assert "s3cr3t" not in str(err) and str(err).startswith("store s3://b/p: ")


def test_unknown_schemes_are_refused_in_one_line() -> None:
    with pytest.raises(StoreAccessError, match="unsupported scheme"):
        Location.of("gs://bucket/runs")


def test_a_sampled_run_says_so_in_its_listing_and_the_findings(tmp_path: Path) -> None:
    from dsparklab.report.findings import run_set_labels, sampled_notes

    write_run(tmp_path / "full")
    sampled = make_run_json(run_id="sampled", sample={"fraction": 0.1, "by": "blake2b"})
    write_run(tmp_path / "sampled", meta=sampled)
    runs = list_runs(tmp_path)
    assert runs.set_index("run_id")["sample"].to_dict() == {"run-test": 1.0, "sampled": 0.1}
    (note,) = sampled_notes(runs, run_set_labels(runs))
    assert "1 runs hold a sample" in note and "fraction 0.1" in note
    assert "intervals are over the sampled requests" in note
