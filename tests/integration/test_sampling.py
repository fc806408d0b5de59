"""A 10 % request sample (``DSPARKLAB_SAMPLE=0.1``'s choice) agrees with the full run.

The reference engine decodes 240 GSM8K prompts with DSpark and Eagle3 at n=4; the sample
is the requests :func:`request_sampled` keeps at 0.1, whole. At every drafted position the
full run's conditional acceptance lies inside the sample's 99 % interval (requests
resampled), and the sample is the size the fraction says. That the vLLM plugin records
exactly those requests, whole, is tests/vllm/test_e2e_eagle3.py's sampled run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsparklab.analysis import compute_acceptance_by_position
from dsparklab.engines.plan import CollectOptions
from dsparklab.engines.reference.collect import collect
from dsparklab.store import read_trace
from dsparklab.store.sampling import request_sampled
from tests.integration.conftest import Zoo

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PROMPTS = 240
FRACTION = 0.1


@pytest.fixture(scope="module")
def full_runs(tmp_path_factory: pytest.TempPathFactory, zoo: Zoo) -> Path:
    out = tmp_path_factory.mktemp("full")
    collect(
        CollectOptions(
            methods=["dspark", "eagle3"],
            ns=[4],
            datasets=["gsm8k"],
            out=out,
            limit=PROMPTS,
            max_new_tokens=16,
            target=zoo.target_path,
            dspark=zoo.dspark_path,
            eagle3=zoo.eagle3_path,
            progress=False,
        )
    )
    return out


def test_a_ten_percent_sample_agrees_with_the_full_run(full_runs: Path) -> None:
    positions = read_trace(full_runs, "positions")
    kept = positions[positions["request_id"].map(lambda r: request_sampled(r, FRACTION))]
    sampled = kept["request_id"].nunique()
    assert 0.07 * PROMPTS <= sampled <= 0.13 * PROMPTS, sampled
    full = compute_acceptance_by_position(positions, by=("method", "n"), n_boot=0)
    sample = compute_acceptance_by_position(kept, by=("method", "n"), n_boot=2000, ci=0.99)
    both = full.merge(sample, on=["method", "n", "position"], suffixes=("_full", ""))
    assert len(both) == 8  # two methods, four positions
    inside = both["accept_rate_full"].between(both["accept_rate_lo"], both["accept_rate_hi"])
    assert inside.all(), both.loc[~inside, ["method", "position", "accept_rate_full"]]
    # the interval is the sample's: wider than a full run's would be
    assert (both["accept_rate_hi"] - both["accept_rate_lo"]).min() > 0
