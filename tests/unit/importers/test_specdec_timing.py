"""specdec_bench runs timed where a user replayed an acceptance profile come back as a cost
table: each run directory as specdec_bench writes it (NVIDIA/Model-Optimizer a2fbac7b:
``configuration.json`` from ``specdec_bench/utils.py:dump_env``, ``timing.json`` from
``specdec_bench/metrics/timing.py``, statistics as 4-decimal strings)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dsparklab.analysis import compute_projected_speedup, cost_table_from_step_times
from dsparklab.errors import InputFormatError
from dsparklab.importers.specdec_bench import read_specdec_timing
from dsparklab.lab.notebook import cost_table, load_runs
from tests.notebooks.lab_synth import write_synthetic_run


def _statistics(values: list[float]) -> dict[str, object]:
    """The shape of specdec_bench's ``compute_statistics``: every number a string."""
    data = np.array(values)
    levels = [0.25, 0.5, 0.75]
    quantiles = np.percentile(data, [100 * q for q in levels])
    return {
        "min": f"{data.min():.4f}",
        "max": f"{data.max():.4f}",
        "mean": f"{data.mean():.4f}",
        "std": f"{data.std():.4f}",
        "quantiles": {f"{q}": f"{v:.4f}" for q, v in zip(levels, quantiles, strict=True)},
    }


def _run(root: Path, name: str, algorithm: str, n: int, concurrency: int, steps: list[list[float]]):
    """One ``run.py --save_dir`` directory; ``steps`` holds each repeat's chunk intervals
    after the first, which specdec_bench measures from the request's start: a 0.5 s time
    to first token is put in front, as its ``timing.py`` does."""
    steps = [[0.5, *intervals] for intervals in steps]
    run = root / name
    run.mkdir(parents=True)
    config = {
        "engine": "VLLM",
        "speculative_algorithm": algorithm,
        "draft_length": n,
        "concurrency": concurrency,
        "tp_size": 1,
        "gpu": "NVIDIA H200",
        "argv": ["run.py", "--hf_token", "***REDACTED***"],
    }
    (run / "configuration.json").write_text(json.dumps(config, indent=4))
    entries = [
        {
            "Output TPS": concurrency / float(np.mean(intervals)),
            "Output TPS/gpu": concurrency / float(np.mean(intervals)),
            "E2E Request Time": _statistics([sum(intervals)]),
            "TTFT Time": _statistics([intervals[0]]),
            "Request Generation Step Time": _statistics(intervals),
            "Request Generation Tokens Per Second": _statistics([1 / np.mean(intervals)]),
            "Number of Output Tokens": _statistics([len(intervals) + 1]),
        }
        for intervals in steps
    ]
    (run / "timing.json").write_text(json.dumps(entries, indent=4))
    return run


def test_replayed_runs_give_each_window_its_whole_step_cost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    root = tmp_path / "replay"
    _run(root, "base-c1", "NONE", 3, 1, [[0.02] * 6])
    _run(root, "eagle3-n3-c1", "EAGLE3", 3, 1, [[0.025] * 3, [0.027] * 3])
    _run(root, "eagle3-n3-c2", "EAGLE3", 3, 2, [[0.03] * 3])  # no baseline at 2
    dirs = sorted(p for p in root.iterdir())
    timings = read_specdec_timing(dirs)
    assert timings[["method", "n", "concurrency"]].drop_duplicates().values.tolist() == [
        ["none", 0, 1], ["eagle3", 3, 1], ["eagle3", 3, 2],
    ]  # fmt: skip
    # the median interval: the time to first token (0.5 s) left out, which the drafting
    # runs' fewer chunks would weigh more in a mean
    assert timings["step_time_s"].tolist() == [0.02, 0.025, 0.027, 0.03]
    with caplog.at_level(logging.WARNING):
        costs = cost_table_from_step_times(timings, profile="replay")
    assert "no target-only run at concurrency [2]" in caplog.text
    assert len(costs) == 1
    row = costs.iloc[0]
    assert row["step_cost"] == pytest.approx(0.026 / 0.02) and row["repeats"] == 2
    assert np.isnan(row["draft_cost"]) and np.isnan(row["verify_cost"])
    assert "not told apart" in row["cost_source"]
    # AL over the whole step, where the table does not split it
    projected = compute_projected_speedup(
        pd.DataFrame({"method": ["eagle3"], "n": [3], "accept_len": [2.6]}), costs
    )
    assert projected["speedup"].iloc[0] == pytest.approx(2.6 / 1.3)
    assert projected["label"].iloc[0] == "projected on replay at concurrency 1"

    # through the notebooks' COST_PROFILE
    write_synthetic_run(tmp_path / "runs", method="eagle3", n=3, dataset="humaneval")
    by_spec = cost_table(f"specdec-bench:{root}", load_runs(tmp_path / "runs"))
    assert by_spec["step_cost"].tolist() == costs["step_cost"].tolist()
    assert set(by_spec["profile"]) == {"specdec-bench replay at concurrency 1"}
    # a DSpark engine measured under another algorithm name: #method names the lab's
    renamed = cost_table(f"specdec-bench:{root}#dspark", load_runs(tmp_path / "runs"))
    assert set(renamed["method"]) == {"dspark"}


def test_bad_replay_runs_name_the_file_and_field(tmp_path: Path):
    run = _run(tmp_path, "r", "EAGLE3", 3, 1, [[0.02, 0.02]])
    entries = json.loads((run / "timing.json").read_text())
    entries[0]["Request Generation Step Time"]["quantiles"]["0.5"] = "n/a"
    (run / "timing.json").write_text(json.dumps(entries))
    with pytest.raises(
        InputFormatError, match=r"\[0\]\.Request Generation Step Time\.quantiles\.0\.5"
    ) as err:
        read_specdec_timing([run])
    assert "timing.json" in str(err.value)
    config = json.loads((run / "configuration.json").read_text())
    del config["draft_length"]
    (run / "configuration.json").write_text(json.dumps(config))
    with pytest.raises(InputFormatError, match="draft_length") as err:
        read_specdec_timing([run])
    assert "configuration.json" in str(err.value)
    with pytest.raises(InputFormatError, match="no such file"):
        read_specdec_timing([tmp_path / "missing"])
