"""Issue 33, item 4: a collect against taps recording a sample (``DSPARKLAB_SAMPLE``) waits
only for the requests the taps record, and the run it writes says it is a sample.

The taps are a real tap store (TraceWriter, the table layout a server writes) holding the
steps of the sampled requests only, as a sampling server's recorder leaves them.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from dsparklab.engines.plan import RunSpec
from dsparklab.engines.vllm.join import CollectedRequest, write_run
from dsparklab.engines.vllm.serve_client import _wait_for_taps
from dsparklab.prompts import Prompt
from dsparklab.store import TraceWriter, list_runs, read_run_json, read_trace
from dsparklab.store.location import Location
from dsparklab.store.sampling import SAMPLE_KEY, request_sampled, sample_block
from tests.conftest import make_run_json, step_rows

FRACTION = 0.5
ACCEPTED = (2, 0, 3)  # each request's verify steps
# the response's metrics.speculative_decoding for those steps (n = 3)
SPEC_METRICS = {
    "num_spec_steps": 3,
    "num_draft_tokens": 9,
    "num_accepted_draft_tokens": 5,
    "mean_acceptance_length": 1 + 5 / 3,
    "draft_acceptance_rate": 5 / 9,
    "per_step_accepted": list(ACCEPTED),
    "per_step_drafted": [3, 3, 3],
}


def _requests(count: int) -> list[CollectedRequest]:
    return [
        CollectedRequest(
            prompt=Prompt(prompt_id=f"q{i}", text=f"prompt {i}", dataset="humaneval"),
            request_id=f"dsl{i}",
            prompt_token_ids=[1, 2, 3],
            output_token_ids=list(range(4, 4 + 1 + sum(a + 1 for a in ACCEPTED))),
            output_text="x",
            spec_metrics=SPEC_METRICS,
        )
        for i in range(count)
    ]


@pytest.fixture
def sampled_taps(tmp_path: Path) -> tuple[Location, list[CollectedRequest]]:
    requests = _requests(12)
    recorded = [r for r in requests if request_sampled(r.request_id, FRACTION)]
    assert 0 < len(recorded) < len(requests)  # the sample leaves some out
    meta = make_run_json(run_id="tap-dp0", **{SAMPLE_KEY: sample_block(FRACTION)})
    taps = tmp_path / "taps"
    with TraceWriter(taps, meta) as writer:
        for r in recorded:
            # vLLM's internal id: the X-Request-Id the collector sent, with a suffix
            steps, positions = step_rows(ACCEPTED, request_id=f"cmpl-{r.request_id}-0-1a2b3c4d")
            writer.add_many("steps", [{**s, "prompt_id": f"cmpl-{r.request_id}-0"} for s in steps])
            writer.add_many("positions", positions)
    return Location.of(taps), requests


def test_only_the_sampled_requests_are_awaited(
    sampled_taps: tuple[Location, list[CollectedRequest]], caplog: pytest.LogCaptureFixture
) -> None:
    taps, requests = sampled_taps
    with caplog.at_level(logging.WARNING):
        tables, sample = _wait_for_taps(taps, requests, timeout=3.0, poll=0.05)
    assert sample == FRACTION
    assert "incomplete after" not in caplog.text, "waited for requests the taps never record"
    assert tables.steps["prompt_id"].nunique() == sum(
        request_sampled(r.request_id, FRACTION) for r in requests
    )


def test_the_written_run_is_a_sample_with_no_request_missing_its_taps(
    sampled_taps: tuple[Location, list[CollectedRequest]], tmp_path: Path
) -> None:
    taps, requests = sampled_taps
    tables, sample = _wait_for_taps(taps, requests, timeout=3.0, poll=0.05)
    out = Location.of(tmp_path / "runs")
    spec = RunSpec("humaneval", "dspark", 3, 0.0, "vllm-serve")
    meta = make_run_json(run_id=spec.name, engine={"name": "vllm-serve", "version": "0"})
    report = write_run(out, spec, meta, requests, taps=tables, exact_ids=False, sample=sample)
    assert report.requests_without_taps == []
    (path,) = list_runs(out)["path"]
    assert read_run_json(path)[SAMPLE_KEY]["fraction"] == FRACTION
    assert list_runs(out)["sample"].tolist() == [FRACTION]
    positions = read_trace(out, "positions")
    sampled = {r.prompt.prompt_id for r in requests if request_sampled(r.request_id, sample)}
    assert set(positions["request_id"]) == sampled  # positions: the sample, whole
    assert read_trace(out, "steps")["request_id"].nunique() == len(requests)
