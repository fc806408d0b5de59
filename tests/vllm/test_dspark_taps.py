"""DSpark taps inside vLLM's real DSparkSpeculator on CPU (issue 5, tests a and b).

The draft model is vLLM's own ``Qwen3DSparkForCausalLM`` loaded from the zoo's DSpark
checkpoint; ``_sample_sequential`` (greedy) runs on fixed backbone outputs. The values
the taps record must equal the reference engine's standalone Markov step
(``dspark_markov_step``) on the same inputs, with weights read from the checkpoint files
(not from vLLM's modules).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

pytest.importorskip("vllm")

import torch
from v2_propose import propose_as_v2_runner, wrapped_draft_step

from dsparklab.engines.vllm import dspark_taps, patching, plugin, runs
from dsparklab.engines.vllm.config import TapConfig
from dsparklab.engines.vllm.core import HeadColumns
from dsparklab.store import read_trace, validate_trace

if TYPE_CHECKING:
    from conftest import CpuDSpark

pytestmark = pytest.mark.vllm

ATOL = 1e-5


@pytest.fixture
def taps(tmp_path: Path) -> Iterator[Path]:
    """The plugin's taps installed for one test (then removed)."""
    patching.install(TapConfig(trace_dir=tmp_path / "taps", run_name="test", flush_seconds=60))
    try:
        yield tmp_path / "taps"
    finally:
        runs.close_worker()
        patching.uninstall()


@pytest.fixture
def tapped_speculator(cpu_dspark: CpuDSpark, build_speculator: Any, taps: Path) -> Any:
    """vLLM's DSparkSpeculator (dense drafting) built with the plugin's taps installed."""
    return build_speculator(cpu_dspark)


def _run(spec: Any, head_hidden: torch.Tensor, rows: int) -> torch.Tensor:
    with torch.inference_mode():
        spec._sample_sequential(rows, head_hidden)
    return spec.draft_tokens[:rows].clone()


@pytest.mark.parametrize("positions_at_end", [True, False], ids=["cpu-way", "graph-way"])
def test_dense_taps_equal_reference_markov_step(
    cpu_dspark: CpuDSpark,
    tapped_speculator: Any,
    feed_speculator: Any,
    expected_markov_fn: Any,
    positions_at_end: bool,
) -> None:
    """Both ways the tap takes a step's positions give the reference values: all at once at
    the step's end (on a CPU) and one by one (on an accelerator, under a captured graph)."""
    spec = tapped_speculator
    tap = spec.__dict__.get("_dsparklab_tap")
    assert tap is not None
    assert tap.positions_at_end  # on this CPU
    tap.positions_at_end = positions_at_end
    assert tap.buffers is not None
    assert tap.buffers.confidence.shape == (cpu_dspark.max_num_reqs, cpu_dspark.n)
    assert not spec.use_confidence_head  # adaptive verification off: vLLM skips the head
    rows = 5
    head_hidden, anchors = feed_speculator(spec, rows, seed=1)
    drafted = _run(spec, head_hidden, rows)
    exp = expected_markov_fn(spec, head_hidden, anchors)

    assert torch.equal(drafted, exp["tokens"])
    buffers = tap.buffers
    for name in ("markov_bias", "confidence", "markov_bias_norm"):
        torch.testing.assert_close(
            getattr(buffers, name)[:rows], exp[name].float(), atol=ATOL, rtol=0, msg=name
        )
    for name in ("draft_logprob", "base_logprob"):  # log-sum-exp over the vocabulary
        torch.testing.assert_close(
            getattr(buffers, name)[:rows], exp[name].float(), atol=1e-4, rtol=0, msg=name
        )
    assert torch.equal(buffers.markov_flip[:rows], exp["markov_flip"])
    # rows past the batch are untouched
    assert torch.isnan(buffers.confidence[rows:]).all()
    # from the next step on, a tap on a CPU evaluates the head as the affine map it is,
    # checked against vLLM's head on the first step's inputs
    assert isinstance(tap.head_map, HeadColumns)
    buffers.confidence.fill_(float("nan"))
    assert torch.equal(_run(spec, head_hidden, rows), exp["tokens"])
    torch.testing.assert_close(
        buffers.confidence[:rows], exp["confidence"].float(), atol=1e-6, rtol=0
    )


def test_a_step_short_of_a_field_records_it_as_not_computed(
    tapped_speculator: Any, feed_speculator: Any
) -> None:
    """On a CPU a dense step marks its rows "not computed" at its end, once it knows what it
    wrote: a later step whose Markov hook is skipped, or that has no confidence, leaves
    those fields null, never the earlier step's values."""
    spec = tapped_speculator
    tap = spec.__dict__["_dsparklab_tap"]
    buffers, rows = tap.buffers, 4
    head_hidden, _ = feed_speculator(spec, rows, seed=6)
    _run(spec, head_hidden, rows)
    for name in ("markov_bias", "draft_logprob", "base_logprob", "confidence"):
        assert torch.isfinite(getattr(buffers, name)[:rows]).all(), name
    model = spec.model
    wrapped = model.markov_bias
    model.markov_bias = wrapped.__wrapped__  # the draft model's own path skips the hook
    try:
        _run(spec, head_hidden, rows)
    finally:
        model.markov_bias = wrapped
    for name in ("markov_bias", "draft_logprob", "markov_bias_norm", "base_logprob"):
        assert torch.isnan(getattr(buffers, name)[:rows]).all(), name
    assert (buffers.markov_flip[:rows] == -1).all()
    assert torch.isfinite(buffers.confidence[:rows]).all()  # the head still ran
    head = model.model.confidence_head
    model.model.confidence_head = None  # no head: no confidence this step
    try:
        _run(spec, head_hidden, rows)
    finally:
        model.model.confidence_head = head
    assert torch.isnan(buffers.confidence[:rows]).all()
    assert torch.isfinite(buffers.markov_bias[:rows]).all()
    assert (buffers.markov_flip[:rows] >= 0).all()


def test_a_head_that_is_not_affine_stays_vllms(
    tapped_speculator: Any, feed_speculator: Any, expected_markov_fn: Any
) -> None:
    """A confidence head whose map does not reproduce it (here: squared) is left to vLLM."""
    spec = tapped_speculator
    tap = spec.__dict__["_dsparklab_tap"]
    head = spec.model.model.confidence_head
    affine = head.forward
    head.forward = lambda hidden, embeds: affine(hidden, embeds) ** 2
    rows = 3
    head_hidden, anchors = feed_speculator(spec, rows, seed=4)
    for _ in range(2):
        _run(spec, head_hidden, rows)
        assert tap.head_map is False
        want = torch.sigmoid(
            torch.logit(expected_markov_fn(spec, head_hidden, anchors)["confidence"]) ** 2
        )
        torch.testing.assert_close(tap.buffers.confidence[:rows], want.float(), atol=ATOL, rtol=0)


def test_topk_taps_match_the_candidates(
    cpu_dspark: CpuDSpark,
    build_speculator: Any,
    feed_speculator: Any,
    checkpoint: dict[str, Any],
    taps: Path,
) -> None:
    k = 6
    spec = build_speculator(cpu_dspark, topk=k)
    tap = spec.__dict__["_dsparklab_tap"]
    rows = 4
    head_hidden, anchors = feed_speculator(spec, rows, seed=2)
    drafted = _run(spec, head_hidden, rows)

    # by hand: the bias is added to the k best base candidates only
    head, n = checkpoint["head"], spec.num_speculative_steps
    sample_hidden = head_hidden[spec.sample_indices[: rows * n]].float()
    base = (sample_hidden @ checkpoint["lm_head"].t()).view(rows, n, -1)
    values, index = base.topk(k, dim=-1)
    prev = anchors.clone()
    embeds = []
    for i in range(n):
        embeds.append(head.w1[prev])  # the top-k chain's own Markov embedding
        bias = (head.w1[prev] @ head.w2.t()).gather(1, index[:, i])  # [R, k]
        final = values[:, i] + bias
        slot = final.argmax(dim=-1, keepdim=True)
        token = index[:, i].gather(1, slot).squeeze(1)
        assert torch.equal(drafted[:, i], token)
        torch.testing.assert_close(
            tap.buffers.markov_bias[:rows, i], bias.gather(1, slot).squeeze(1), atol=ATOL, rtol=0
        )
        flip = (token != index[:, i, 0]).to(torch.int8)
        assert torch.equal(tap.buffers.markov_flip[:rows, i], flip)
        expected_lp = torch.log_softmax(final, -1).gather(1, slot).squeeze(1)
        torch.testing.assert_close(
            tap.buffers.draft_logprob[:rows, i], expected_lp, atol=ATOL, rtol=0
        )
        base_lp = torch.log_softmax(base[:, i], -1).gather(1, token.unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(tap.buffers.base_logprob[:rows, i], base_lp, atol=1e-4, rtol=0)
        prev = token
    assert torch.isnan(tap.buffers.markov_bias_norm[:rows]).all()  # not computed in top-k
    # the confidence follows the top-k chain, which may part from the dense argmax chain
    features = torch.cat([sample_hidden.view(rows, n, -1), torch.stack(embeds, 1)], dim=-1)
    confidence = torch.sigmoid(
        torch.nn.functional.linear(features, head.confidence_weight, head.confidence_bias)
    ).squeeze(-1)
    torch.testing.assert_close(tap.buffers.confidence[:rows], confidence, atol=ATOL, rtol=0)


def test_tracing_off_changes_nothing(
    cpu_dspark: CpuDSpark, build_speculator: Any, feed_speculator: Any, tmp_path: Path, monkeypatch
) -> None:
    from vllm.v1.worker.gpu.spec_decode.dspark.speculator import DSparkSpeculator

    # 1. DSPARKLAB_TRACE_DIR unset: register() installs nothing
    monkeypatch.delenv("DSPARKLAB_TRACE_DIR", raising=False)
    before = {
        name: DSparkSpeculator.__dict__[name] for name in ("_sample_sequential", "load_draft_model")
    }
    plugin.register()
    assert not patching.is_installed()
    assert {n: DSparkSpeculator.__dict__[n] for n in before} == before
    rows = 6
    plain = build_speculator(cpu_dspark)
    assert "_dsparklab_tap" not in plain.__dict__
    hidden, _ = feed_speculator(plain, rows, seed=3)
    plain_tokens = _run(plain, hidden, rows)
    plain_topk = build_speculator(cpu_dspark, topk=5)
    feed_speculator(plain_topk, rows, seed=3)
    plain_topk_tokens = _run(plain_topk, hidden, rows)

    # 2. taps installed: identical drafts
    patching.install(TapConfig(trace_dir=tmp_path / "taps", flush_seconds=60))
    try:
        tapped = build_speculator(cpu_dspark)
        feed_speculator(tapped, rows, seed=3)
        assert torch.equal(_run(tapped, hidden, rows), plain_tokens)
        tapped_topk = build_speculator(cpu_dspark, topk=5)
        feed_speculator(tapped_topk, rows, seed=3)
        assert torch.equal(_run(tapped_topk, hidden, rows), plain_topk_tokens)

        # 3. tracing switched off at run time (fail-open state): buffers stay empty
        off = build_speculator(cpu_dspark)
        off.__dict__["_dsparklab_tap"].active = False
        feed_speculator(off, rows, seed=3)
        assert torch.equal(_run(off, hidden, rows), plain_tokens)
        bufs = off.__dict__["_dsparklab_tap"].buffers
        assert torch.isnan(bufs.confidence).all()
        assert torch.isnan(bufs.markov_bias).all()
        assert (bufs.markov_flip == -1).all()
    finally:
        runs.close_worker()
        patching.uninstall()
    assert DSparkSpeculator.__dict__["_sample_sequential"] is before["_sample_sequential"]


def test_tap_error_fails_open(
    cpu_dspark: CpuDSpark,
    build_speculator: Any,
    feed_speculator: Any,
    taps: Path,
    monkeypatch,
    caplog,
) -> None:
    rows = 3
    plain_spec = build_speculator(cpu_dspark)
    plain_spec.__dict__["_dsparklab_tap"].active = False
    hidden, _ = feed_speculator(plain_spec, rows, seed=4)
    expected = _run(plain_spec, hidden, rows)

    spec = build_speculator(cpu_dspark)
    tap = spec.__dict__["_dsparklab_tap"]

    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("injected tap failure")

    monkeypatch.setattr(dspark_taps, "dense_position_values", broken)
    feed_speculator(spec, rows, seed=4)
    with caplog.at_level("ERROR", logger="dsparklab.engines.vllm.staging"):
        assert torch.equal(_run(spec, hidden, rows), expected)
        assert torch.equal(_run(spec, hidden, rows), expected)  # second step: still quiet
    errors = [r for r in caplog.records if "tap error" in r.getMessage()]
    assert len(errors) == 1
    assert "injected tap failure" in errors[0].getMessage()
    assert not tap.active
    assert tap.recorder.closed
    assert tap.recorder.failed


def test_records_are_keyed_by_request_id(
    tapped_speculator: Any, feed_speculator: Any, expected_markov_fn: Any
) -> None:
    """Two draft steps through the plugin's propose wrapper, rows re-sorted in between
    (around a stand-in draft step, called as the V2 model runner calls it: v2_propose)."""
    spec = tapped_speculator
    tap = spec.__dict__["_dsparklab_tap"]
    n = spec.num_speculative_steps
    req_ids = ["a-0123abcd", "b-89abcdef", "c-deadbeef"]
    draft_inputs: dict[str, Any] = {}
    propose = wrapped_draft_step(draft_inputs)
    contiguous: list[tuple[str, bool]] = []  # each staging copy: both sides contiguous?
    copy_in = tap.ring.copy_in

    def spied_copy_in(slot: Any, name: str, src: torch.Tensor) -> None:
        dst = slot.tensors[name][tuple(map(slice, src.shape))]
        contiguous.append((name, src.is_contiguous() and dst.is_contiguous()))
        copy_in(slot, name, src)

    tap.ring.copy_in = spied_copy_in

    def step(
        order: list[int], sampled: list[int], rejected: list[int], seq: list[int], scheduled: int
    ) -> None:
        # the fields of vLLM's V2 InputBatch the wrapper reads
        batch = SimpleNamespace(
            num_reqs=len(order),
            req_ids=[req_ids[i] for i in order],
            seq_lens=torch.tensor(seq, dtype=torch.int32),
            idx_mapping=torch.tensor(order),
            num_scheduled_tokens=np.full(len(order), scheduled, dtype=np.int32),
        )
        propose_as_v2_runner(
            propose,
            spec,
            batch,
            torch.tensor(sampled, dtype=torch.int32),
            torch.tensor(rejected, dtype=torch.int32),
            torch.tensor([100, 101, 102]),  # last_sampled, per request state
            num_speculative_tokens=n,
        )

    # step A: prefill done for a, b, c (one token sampled, nothing verified), then a draft
    hidden_a, anchors_a = feed_speculator(spec, 3, seed=5)
    draft_inputs.update(rows=3, hidden=hidden_a)
    step([0, 1, 2], [1, 1, 1], [0, 0, 0], [7, 9, 11], scheduled=7)  # the prompts' prefill
    drafts_a = spec.draft_tokens[:3].clone()
    exp_a = expected_markov_fn(spec, hidden_a, anchors_a)
    assert torch.equal(drafts_a, exp_a["tokens"])
    # step B: rows re-sorted (c, a, b); c accepted 2 of n, a accepted all, b none
    sampled = {"c": 3, "a": n + 1, "b": 1}
    rejected = {"c": n - 2, "a": 0, "b": n}
    order = [2, 0, 1]
    names = ["a", "b", "c"]
    feed_speculator(spec, 3, seed=6)
    step(
        order,
        [sampled[names[i]] for i in order],
        [rejected[names[i]] for i in order],
        [8 + n, 10 + n, 12 + n],
        scheduled=1 + n,  # the bonus token and the n drafts verified
    )
    runs.flush_worker()
    run_dir = tap.recorder.run_dir
    runs.close_worker()

    # a non-contiguous copy into pinned memory would wait for the GPU: none is
    assert {"floats", "markov_flip"} <= {name for name, _ in contiguous}
    assert all(ok for _, ok in contiguous), contiguous
    assert all(r.ok for r in validate_trace(run_dir))
    steps = read_trace(run_dir, "steps").set_index("request_id")
    positions = read_trace(run_dir, "positions").sort_values(["request_id", "position"])
    assert set(steps.index) == set(req_ids)
    for row, req in enumerate(req_ids):
        name = names[row]
        step = steps.loc[req]
        assert step["prompt_id"] == req.split("-")[0]
        assert step["accepted_len"] == sampled[name] - 1
        assert step["num_verified"] == sampled[name] - 1 + rejected[name]
        assert step["context_len"] == [7, 9, 11][row] + 1
        pos = positions[positions["request_id"] == req]
        assert pos["draft_token"].tolist() == drafts_a[row].tolist()
        assert pos["accepted"].tolist() == [p < sampled[name] - 1 for p in range(n)]
        emitted = 100 + row  # last_sampled[idx_mapping]
        accepted = sampled[name] - 1
        if accepted < n:
            assert pos["target_token"].iloc[accepted] == emitted
        for field in ("markov_bias", "confidence"):
            torch.testing.assert_close(
                torch.tensor(pos[field].tolist()), exp_a[field][row].float(), atol=ATOL, rtol=0
            )


def test_each_row_is_scaled_by_its_request_states_temperature() -> None:
    """``state_scale``: T for a sampling row, 1 for a greedy one (-1, a padding slot, reads
    state 0); no division where no request state samples, whatever the rows."""
    states = torch.tensor([2, 0, -1])
    greedy = SimpleNamespace(temperature=torch.zeros(4))
    assert dspark_taps.state_scale(greedy, states) is None
    sampling = SimpleNamespace(temperature=torch.tensor([0.0, 0.0, 0.5, 2.0]))
    scale = dspark_taps.state_scale(sampling, states)
    assert scale is not None and scale[:, 0].tolist() == [0.5, 1.0, 1.0]
    # a sampling state outside the batch: its greedy rows are not divided either
    assert dspark_taps.state_scale(sampling, torch.tensor([0, 1])) is None
    assert dspark_taps.state_scale(SimpleNamespace(), states) is None  # no temperature kept
