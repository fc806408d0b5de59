"""Issue 33, item 4: ``emitted`` across a preemption. vLLM frees a preempted request's KV
cache and prefills it again on resume; that prefill samples one token no step holds. The
collector sees it in the steps' context lengths and keeps ``1 + re-prefilled + sum(emitted)
= output length``, which validate checks.

The taps are a real tap store (TraceWriter, as a server's recorder leaves it) holding one
request preempted between its first and second verify steps.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dsparklab.engines.plan import RunSpec
from dsparklab.engines.vllm.join import CollectedRequest, read_tap_runs, write_run
from dsparklab.prompts import Prompt
from dsparklab.store import TraceWriter, list_runs, read_trace, validate_trace
from dsparklab.store.location import Location
from dsparklab.store.rows import resumed_tokens
from tests.conftest import make_run_json, step_rows

PROMPT = [1, 2, 3]
ACCEPTED = (2, 0, 3)  # n = 3
# the sequence when each draft began: prompt + the prefill's token; + A_0 + 1; then the
# preemption's re-prefill adds one token before the next draft; + A_1 + 1
CONTEXT = (4, 4 + 3 + 1, 4 + 3 + 1 + 1)


def test_resumed_tokens_from_the_context_gaps() -> None:
    assert resumed_tokens(CONTEXT, ACCEPTED) == 1
    assert resumed_tokens((4, 7, 8), ACCEPTED) == 0  # no preemption
    assert resumed_tokens((4, float("nan"), 9), ACCEPTED) == 0  # unknown: not counted
    assert resumed_tokens((4, -1, 9), ACCEPTED) == 0


@pytest.mark.parametrize("cut", [0, 1, 3], ids=["whole", "cut-1", "cut-3"])
def test_emitted_adds_up_to_the_output_across_a_preemption(tmp_path: Path, cut: int) -> None:
    """The output holds the prefill's token, the re-prefill's and every step's A + 1, less
    what max_tokens cut from the end: the last steps lose exactly ``cut`` tokens."""
    taps = tmp_path / "taps"
    with TraceWriter(taps, make_run_json(run_id="tap-dp0")) as writer:
        steps, positions = step_rows(ACCEPTED, request_id="cmpl-dsl0-0-1a2b3c4d")
        for row, context in zip(steps, CONTEXT, strict=True):
            row.update(prompt_id="cmpl-dsl0-0", context_len=context, emitted=None)
        writer.add_many("steps", steps)
        writer.add_many("positions", positions)
    n_output = 1 + 1 + sum(a + 1 for a in ACCEPTED) - cut
    request = CollectedRequest(
        prompt=Prompt(prompt_id="q0", text="prompt", dataset="humaneval"),
        request_id="dsl0",
        prompt_token_ids=PROMPT,
        output_token_ids=list(range(100, 100 + n_output)),
        output_text="x",
    )
    out = Location.of(tmp_path / "runs")
    spec = RunSpec("humaneval", "dspark", 3, 0.0, "vllm-serve")
    meta = make_run_json(run_id=spec.name, engine={"name": "vllm-serve", "version": "0"})
    tables = read_tap_runs([Location.of(taps)])
    write_run(out, spec, meta, [request], taps=tables, exact_ids=False)
    emitted = read_trace(out, "steps").sort_values("step")["emitted"].tolist()
    whole = [a + 1 for a in ACCEPTED]
    want, left = [], sum(whole) - cut
    for tokens in whole:
        want.append(min(tokens, left))
        left -= want[-1]
    assert emitted == want and 1 + 1 + sum(emitted) == n_output
    (path,) = list_runs(out)["path"]
    reports = validate_trace(path)
    assert all(r.ok for r in reports), [r for r in reports if not r.ok]
