"""Compaction on an object store: runs move into the table layout of a bucket whole."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest
from seaweed_store import SeaweedS3

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "analysis"))
from analysis_synth import build_run, noisy_confidence, write_run  # noqa: E402

from dsparklab.store import find_runs, read_run_json, read_trace, validate_trace
from dsparklab.store.compact import compact_store
from dsparklab.store.layout import is_partitioned
from dsparklab.store.location import Location


def test_a_bucket_compacts_in_place_and_reads_back_equal(
    seaweed: SeaweedS3, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    root = f"s3://{s3_bucket}/store"
    # two runs of the old layout, written into the bucket through TraceWriter
    for run in (
        build_run(run_id="ref/gsm8k/dspark-n3", n=3, confidence=noisy_confidence(0.2)),
        build_run(run_id="ref/gsm8k/eagle3-n4", method="eagle3", n=4, seed=5),
    ):
        write_run(root, run)
    keys = ["run_id", "request_id", "step", "position"]
    before = read_trace(root, "positions").sort_values(keys).reset_index(drop=True)
    results = compact_store(root)
    assert [r.generation for r in results] == [1, 1]
    runs = find_runs(root)
    assert len(runs) == 2 and all(is_partitioned(r) for r in runs)
    assert all(str(r).startswith(f"s3://{s3_bucket}/store/_runs/dataset=gsm8k/") for r in runs)
    assert not (Location.of(root) / "ref").exists()
    after = read_trace(root, "positions").sort_values(keys).reset_index(drop=True)
    pd.testing.assert_frame_equal(after[before.columns], before, check_dtype=False)
    assert all(r.ok for r in validate_trace(root))
    assert read_run_json(runs[0])["compaction"]["generation"] == 1
