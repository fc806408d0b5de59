"""The taps' pure parts: tap math, staging, recorder bookkeeping, tallies, settings.

No vLLM needed; the vLLM-facing behaviour is in test_dspark_taps.py and test_e2e_eagle3.py.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest
import torch

from dsparklab.engines.stats import DraftStats
from dsparklab.engines.vllm import (
    TAP_FIELDS,
    StagingRing,
    TapBuffers,
    TapConfig,
    TapConfigError,
    TraceRecorder,
    dense_position_values,
    draft_index,
    external_request_id,
    first_argmax,
    tap_confidence,
    tap_topk_position,
    target_to_draft_index,
    temperature_scale,
    write_step,
)
from dsparklab.engines.vllm.columns import DraftBlock, StepRecords, VerifiedDrafts, tap_column
from dsparklab.engines.vllm.core import FLIP_UNSET, FLOAT_FIELDS
from dsparklab.engines.vllm.metrics import stats_from_vllm_metrics
from dsparklab.engines.vllm.step_cost import StepCost
from dsparklab.errors import DSparkLabError
from dsparklab.store import TraceWriter, new_run_json, read_run_json, read_trace, validate_trace
from dsparklab.store.reader import store_runs
from dsparklab.store.schema import POSITIONS_SCHEMA, STEPS_SCHEMA


def test_dense_position_matches_the_formulas() -> None:
    gen = torch.Generator().manual_seed(0)
    rows, n, vocab = 3, 4, 50
    base = torch.randn(rows, vocab, generator=gen) * 3
    bias = torch.randn(rows, vocab, generator=gen)
    final = base + bias
    tokens = final.argmax(-1)
    bufs = TapBuffers.allocate(5, n, "cpu")
    values = dense_position_values(bias[:, None], final[:, None], draft_index(tokens, None))
    base_argmax = torch.zeros(rows, n, dtype=torch.int64)
    base_argmax[:, 2] = base.argmax(-1)
    # one position alone: written in place
    write_step(bufs, [([2], values)], base_argmax)
    idx = tokens.unsqueeze(1)
    torch.testing.assert_close(bufs.markov_bias[:rows, 2], bias.gather(1, idx).squeeze(1))
    torch.testing.assert_close(
        bufs.draft_logprob[:rows, 2], torch.log_softmax(final, -1).gather(1, idx).squeeze(1)
    )
    torch.testing.assert_close(bufs.markov_bias_norm[:rows, 2], bias.norm(dim=-1))
    assert bufs.markov_flip[:rows, 2].tolist() == (base.argmax(-1) != tokens).int().tolist()
    # other columns and rows untouched
    assert torch.isnan(bufs.markov_bias[:, [0, 1, 3]]).all()
    assert torch.isnan(bufs.markov_bias[rows:]).all()
    assert (bufs.markov_flip[rows:] == -1).all()


def test_a_step_of_positions_is_written_at_once_as_one_by_one() -> None:
    gen = torch.Generator().manual_seed(3)
    rows, n, vocab = 3, 4, 40
    recorded = []
    base_argmax = torch.empty(rows, n, dtype=torch.int64)
    final_argmax = torch.empty(rows, n, dtype=torch.int64)
    bases, biases, finals, drafted = [], [], [], []
    for i in range(n):
        base, bias = (
            torch.randn(rows, vocab, generator=gen),
            torch.randn(rows, vocab, generator=gen),
        )
        final = base + bias
        base_argmax[:, i] = base.argmax(-1)
        final_argmax[:, i] = final.argmax(-1)
        base_argmax[0, i] = final_argmax[0, i]  # row 0 never flips, the others may
        # probabilistic drafts: row 1 drafts a token other than the final argmax
        tokens = final.argmax(-1)
        tokens[1] = (tokens[1] + 1) % vocab
        idx = draft_index(tokens, None)
        recorded.append(([i], dense_position_values(bias[:, None], final[:, None], idx)))
        bases.append(base)
        biases.append(bias)
        finals.append(final)
        drafted.append(idx)
    stacked, single = TapBuffers.allocate(5, n, "cpu"), TapBuffers.allocate(5, n, "cpu")
    # positions 0..n-1: one copy for the float fields; the base log-probs at the joined ids
    base = torch.stack(bases, 1)
    write_step(stacked, recorded, base_argmax, base)
    for position in recorded:
        write_step(single, [position], base_argmax)
    single.base_logprob[:rows].copy_(
        base.log_softmax(-1).gather(2, torch.cat(drafted, 1)[..., None])[..., 0]
    )
    for name, tensor in stacked.tensors().items():
        torch.testing.assert_close(tensor, single.tensors()[name], equal_nan=True)
    # the whole step at once (the DSpark tap's way on a CPU) gives the same values
    at_once = TapBuffers.allocate(5, n, "cpu")
    step = dense_position_values(
        torch.stack(biases, 1), torch.stack(finals, 1), torch.cat(drafted, 1)
    )
    write_step(at_once, [(list(range(n)), step)], base_argmax, base)
    for name, tensor in stacked.tensors().items():
        torch.testing.assert_close(tensor, at_once.tensors()[name], equal_nan=True)
    assert stacked.markov_flip[0, :n].tolist() == [0] * n
    # the flip compares the final argmax, not the drafted token
    assert stacked.markov_flip[1, :n].tolist() == (base_argmax[1] != final_argmax[1]).tolist()
    # a step whose hook was skipped at position 1: the others land in their own columns
    gap = TapBuffers.allocate(5, n, "cpu")
    write_step(gap, [recorded[0], *recorded[2:]], base_argmax)
    assert torch.isnan(gap.markov_bias[:rows, 1]).all()
    assert (gap.markov_flip[:rows, 1] == -1).all()
    torch.testing.assert_close(gap.markov_bias[:rows, 3], stacked.markov_bias[:rows, 3])
    torch.testing.assert_close(gap.markov_flip[:rows, 3], stacked.markov_flip[:rows, 3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_argmax_is_torchs_first_maximum(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(5)
    # coarse values: many ties at the maximum, as bf16 logits have
    x = torch.randint(0, 6, (3, 4, 40), generator=gen).to(dtype)
    x[1, 2, 7] = float("nan")  # a NaN counts as the largest, as in torch
    got = first_argmax(x)
    assert got.dtype == torch.int64
    assert got.tolist() == x.argmax(dim=-1).tolist()


def test_an_all_greedy_cpu_batch_is_not_divided() -> None:
    assert temperature_scale(torch.zeros(3)) is None
    scale = temperature_scale(torch.tensor([0.0, 0.7]))
    assert scale is not None and scale[:, 0].tolist() == pytest.approx([1.0, 0.7])


def test_the_zero_test_follows_writes_to_the_table_it_views() -> None:
    """``ZeroTest`` keeps a byte view of the table it was last asked about: a later write
    to that table (vLLM fills its temperature buffer in place) changes the answer; a
    negative zero or a NaN is not zero; another or a strided table is asked afresh."""
    from dsparklab.engines.vllm.core import ZeroTest

    all_zero, table = ZeroTest(), torch.zeros(6)
    assert all_zero(table)
    table[4] = 0.7
    assert not all_zero(table)
    table[4] = -0.0
    assert not all_zero(table)
    table[4] = float("nan")
    assert not all_zero(table)
    table[4] = 0.0
    assert all_zero(table)
    other = torch.zeros(2, 6)
    other[:, 1] = 1.0
    assert all_zero(other[:, 0]) and not all_zero(other[:, 1])  # strided views
    other[1, 0] = -0.0
    assert not all_zero(other[:, 0])  # a strided view reads its bytes as a whole one does
    assert all_zero(torch.zeros(3)) and all_zero(table)


def test_base_logprob_of_every_position_at_once() -> None:
    gen = torch.Generator().manual_seed(4)
    rows, n, vocab = 3, 4, 30
    base = torch.randn(rows, n, vocab, generator=gen)
    bias = torch.randn(rows, n, vocab, generator=gen)
    ids = torch.randint(0, vocab, (rows, n), generator=gen)
    scale = temperature_scale(torch.tensor([0.0, 0.5, 2.0]))
    step = dense_position_values(bias, base + bias, ids, scale=scale)
    bufs = TapBuffers.allocate(5, n, "cpu")
    write_step(bufs, [(list(range(n)), step)], first_argmax(base), base, scale)
    for r, t in enumerate((1.0, 0.5, 2.0)):
        want = torch.log_softmax(base[r] / t, -1).gather(1, ids[r, :, None]).squeeze(1)
        torch.testing.assert_close(bufs.base_logprob[r], want)
    assert torch.isnan(bufs.base_logprob[rows:]).all()
    # a step with a position missing has no base log-probabilities
    gap = TapBuffers.allocate(5, n, "cpu")
    cut = {name: value[:, : n - 1] for name, value in step.items()}
    write_step(gap, [(list(range(n - 1)), cut)], first_argmax(base), base, scale)
    assert torch.isnan(gap.base_logprob).all()
    torch.testing.assert_close(gap.markov_bias[:rows, : n - 1], bufs.markov_bias[:rows, : n - 1])


def test_logprobs_are_taken_at_the_request_temperature() -> None:
    gen = torch.Generator().manual_seed(3)
    base, bias = torch.randn(2, 20, generator=gen), torch.randn(2, 20, generator=gen)
    final = base + bias
    idx = draft_index(final.argmax(-1), None)
    bufs = TapBuffers.allocate(2, 1, "cpu")
    scale = temperature_scale(torch.tensor([0.0, 0.5]))
    values = dense_position_values(bias[:, None], final[:, None], idx, scale=scale)
    write_step(bufs, [([0], values)], base.argmax(-1, keepdim=True))
    expected = [
        torch.log_softmax(final[0], -1)[idx[0, 0]],  # greedy row: unscaled
        torch.log_softmax(final[1] / 0.5, -1)[idx[1, 0]],
    ]
    torch.testing.assert_close(bufs.draft_logprob[:, 0], torch.stack(expected))


def test_light_level_skips_the_vocabulary_reductions() -> None:
    base, bias = torch.randn(2, 30), torch.randn(2, 30)
    final = base + bias
    bufs = TapBuffers.allocate(2, 1, "cpu")
    idx = draft_index(final.argmax(-1), None)
    values = dense_position_values(bias[:, None], final[:, None], idx, level="light")
    write_step(bufs, [([0], values)], base.argmax(-1, keepdim=True))
    assert not torch.isnan(bufs.markov_bias).any()
    assert (bufs.markov_flip != -1).all()
    for name in ("draft_logprob", "base_logprob", "markov_bias_norm"):
        assert torch.isnan(getattr(bufs, name)).all(), name
    # greedy drafts are the final argmax: light reads no final logits then, and gives the same
    greedy = dense_position_values(bias[:, None], None, idx, level="light", greedy=True)
    assert {k: v.tolist() for k, v in greedy.items()} == {k: v.tolist() for k, v in values.items()}
    for level, is_greedy in (("full", True), ("light", False)):  # they are needed there
        with pytest.raises(ValueError, match="final logits are needed"):
            dense_position_values(bias[:, None], None, idx, level=level, greedy=is_greedy)


def test_topk_position_recovers_bias_and_flip() -> None:
    gen = torch.Generator().manual_seed(1)
    base = torch.randn(2, 40, generator=gen)
    values, index = base.topk(5, dim=-1)
    bias = torch.randn(2, 5, generator=gen) * 2
    final = values + bias
    slot = final.argmax(-1, keepdim=True)
    token = index.gather(1, slot).squeeze(1)
    bufs = TapBuffers.allocate(2, 1, "cpu")
    lse = torch.logsumexp(base, -1)
    tap_topk_position(bufs, 0, lse, values, index, final, draft_index(token, None))
    torch.testing.assert_close(bufs.markov_bias[:, 0], bias.gather(1, slot).squeeze(1))
    assert bufs.markov_flip[:, 0].tolist() == (token != index[:, 0]).int().tolist()
    torch.testing.assert_close(
        bufs.draft_logprob[:, 0], torch.log_softmax(final, -1).gather(1, slot).squeeze(1)
    )
    torch.testing.assert_close(
        bufs.base_logprob[:, 0], torch.log_softmax(base, -1).gather(1, token[:, None]).squeeze(1)
    )


def test_target_to_draft_index_inverts_d2t() -> None:
    draft_to_target = torch.tensor([0, 2, 5, 9])  # draft id i -> target id i + d2t[i]
    d2t = draft_to_target - torch.arange(4)
    t2d = target_to_draft_index(d2t, 12)
    assert t2d is not None
    assert t2d[draft_to_target].tolist() == [0, 1, 2, 3]
    assert draft_index(torch.tensor([9, 2]), t2d).squeeze(1).tolist() == [3, 1]
    # a step's ids at once, as read from a strided view of vLLM's int32 draft_tokens
    drafted = torch.tensor([[9, 2, 0], [5, 9, 0]], dtype=torch.int32)[:, :2]
    ids = draft_index(drafted, t2d)
    assert ids.shape == (2, 2, 1) and ids.dtype == torch.int64
    assert ids.squeeze(-1).tolist() == [[3, 1], [2, 3]]
    assert draft_index(drafted, None).squeeze(-1).tolist() == drafted.tolist()
    assert target_to_draft_index(None, 12) is None


def test_confidence_is_written_row_major() -> None:
    bufs = TapBuffers.allocate(4, 3, "cpu")
    tap_confidence(bufs, torch.arange(6, dtype=torch.float32), 2)
    assert bufs.confidence[:2].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert torch.isnan(bufs.confidence[2:]).all()


def test_staging_ring_hands_out_each_slot_once() -> None:
    ring = StagingRing({"x": ((4,), torch.int64)}, "cpu", num_slots=2)
    a, b = ring.acquire(), ring.acquire()
    assert a is not None
    assert b is not None
    assert a is not b
    assert ring.acquire() is None
    ring.copy_in(a, "x", torch.tensor([7, 8]))
    assert a.tensors["x"][:2].tolist() == [7, 8]
    assert a.ready()
    ring.release(a)
    assert ring.acquire() is a


def test_a_slots_arrays_are_its_tensors_memory() -> None:
    """The recorder reads a slot through numpy views made once: what a copy writes into the
    slot's tensors is what they read, for every field, the float block's rows included."""
    ring = StagingRing(
        {"x": ((4,), torch.int64), "floats": ((2, 4, 3), torch.float32)},
        "cpu",
        views={"a": ("floats", 0), "b": ("floats", 1)},
        num_slots=1,
    )
    slot = ring.acquire()
    assert slot is not None
    ring.copy_in(slot, "x", torch.tensor([7, 8]))
    ring.copy_in(slot, "floats", torch.arange(12.0).view(2, 2, 3))
    assert slot.arrays["x"][:2].tolist() == [7, 8]
    assert slot.arrays["b"][:2].tolist() == [[6.0, 7.0, 8.0], [9.0, 10.0, 11.0]]
    assert set(slot.arrays) == set(slot.tensors)


def test_tap_column_reads_not_computed_as_null() -> None:
    flip = np.array([1, 0, FLIP_UNSET], dtype=np.int8)
    assert tap_column("markov_flip", flip).to_pylist() == [True, False, None]
    values = np.array([-0.5, np.nan, np.float32(-0.1), 2.0], dtype=np.float32)
    column = tap_column("draft_logprob", values)
    assert column.type == pa.float32()
    assert column.to_pylist() == [-0.5, None, float(np.float32(-0.1)), 2.0]


def test_verified_drafts_become_positions_rows_in_the_order_added() -> None:
    """Drafts of two widths from three blocks (one without tap fields), added out of their
    blocks' order: one table, rows in the order added, the target token as the verifier
    gave it, "not computed" null."""
    floats = np.arange(16, dtype=np.float32).reshape(2, 8)
    floats[1, 1] = np.nan
    flip = np.array([[0, 1, FLIP_UNSET, 0, 1, 1, 0, 0]] * 2, dtype=np.int8)
    wide = DraftBlock.of(
        {"draft_tokens": np.arange(16).reshape(2, 8), "markov_bias": floats, "markov_flip": flip},
        num_reqs=2,
        k=3,
    )
    narrow = DraftBlock.of({"draft_tokens": np.full((4, 8), 7)}, num_reqs=1, k=2)
    wide_again = DraftBlock.of({"draft_tokens": np.full((1, 8), 5)}, num_reqs=1, k=3)
    drafts = VerifiedDrafts()
    drafts.add("b", 4, wide, 1, accepted=1, emitted=99)
    drafts.add("c", 0, narrow, 0, accepted=2, emitted=98)
    drafts.add("a", 2, wide, 0, accepted=0, emitted=97)
    drafts.add("d", 1, wide_again, 0, accepted=3, emitted=96)
    table = drafts.take_table()
    assert table.schema.equals(POSITIONS_SCHEMA)
    rows = table.to_pylist()
    assert [(r["request_id"], r["step"], r["position"]) for r in rows] == [
        ("b", 4, 0), ("b", 4, 1), ("b", 4, 2), ("c", 0, 0), ("c", 0, 1),
        ("a", 2, 0), ("a", 2, 1), ("a", 2, 2), ("d", 1, 0), ("d", 1, 1), ("d", 1, 2),
    ]  # fmt: skip
    assert [r["draft_token"] for r in rows] == [8, 9, 10, 7, 7, 0, 1, 2, 5, 5, 5]
    assert [r["target_token"] for r in rows] == [8, 99, None, 7, 7, 97, None, None, 5, 5, 5]
    assert [r["accepted"] for r in rows[:3]] == [True, False, False]
    assert [r["markov_bias"] for r in rows[:3]] == [8.0, None, 10.0]
    assert [r["markov_flip"] for r in rows[5:8]] == [False, True, None]
    assert {r["markov_bias"] for r in rows[3:5] + rows[8:]} == {None}
    assert {r["draft_logprob"] for r in rows} == {None}  # no block staged it
    assert len(drafts) == 0 and drafts.take_table().num_rows == 0


def test_step_records_become_steps_rows_with_their_shares() -> None:
    """A steps record per verified draft: one table in the steps schema, in the order
    added, the run's dataset on every row, ``emitted`` null (the front end cuts the output),
    the cost columns the request's share of its engine step (other null on V1)."""
    v2 = StepCost(4, 0.04, 0.008, 0.02, 0.002, 0.005, 0.003)
    v1 = StepCost(2, 0.02, 0.004, None, 0.002, 0.008, None)
    records = StepRecords("humaneval")
    records.add("b-0123abcd", "b", 3, 17, 3, 3, 2, v2)
    records.add("a-0123abcd", "a", 0, 9, 0, 0, 0, v1)
    table = records.take_table()
    assert table.schema.equals(STEPS_SCHEMA)
    first, second = table.to_pylist()
    assert first == {
        "request_id": "b-0123abcd", "prompt_id": "b", "dataset": "humaneval", "step": 3,
        "context_len": 17, "num_drafted": 3, "num_verified": 3, "accepted_len": 2,
        "emitted": None, "batch_size": 4, "draft_time_s": 0.002, "verify_time_s": 0.005,
        "other_time_s": 0.003,
    }  # fmt: skip
    assert (second["request_id"], second["verify_time_s"], second["other_time_s"]) == (
        "a-0123abcd",
        0.008,
        None,
    )
    assert len(records) == 0
    assert records.take_table().schema.equals(STEPS_SCHEMA)


def test_a_draft_block_reads_a_dspark_slot_through_its_float_block() -> None:
    """A DSpark slot stages its float fields as one block (:data:`FLOAT_VIEWS`): the block
    copies it once, and each field's column comes from its own row of it."""
    buffers = TapBuffers.allocate(4, N, "cpu")
    for i, name in enumerate(FLOAT_FIELDS):
        getattr(buffers, name).copy_(torch.full((4, N), float(i)))
    buffers.markov_flip.fill_(1)
    arrays = {name: t.numpy() for name, t in buffers.staged().items()}
    arrays["draft_tokens"] = np.zeros((4, N), dtype=np.int64)
    block = DraftBlock.of(arrays, num_reqs=2, k=N)
    buffers.floats.fill_(-1.0)  # the slot reused: the block kept its copy
    drafts = VerifiedDrafts()
    drafts.add("r", 0, block, 1, accepted=0, emitted=3)
    (row, *_) = drafts.take_table().to_pylist()
    assert {name: row[name] for name in FLOAT_FIELDS} == {
        name: float(i) for i, name in enumerate(FLOAT_FIELDS)
    }
    assert row["markov_flip"] is True


# -- recorder ---------------------------------------------------------------------------
N = 3


def _slot(
    ring: StagingRing,
    req_ids: list[str],
    drafts: list[list[int]],
    *,
    sampled: list[int],
    rejected: list[int],
    seq: list[int],
    last: list[int],
    bias: list[list[float]] | None = None,
):
    slot = ring.acquire()
    assert slot is not None
    rows = len(req_ids)
    ring.copy_in(slot, "num_sampled", torch.tensor(sampled, dtype=torch.int32))
    ring.copy_in(slot, "num_rejected", torch.tensor(rejected, dtype=torch.int32))
    ring.copy_in(slot, "seq_lens", torch.tensor(seq))
    ring.copy_in(slot, "last_token", torch.tensor(last))
    ring.copy_in(slot, "draft_tokens", torch.tensor(drafts))
    values = torch.full((rows, N), float("nan")) if bias is None else torch.tensor(bias)
    ring.copy_in(slot, "markov_bias", values)
    ring.copy_in(slot, "markov_flip", torch.full((rows, N), -1, dtype=torch.int8))
    slot.meta.update(req_ids=req_ids, num_drafted=N)
    return slot


def _ring() -> StagingRing:
    specs = {
        "num_sampled": ((4,), torch.int32),
        "num_rejected": ((4,), torch.int32),
        "seq_lens": ((4,), torch.int64),
        "last_token": ((4,), torch.int64),
        "draft_tokens": ((4, N), torch.int64),
        "markov_bias": ((4, N), torch.float32),
        "markov_flip": ((4, N), torch.int8),
    }
    return StagingRing(specs, "cpu", num_slots=3)


def test_recorder_resolves_drafts_by_request_id_across_resorted_rows() -> None:
    ring, rec = _ring(), TraceRecorder(N, dataset="d")
    # step A: two fresh requests (prefill just sampled), first drafts
    rec.stage(
        _slot(
            ring,
            ["x-0123abcd", "y-fedcba98"],
            [[1, 2, 3], [4, 5, 6]],
            sampled=[1, 1],
            rejected=[0, 0],
            seq=[5, 8],
            last=[0, 0],
            bias=[[0.5, float("nan"), 1.5], [1.0, 2.0, 3.0]],
        ),
        ring.release,
    )
    # step B: rows swapped; y accepted 1 of 3 (emitted 9 at position 1), x all 3 (+bonus)
    rec.stage(
        _slot(
            ring,
            ["y-fedcba98", "x-0123abcd"],
            [[7, 7, 7], [8, 8, 8]],
            sampled=[2, 4],
            rejected=[2, 0],
            seq=[8 + 4, 5 + 4],
            last=[9, 11],
        ),
        ring.release,
    )
    assert rec.process_ready() == 2
    steps = {s["request_id"]: s for s in rec.rows.steps}
    assert steps["y-fedcba98"]["accepted_len"] == 1
    assert steps["y-fedcba98"]["num_verified"] == 3
    assert steps["x-0123abcd"]["accepted_len"] == 3
    assert steps["x-0123abcd"]["context_len"] == 6
    assert steps["y-fedcba98"]["context_len"] == 9
    assert steps["x-0123abcd"]["prompt_id"] == "x"
    pos = {(p["request_id"], p["position"]): p for p in rec.rows.positions}
    assert [pos[("y-fedcba98", i)]["draft_token"] for i in range(N)] == [4, 5, 6]
    assert [pos[("y-fedcba98", i)]["target_token"] for i in range(N)] == [4, 9, None]
    assert [pos[("x-0123abcd", i)]["accepted"] for i in range(N)] == [True] * 3
    assert [pos[("x-0123abcd", i)]["markov_bias"] for i in range(N)] == [0.5, None, 1.5]
    assert pos[("x-0123abcd", 0)]["markov_flip"] is None
    assert rec.stats.accepted_per_pos == [2, 1, 1]
    assert len(rec.rows.requests) == 2
    # the new drafts are pending; a finished request drops its pending draft
    rec.finish_requests(["x-0123abcd"])
    rec.process_ready()
    assert "x-0123abcd" not in rec._pending
    assert "y-fedcba98" in rec._pending


def test_recorder_skips_unverified_and_prefill_rows() -> None:
    ring, rec = _ring(), TraceRecorder(N)
    rec.stage(_slot(ring, ["a"], [[1, 2, 3]], sampled=[0], rejected=[0], seq=[4], last=[0]))
    # chunked prefill (sampled 0): the draft above is discarded, nothing verified
    rec.stage(_slot(ring, ["a"], [[1, 2, 3]], sampled=[0], rejected=[0], seq=[8], last=[0]))
    # prefill done: one token sampled, zero drafts verified -> no step
    rec.stage(_slot(ring, ["a"], [[1, 2, 3]], sampled=[1], rejected=[0], seq=[9], last=[5]))
    rec.process_ready()
    assert rec.rows.steps == []
    assert rec.stats.num_steps == 0


def test_recorder_v1_host_counts() -> None:
    """Model Runner V1: verified counts and sequence bases come from the host."""
    ring, rec = _ring(), TraceRecorder(N)
    first = _slot(ring, ["r"], [[1, 2, 3]], sampled=[1], rejected=[0], seq=[0], last=[0])
    first.meta.update(num_verified=[0], seq_base=[10])
    rec.stage(first)
    second = _slot(ring, ["r"], [[4, 5, 6]], sampled=[2], rejected=[0], seq=[0], last=[42])
    second.meta.update(num_verified=[3], seq_base=[14])
    rec.stage(second)
    rec.process_ready()
    (step,) = rec.rows.steps
    assert (step["accepted_len"], step["num_verified"], step["context_len"]) == (1, 3, 11)
    assert [p["target_token"] for p in rec.rows.positions] == [1, 42, None]


def _writer(run_dir: Path, method: str) -> TraceWriter:
    """A writer for a vLLM run of ``method`` at n = N on dataset "d" (the recorder's rows)."""
    meta = new_run_json(
        run_id="t",
        engine={"name": "vllm"},
        method=method,
        num_speculative_tokens=N,
        target={"name": "t"},
        drafter={"name": "d"},
        dataset="d",
        sampling={},
    )
    return TraceWriter(run_dir, meta)


def test_recorder_writes_a_valid_trace(tmp_path: Path) -> None:
    ring = _ring()
    rec = TraceRecorder(N, dataset="d", writer=_writer(tmp_path / "run", "dspark"))
    rec.stage(_slot(ring, ["a"], [[1, 2, 3]], sampled=[1], rejected=[0], seq=[4], last=[0]))
    rec.stage(_slot(ring, ["a"], [[4, 5, 6]], sampled=[3], rejected=[1], seq=[8], last=[7]))
    rec.close()
    assert all(r.ok for r in validate_trace(tmp_path / "run"))
    positions = read_trace(tmp_path / "run", "positions")
    assert positions["accepted"].tolist() == [True, True, False]
    assert math.isnan(positions["markov_bias"].iloc[0])


def test_a_recorder_opens_its_run_when_made(tmp_path: Path) -> None:
    """The run directory and run.json (running) exist before any row: the flush thread's
    first turn, beside an engine step, writes no run.json of its own. A recorder that
    closes having recorded no request removes its run (a complete run holds rows)."""
    rec = TraceRecorder(N, dataset="d", writer=_writer(tmp_path / "run", "dspark"))
    assert read_run_json(tmp_path / "run")["status"] == "running"
    rec.close()
    assert not [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    # a request scheduled, even one that drafted nothing yet: the run stays
    rec = TraceRecorder(N, dataset="d", writer=_writer(tmp_path / "run", "dspark"))
    rec.start_requests(["a"])
    rec.close()
    assert read_run_json(tmp_path / "run")["status"] == "complete"


def test_recorder_fail_marks_the_run_failed(tmp_path: Path) -> None:
    rec = TraceRecorder(N, writer=_writer(tmp_path / "run", "eagle3"))
    rec.fail("boom")
    from dsparklab.store import read_run_json

    run = read_run_json(tmp_path / "run")
    assert run["status"] == "failed"
    assert run["error"] == "boom"


def _timed(slot, *, draft: float | None, step: float, forward=None, sample=None):
    """``slot`` as the step clock hands it on: host-clock marks of its draft pass, of the
    whole step and (Model Runner V2) of the target's forward and the sampler."""
    marks = {"step_start": 10.0, "step_end": 10.0 + step}
    if draft is not None:
        marks |= {"draft_start": 10.0 + step - draft, "draft_end": 10.0 + step}
    if forward is not None and sample is not None:
        marks |= {"forward_start": 10.0, "forward_end": 10.0 + forward}
        marks |= {"sample_start": 10.0 + forward, "sample_end": 10.0 + forward + sample}
    slot.clock.marks.update(marks)
    return slot


def test_recorder_shares_each_engine_step_over_its_batch(tmp_path: Path) -> None:
    """Three requests in one batch: each row carries a third of the step that verified it
    (draft: that step's draft pass; verify: the rest), never the whole batch's time."""
    ring = _ring()
    rec = TraceRecorder(N, dataset="d", writer=_writer(tmp_path / "run", "eagle3"))
    ids = ["a-00000000", "b-00000000", "c-00000000"]
    # step 1: the three prefills (first drafts, nothing verified); 2 s of which 0.5 s drafting
    first = _slot(
        ring, ids, [[1, 2, 3]] * 3, sampled=[1] * 3, rejected=[0] * 3, seq=[5] * 3, last=[0] * 3
    )
    rec.stage(_timed(first, draft=0.5, step=2.0))
    # step 2: a, b and c verify their drafts (1.2 s, 0.3 s drafting)
    second = _slot(
        ring,
        ids,
        [[4, 5, 6]] * 3,
        sampled=[2, 1, 4],
        rejected=[2, 3, 0],
        seq=[9] * 3,
        last=[7, 8, 9],
    )
    rec.stage(_timed(second, draft=0.3, step=1.2))
    # step 3: c left; a and b verify (0.8 s, 0.2 s drafting)
    third = _slot(
        ring, ids[:2], [[1, 1, 1]] * 2, sampled=[1, 1], rejected=[3, 3], seq=[12] * 2, last=[1, 1]
    )
    rec.stage(_timed(third, draft=0.2, step=0.8))
    rec.close()
    steps = read_trace(tmp_path / "run", "steps")
    assert steps["other_time_s"].isna().all()
    by_step = steps.groupby("step")
    assert by_step["batch_size"].unique().to_dict() == {0: [3], 1: [2]}
    assert steps.loc[steps["step"] == 0, "draft_time_s"].tolist() == [pytest.approx(0.1)] * 3
    assert steps.loc[steps["step"] == 0, "verify_time_s"].tolist() == [pytest.approx(0.3)] * 3
    assert steps.loc[steps["step"] == 1, "draft_time_s"].tolist() == [pytest.approx(0.1)] * 2
    assert steps.loc[steps["step"] == 1, "verify_time_s"].tolist() == [pytest.approx(0.3)] * 2
    # per engine step, the rows' shares add up to the step's time once
    total = steps["draft_time_s"] + steps["verify_time_s"]
    assert total[steps["step"] == 0].sum() == pytest.approx(1.2)
    assert (steps["batch_size"] * total).tolist() == [
        pytest.approx(t) for t in [1.2] * 3 + [0.8] * 2
    ]
    costs = read_run_json(tmp_path / "run")["step_costs"]
    assert costs["engine_steps"] == 3 and costs["batch_rows"] == 8 and costs["step_rows"] == 5
    assert costs["step_time_s"] == pytest.approx(4.0)
    assert costs["draft_time_s"] == pytest.approx(1.0)
    # the prefill step resolved nothing: its 2 s are unattributed
    assert costs["attributed_s"] == pytest.approx(total.sum()) == pytest.approx(2.0)
    assert costs["unattributed_s"] == pytest.approx(2.0)


def test_recorder_without_step_time_keeps_the_draft_share() -> None:
    """A step the clock did not time (no sample_tokens patch): draft share only."""
    ring, rec = _ring(), TraceRecorder(N)
    first = _slot(
        ring, ["a", "b"], [[1, 2, 3]] * 2, sampled=[1, 1], rejected=[0, 0], seq=[4, 4], last=[0, 0]
    )
    first.clock.marks.update(draft_start=1.0, draft_end=1.4)
    rec.stage(first)
    second = _slot(
        ring, ["a", "b"], [[1, 2, 3]] * 2, sampled=[2, 2], rejected=[2, 2], seq=[8, 8], last=[5, 5]
    )
    second.clock.marks.update(draft_start=2.0, draft_end=2.6)
    rec.stage(second)
    rec.process_ready()
    assert [(s["batch_size"], s["draft_time_s"], s["verify_time_s"]) for s in rec.rows.steps] == [
        (2, pytest.approx(0.3), None)
    ] * 2
    assert rec.costs.engine_steps == 0 and rec.costs.untimed_engine_steps == 2


def test_recorder_times_verify_and_other_apart_on_model_runner_v2() -> None:
    """V2 marks the target's forward and the sampler: verify = V / B, other = (T - V - D) / B,
    and the three shares add up to the step over its batch."""
    ring, rec = _ring(), TraceRecorder(N)
    ids = ["a", "b"]
    first = _slot(
        ring, ids, [[1, 2, 3]] * 2, sampled=[1, 1], rejected=[0, 0], seq=[4, 4], last=[0] * 2
    )
    rec.stage(_timed(first, draft=0.2, step=1.0, forward=0.5, sample=0.1))
    second = _slot(
        ring, ids, [[1, 2, 3]] * 2, sampled=[2, 4], rejected=[2, 0], seq=[8, 8], last=[5] * 2
    )
    rec.stage(_timed(second, draft=0.3, step=2.0, forward=1.0, sample=0.2))
    rec.process_ready()
    rows = [
        (s["batch_size"], s["draft_time_s"], s["verify_time_s"], s["other_time_s"])
        for s in rec.rows.steps
    ]
    assert rows == [(2, pytest.approx(0.15), pytest.approx(0.6), pytest.approx(0.25))] * 2
    assert rec.costs.verify_timed_steps == 2
    assert rec.costs.verify_time_s == pytest.approx(0.6 + 1.2)
    assert rec.costs.step_time_s == pytest.approx(3.0)


def test_recorder_target_only_on_model_runner_v2_reads_the_staged_counts() -> None:
    """V2's target-only slot has num_sampled in its tensor (copied from the device), and
    the step's forward and sampler marks: verify V / B, other (T - V) / B, no draft."""
    ring, rec = _ring(), TraceRecorder(0)
    for sampled, seq in (([1, 0], [4, 2]), ([1, 1], [5, 3]), ([1, 1], [6, 4])):
        slot = ring.acquire()
        assert slot is not None
        slot.meta.update(target_only=True, req_ids=["a", "b"], seq_base=seq)
        slot.tensors["num_sampled"][:2] = torch.tensor(sampled, dtype=torch.int32)
        rec.stage(_timed(slot, draft=None, step=1.0, forward=0.6, sample=0.2), ring.release)
    rec.process_ready()
    got = [
        (
            s["request_id"],
            s["context_len"],
            s["draft_time_s"],
            s["verify_time_s"],
            s["other_time_s"],
        )
        for s in rec.rows.steps
    ]
    # a: first token at step 1 (no row), then 2 rows; b: prefill chunk, first token, 1 row
    assert got == [
        ("a", 5, None, pytest.approx(0.4), pytest.approx(0.1)),
        ("a", 6, None, pytest.approx(0.4), pytest.approx(0.1)),
        ("b", 4, None, pytest.approx(0.4), pytest.approx(0.1)),
    ]


def _target_only(
    ring: StagingRing, req_ids: list[str], sampled: list[int], seq: list[int], step: float
):
    slot = ring.acquire()
    assert slot is not None
    slot.meta.update(target_only=True, req_ids=req_ids, num_sampled=sampled, seq_base=seq)
    slot.clock.marks.update(step_start=0.0, step_end=step)
    return slot, ring.release


def test_recorder_target_only_steps(tmp_path: Path) -> None:
    """One step per token after the first, each with its share of the engine step."""
    ring = _ring()
    meta = new_run_json(
        run_id="t",
        engine={"name": "vllm"},
        method="none",
        num_speculative_tokens=0,
        target={"name": "t"},
        drafter=None,
        dataset="d",
        sampling={},
    )
    rec = TraceRecorder(0, dataset="d", writer=TraceWriter(tmp_path / "run", meta))
    # a: a two-chunk prefill (the first chunk samples nothing), b: a one-chunk prefill
    rec.stage(*_target_only(ring, ["a", "b"], [0, 1], [4, 3], 0.6))
    rec.stage(*_target_only(ring, ["a", "b"], [1, 1], [8, 4], 0.9))  # a's first token; b's 2nd
    rec.stage(*_target_only(ring, ["b", "a"], [1, 1], [5, 9], 0.4))
    rec.finish_requests(["b"])
    assert rec.process_ready() == 3  # without a flush thread, the caller reads the slots
    rec.stage(*_target_only(ring, ["a"], [1], [10], 0.25))
    rec.close()
    steps = read_trace(tmp_path / "run", "steps").sort_values(["request_id", "step"])
    rows = steps[["request_id", "step", "context_len", "batch_size", "verify_time_s"]]
    assert [tuple(r) for r in rows.itertuples(index=False)] == [
        ("a", 0, 9, 2, pytest.approx(0.2)),
        ("a", 1, 10, 1, pytest.approx(0.25)),
        ("b", 0, 4, 2, pytest.approx(0.45)),
        ("b", 1, 5, 2, pytest.approx(0.2)),
    ]
    assert steps["draft_time_s"].isna().all() and (steps["num_drafted"] == 0).all()
    costs = read_run_json(tmp_path / "run")["step_costs"]
    assert (costs["engine_steps"], costs["batch_rows"], costs["step_rows"]) == (4, 7, 4)
    assert costs["attributed_s"] + costs["unattributed_s"] == pytest.approx(2.15)
    assert costs["attributed_s"] == pytest.approx(steps["verify_time_s"].sum())
    assert read_run_json(tmp_path / "run")["status"] == "complete"


@pytest.mark.parametrize(
    ("internal", "external"),
    [("0-1a2b3c4d", "0"), ("cmpl-abc-0-0123abcd", "cmpl-abc-0"), ("plain", "plain")],
)
def test_external_request_id(internal: str, external: str) -> None:
    assert external_request_id(internal) == external


# -- tallies and settings ----------------------------------------------------------------
def test_draft_stats_identities() -> None:
    stats = DraftStats.new(3)
    for drafted, accepted in [(3, 3), (3, 0), (2, 1)]:
        stats.observe_draft(drafted, accepted)
    assert stats.accepted_per_pos == [2, 1, 1]
    assert stats.num_accepted == sum(stats.accepted_per_pos) == 4
    assert (stats.num_steps, stats.num_drafted, stats.num_emitted) == (3, 8, 7)
    assert stats.mean_acceptance_length == pytest.approx(1 + 4 / 3)
    assert stats.conditional_acceptance_per_pos == [pytest.approx(2 / 3), 0.5, 1.0]
    assert DraftStats.new(3).mean_acceptance_length == 1.0
    merged = stats.merge(stats)
    assert merged.accepted_per_pos == [4, 2, 2]
    assert merged.num_steps == 6
    assert merged.since(stats) == stats
    assert stats.to_json()["mean_acceptance_length"] == stats.mean_acceptance_length
    with pytest.raises(DSparkLabError):
        stats.observe_draft(2, 3)
    with pytest.raises(DSparkLabError):
        stats.observe_draft(4, 0)  # more than n drafted
    with pytest.raises(DSparkLabError):
        stats.merge(DraftStats.new(2))


def test_stats_from_vllm_metrics_reads_vector_and_counters() -> None:
    metrics = [
        SimpleNamespace(
            name="vllm:spec_decode_num_accepted_tokens_per_pos", labels={}, values=[5, 3, 1]
        ),
        SimpleNamespace(name="vllm:spec_decode_num_drafts", labels={}, value=6),
        SimpleNamespace(name="vllm:spec_decode_num_accepted_tokens", labels={}, value=9),
        SimpleNamespace(name="vllm:other", labels={}, value=100),
    ]
    stats = stats_from_vllm_metrics(metrics, 3)
    assert stats.accepted_per_pos == [5, 3, 1]
    assert (stats.num_steps, stats.num_accepted, stats.num_emitted) == (6, 9, 15)


def test_tap_config_from_env() -> None:
    assert TapConfig.from_env({}) is None
    config = TapConfig.from_env({"DSPARKLAB_TRACE_DIR": "/tmp/x", "DSPARKLAB_TAP_LEVEL": "light"})
    assert config is not None
    assert config.level == "light"
    assert config.writer_ranks == "tp0"
    assert TapConfig.from_env(config.to_env()) == config
    with pytest.raises(TapConfigError, match="DSPARKLAB_TAP_LEVEL"):
        TapConfig.from_env({"DSPARKLAB_TRACE_DIR": "/x", "DSPARKLAB_TAP_LEVEL": "all"})
    with pytest.raises(TapConfigError, match="DSPARKLAB_FLUSH_SECONDS"):
        TapConfig.from_env({"DSPARKLAB_TRACE_DIR": "/x", "DSPARKLAB_FLUSH_SECONDS": "soon"})


def test_importing_the_engine_does_not_import_vllm() -> None:
    import subprocess

    code = (
        "import sys, dsparklab.engines.vllm, dsparklab.engines.vllm.plugin, "
        "dsparklab.engines.vllm.collect, dsparklab.engines.vllm.serve_client, "
        "dsparklab.engines.vllm.join; print('vllm' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


_LIGHT_PROBE = """
import sys
before = set(sys.modules)
import dsparklab.engines.vllm.plugin as plugin
plugin.register()
new = sorted(set(sys.modules) - before)
print("\\n".join(new))
"""


def test_entry_point_without_tracing_imports_only_the_standard_library() -> None:
    import os
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "DSPARKLAB_TRACE_DIR"}
    out = subprocess.run(
        [sys.executable, "-c", _LIGHT_PROBE], capture_output=True, text=True, check=True, env=env
    )
    new = [m for m in out.stdout.split() if m]
    ours = {m for m in new if m.split(".")[0] == "dsparklab"}
    others = [m for m in new if m not in ours and m.split(".")[0] not in sys.stdlib_module_names]
    assert others == [], others
    # the package's __init__ is lazy: only the entry point's own module is loaded
    assert ours == {
        "dsparklab",
        "dsparklab.engines",
        "dsparklab.engines.vllm",
        "dsparklab.engines.vllm.plugin",
    }, ours


def test_entry_point_with_tracing_loads_the_taps() -> None:
    # the switch is read at call time: set, register() goes on to the patching module
    import os
    import subprocess

    code = _LIGHT_PROBE.replace("print(", "print('torch' in new, ").replace(
        '"\\n".join(new)', "'dsparklab.engines.vllm.patching' in new"
    )
    env = {**os.environ, "DSPARKLAB_TRACE_DIR": "/nonexistent-dsparklab-probe"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


# -- the GPU benchmark's draft step, on CPU with tiny shapes -----------------------------
def _benchmark_module():
    # imported here: the killed-writer subprocess imports this module by its own path
    from tests.benchmark_scripts import load_benchmark

    return load_benchmark("gpu_tap_cost")


def test_benchmark_draft_step_taps_leave_tokens_unchanged() -> None:
    bench = _benchmark_module()
    shapes = bench.Shapes(vocab=64, hidden=16, n=4, markov_rank=8, mlp=32)
    weights = bench.make_weights(torch.device("cpu"), torch.float32, shapes)
    step = bench.make_step(3, weights)
    bench.draft_step(weights, step, taps=None, backbone=True)
    plain = step.draft_tokens.clone()
    assert torch.isnan(step.buffers.markov_bias).all()
    bench.draft_step(weights, step, taps="full", backbone=True)
    assert torch.equal(step.draft_tokens, plain)
    assert not torch.isnan(step.buffers.confidence).any()
    assert not torch.isnan(step.buffers.draft_logprob).any()


def test_benchmark_refuses_without_cuda(capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA present: the refusal path does not apply")
    assert _benchmark_module().main([]) == 2
    assert "CUDA is not available" in capsys.readouterr().err


# A writer that stops at SIGKILL, the way `vllm serve` ends its engine process at shutdown:
# it records request "a" (two draft steps) with the flush thread on, then, by mode,
#   idle:     records nothing, waits for the settled marker, is killed;
#   inflight: is killed once a part is on disk, "a" still running;
#   settled:  is told "a" finished, waits for the settled marker, is killed;
#   busy:     settles, then gets a new request "b" (the marker must go), is killed.
_KILLED_WRITER = """
import os, signal, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from test_tap_core import N, _ring, _slot
from dsparklab.engines.vllm import closing
from dsparklab.engines.vllm.closing import SETTLED_MARKER
from dsparklab.engines.vllm.recorder import TraceRecorder
from dsparklab.store import TraceWriter, new_run_json
from dsparklab.store.layout import table_location

store, mode = Path(sys.argv[1]), sys.argv[2]
meta = new_run_json(
    run_id="t", engine={"name": "vllm"}, method="eagle3", num_speculative_tokens=N,
    target={"name": "t"}, drafter=None, dataset="d", sampling={},
    config={"pid": os.getpid(), "ancestor_pids": closing.ancestor_pids()},
)
writer = TraceWriter(store, meta, flush_seconds=0.2)
run = Path(writer.run_dir.path)
rec = TraceRecorder(N, dataset="d", writer=writer, flush_seconds=0.2)
ring = _ring()
if mode != "idle":
    rec.start_requests(["a"])
    rec.stage(_slot(ring, ["a"], [[1, 2, 3]], sampled=[1], rejected=[0], seq=[4], last=[0]))
    rec.stage(_slot(ring, ["a"], [[4, 5, 6]], sampled=[3], rejected=[1], seq=[8], last=[7]))
    rec.stage(_slot(ring, ["a"], [[7, 8, 9]], sampled=[2], rejected=[2], seq=[11], last=[5]))


def wait_for(done):
    deadline = time.monotonic() + 30
    while not done():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


if mode == "inflight":
    wait_for(lambda: any(Path(table_location(run, "steps").path).glob("part-*.parquet")))
elif mode == "idle":  # an engine that served no request: settled from its first turn
    wait_for((run / SETTLED_MARKER).is_file)
else:
    rec.finish_requests(["a"])
    wait_for((run / SETTLED_MARKER).is_file)
    if mode == "busy":
        rec.start_requests(["b"])
        assert not (run / SETTLED_MARKER).exists()
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize(
    ("mode", "status"),
    [("inflight", "incomplete"), ("settled", "complete"), ("busy", "incomplete")],
)
def test_killed_writer_is_closed_from_its_settled_state(
    tmp_path: Path, mode: str, status: str
) -> None:
    """A SIGKILLed writer's run is closed by an ancestor: complete only if it had settled."""
    import subprocess

    from dsparklab.engines.vllm import closing
    from dsparklab.engines.vllm.closing import SETTLED_MARKER
    from dsparklab.store import read_run_json

    store = tmp_path / "taps"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(store), mode, str(Path(__file__).parent)],
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -9, stderr[-3000:]
    (found,) = store_runs(store)
    run = Path(found.path)
    assert read_run_json(run)["status"] == "running"
    closed = closing.close_runs_of_dead_descendants(tmp_path / "taps", wait_s=0)
    assert closed == {str(run): status}
    meta = read_run_json(run)
    assert meta["status"] == status
    assert meta["ended"]["writer_pid"] == proc.pid
    assert not (run / SETTLED_MARKER).exists()
    # every step recorded before the kill was written and stays readable
    steps = read_trace(run, "steps")
    assert steps["accepted_len"].tolist() == [2, 1], steps
    assert meta["rows"]["steps"] == 2
    assert meta["parts"]["steps"] >= 1
    (report,) = validate_trace(run)
    assert report.ok, [str(v) for v in report.violations]
    assert report.complete == (status == "complete")
    # closing again changes nothing
    assert closing.close_runs_of_dead_descendants(tmp_path / "taps", wait_s=0) == {}


def test_a_killed_writer_that_recorded_no_request_leaves_no_run(tmp_path: Path) -> None:
    """An engine that served nothing and was SIGKILLed (a server shut down before any
    traffic, an idle data-parallel rank): its closer removes the run, as its writer would
    have; nothing is left for validate to call a complete run without rows."""
    import subprocess

    from dsparklab.engines.vllm import closing

    store = tmp_path / "taps"
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(store), "idle", str(Path(__file__).parent)],
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -9, stderr[-3000:]
    (found,) = store_runs(store)
    closed = closing.close_runs_of_dead_descendants(store, wait_s=0)
    assert closed == {str(found): closing.REMOVED}
    assert not [p for p in store.rglob("*") if p.is_file()]
    assert closing.close_runs_of_dead_descendants(store, wait_s=0) == {}


def test_the_sharded_path_says_in_run_json_which_rows_it_records(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.34's batch-sharded sampling: a rank records the rows it samples. run.json
    marks the DSpark position fields partial with the rule, the log says it once, and
    vLLM's call goes on (the values themselves: ``test_vllm_lines.py``, on 0.34's code)."""
    from dsparklab.engines.vllm import dspark_taps
    from dsparklab.engines.vllm.staging import TAP_ATTR

    monkeypatch.setattr(dspark_taps, "tensor_parallel_rank_and_size", lambda: (0, 2))
    rec = TraceRecorder(N, dataset="d", writer=_writer(tmp_path / "run", "dspark"))
    tap = dspark_taps.DSparkTap(
        recorder=rec, n=N, max_num_reqs=4, device=torch.device("cpu"), level="full"
    )
    calls: list[int] = []

    class Speculator:
        model = None

        def _sample_sequential_sharded(self, num_reqs: int, head_hidden: torch.Tensor) -> None:
            calls.append(num_reqs)

    wrapped = dspark_taps.wrap_sample_sequential_sharded(
        Speculator.__dict__["_sample_sequential_sharded"]
    )
    spec = Speculator()
    spec.__dict__[TAP_ATTR] = tap
    with caplog.at_level("WARNING"):
        for _ in range(3):
            wrapped(spec, 3, torch.zeros(1))
    assert calls == [3, 3, 3]
    assert tap.active and not tap.in_step and tap.shard is None
    fields = rec.writer.meta["recorded_fields"]
    assert set(fields) == set(TAP_FIELDS)
    assert all(v.startswith("partial: batch-sharded sequential sampling") for v in fields.values())
    assert all("written by rank 0" in v for v in fields.values())
    warned = [r for r in caplog.records if "batch-sharded" in r.getMessage()]
    assert len(warned) == 1, "one line, once"
    # each staged step says whether vLLM shards the sampling (a load-time fact, asked on the
    # host at every step: a replayed graph runs none of the taps' Python), so the recorder
    # knows whose rows are whose
    staged: list[dict] = []
    monkeypatch.setattr(tap, "hand_on", lambda slot: staged.append(dict(slot.meta)))
    tap.spec = spec
    for comm in (None, object()):
        spec._sharded_sequential_comm = comm
        slot = tap.acquire()
        slot.meta["req_ids"] = ["a", "b", "c"]
        tap.after(slot, torch.zeros(3, N, dtype=torch.int64))
    assert "sharded_over" not in staged[0] and staged[1]["sharded_over"] == 2
    rec.start_requests(["a", "b", "c"])  # a run that served requests is kept at close
    rec.close()
    assert read_run_json(tmp_path / "run")["recorded_fields"] == fields
    # in a run every TP rank writes, no field is partial
    joined = TraceRecorder(
        N, dataset="d", writer=_writer(tmp_path / "joined", "dspark"), joined_rank=1
    )
    tap = dspark_taps.DSparkTap(
        recorder=joined, n=N, max_num_reqs=4, device=torch.device("cpu"), level="full"
    )
    spec.__dict__[TAP_ATTR] = tap
    wrapped(spec, 3, torch.zeros(1))
    assert tap.active and "recorded_fields" not in joined.writer.meta


def test_a_sharded_step_moves_each_slot_to_its_batch_row() -> None:
    """Rank 1 of 2 samples rows 1, 3 of a 4-row batch as slots 0, 1: their values go to
    rows 1 and 3, rows 0 and 2 become "not computed"."""
    from dsparklab.engines.vllm.core import FLIP_UNSET, BatchShard, TapBuffers

    buffers = TapBuffers.allocate(6, N, "cpu")
    buffers.reset_()
    buffers.draft_logprob[:2] = torch.tensor([[1.0] * N, [2.0] * N])
    buffers.markov_flip[:2] = torch.tensor([[1] * N, [0] * N], dtype=torch.int8)
    BatchShard(rank=1, size=2, num_reqs=4).to_batch_rows_(buffers)
    assert buffers.draft_logprob[[1, 3], 0].tolist() == [1.0, 2.0]
    assert torch.isnan(buffers.draft_logprob[[0, 2]]).all()
    assert buffers.markov_flip[[1, 3], 0].tolist() == [1, 0]
    assert (buffers.markov_flip[[0, 2]] == FLIP_UNSET).all()
    assert BatchShard(rank=0, size=2, num_reqs=5).slots == 3


def test_the_tp_ranks_of_a_batch_sharded_engine_write_one_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM 0.34's batch-sharded DSpark sampling: each TP rank writes the position rows of
    the batch rows it sampled (row r on rank r mod 2) into one run, which both ranks name
    alike from vLLM's instance id; rank 0 owns it (run.json, steps, requests). A step vLLM
    sampled whole on every rank (no ``sharded_over``) is the owner's to write."""
    from dsparklab.engines.vllm import runs
    from dsparklab.store.location import Location
    from dsparklab.store.schema import JOINED_WRITERS

    monkeypatch.setattr(runs, "STATE", runs.RunState())
    runs.STATE.config = TapConfig(trace_dir=Location.of(tmp_path), dataset="d", flush_seconds=0)
    vllm_config = SimpleNamespace(
        parallel_config=SimpleNamespace(
            tensor_parallel_size=2, enable_batch_sharded_sampling=True, data_parallel_rank=0
        ),
        speculative_config=SimpleNamespace(method="dspark", num_speculative_tokens=N, model="d"),
        model_config=SimpleNamespace(model="t"),
        instance_id="1764950000000000000",
    )
    recorders = {}
    for tp in (0, 1):
        monkeypatch.setattr(runs, "_parallel_ranks", lambda _config, tp=tp: runs.Ranks(tp=tp))
        engine = SimpleNamespace(vllm_config=vllm_config, max_num_reqs=4, device="cpu")
        tap = runs.make_tap(engine, model_runner="v2")
        assert tap is not None, f"TP rank {tp} records"
        recorders[tp] = tap.recorder
    run_dir = recorders[0].run_dir
    assert run_dir is not None and recorders[1].run_dir == run_dir
    assert run_dir.name.endswith("-dp0-1764950000000000000")
    nan = float("nan")
    ring = _ring()
    for tp, rec in recorders.items():
        # step A: x (row 0) and y (row 1) draft, sharded: each rank has its own row's values
        mine = [[0.5] * N, [nan] * N] if tp == 0 else [[nan] * N, [1.5] * N]
        a = _slot(
            ring,
            ["x", "y"],
            [[1, 2, 3], [4, 5, 6]],
            sampled=[1, 1],
            rejected=[0, 0],
            seq=[5, 8],
            last=[0, 0],
            bias=mine,
        )
        a.meta["sharded_over"] = 2
        rec.stage(a, ring.release)
        # step B: A's drafts verified; new drafts sampled whole on every rank
        rec.stage(
            _slot(
                ring,
                ["x", "y"],
                [[7, 7, 7], [8, 8, 8]],
                sampled=[4, 2],
                rejected=[0, 2],
                seq=[9, 12],
                last=[11, 9],
                bias=[[2.5] * N] * 2,
            ),
            ring.release,
        )
        # step C: B's drafts verified
        rec.stage(
            _slot(
                ring,
                ["x", "y"],
                [[9, 9, 9], [9, 9, 9]],
                sampled=[1, 1],
                rejected=[2, 2],
                seq=[10, 13],
                last=[3, 4],
            ),
            ring.release,
        )
        rec.process_ready()
    for rec in recorders.values():
        rec.close()
    meta = read_run_json(run_dir)
    assert meta[JOINED_WRITERS] == ["tp1"]
    assert meta["status"] == "complete"
    assert meta["rows"]["positions"] == 2 * 2 * N
    (report,) = validate_trace(run_dir)
    assert report.ok, [str(v) for v in report.violations]
    positions = read_trace(run_dir, "positions").set_index(["request_id", "step", "position"])
    positions = positions.sort_index()
    assert not positions.index.duplicated().any()
    # step 0: x's rows from rank 0, y's from rank 1, each with the values its rank computed
    assert positions.loc[("x", 0), "markov_bias"].tolist() == [0.5] * N
    assert positions.loc[("y", 0), "markov_bias"].tolist() == [1.5] * N
    # step 1, sampled whole: the owner's rows
    assert positions.loc[("y", 1), "markov_bias"].tolist() == [2.5] * N
    steps = read_trace(run_dir, "steps")
    assert sorted(zip(steps["request_id"], steps["step"], strict=True)) == [
        ("x", 0),
        ("x", 1),
        ("y", 0),
        ("y", 1),
    ]


def test_ranks_join_one_run_only_where_they_share_vllms_config() -> None:
    """The ranks name the run from vLLM's instance id, which agrees across ranks only where
    the engine's process pickles its config to them (multiprocessing on one node, Ray)."""
    from dsparklab.engines.vllm.runs import joins_one_run

    def config(backend: str, nnodes: int = 1, sharded: bool = True) -> SimpleNamespace:
        parallel = SimpleNamespace(
            tensor_parallel_size=2,
            enable_batch_sharded_sampling=sharded,
            distributed_executor_backend=backend,
            nnodes=nnodes,
        )
        return SimpleNamespace(parallel_config=parallel, instance_id="1")

    assert joins_one_run(config("mp"), "dspark", "tp0")
    assert joins_one_run(config("ray", nnodes=2), "dspark", "tp0")
    assert not joins_one_run(config("mp", nnodes=2), "dspark", "tp0")
    assert not joins_one_run(config("external_launcher"), "dspark", "tp0")
    assert not joins_one_run(config("mp", sharded=False), "dspark", "tp0")
    assert not joins_one_run(config("mp"), "dspark", "all")
    assert not joins_one_run(config("mp"), "eagle3", "tp0")


def test_the_dead_writers_of_a_joined_run_are_closed_each_with_its_own_rows(
    tmp_path: Path,
) -> None:
    """vLLM killed its workers at shutdown: the closer closes rank 0's run.json and each
    joined rank's own file, each from its own settled marker and with its own rows (a reader
    adds them up once)."""
    import os
    import subprocess

    from dsparklab.engines.vllm import closing
    from dsparklab.engines.vllm.closing import settled_marker
    from dsparklab.store.reader import joined_record
    from dsparklab.store.schema import JOINED_WRITERS
    from tests.conftest import make_run_json, step_rows

    dead = subprocess.Popen(["true"])
    dead.wait()
    config = {"pid": dead.pid, "ancestor_pids": [os.getpid()]}
    meta = make_run_json(num_speculative_tokens=N, config=config)
    owner = TraceWriter(tmp_path, {**meta, JOINED_WRITERS: ["tp1"]}, tag="tp0")
    joiner = TraceWriter(tmp_path, meta, tag="tp1", joins="tp1")
    for writer in (owner, joiner):  # both processes die without closing
        writer.__enter__()
    for rid, writer in (("r0", owner), ("r1", joiner)):
        steps, positions = step_rows([2, 1], n=N, request_id=rid)
        owner.add_many("steps", steps)
        writer.add_many("positions", positions)
    owner.flush()
    joiner.flush()
    run_dir = Path(owner.run_dir.path)
    settled_marker(run_dir, "tp1").touch()  # rank 1 had settled, rank 0 had not
    closed = closing.close_runs_of_dead_descendants(tmp_path, wait_s=0)
    assert closed == {str(owner.run_dir): "incomplete", f"{owner.run_dir}#tp1": "complete"}
    assert read_run_json(run_dir, joined=False)["rows"]["positions"] == 2 * N
    record = joined_record(run_dir, "tp1")
    assert record is not None and record["rows"]["positions"] == 2 * N
    assert not settled_marker(run_dir, "tp1").exists()
    merged = read_run_json(run_dir)
    assert merged["rows"]["positions"] == 2 * 2 * N
    assert merged["status"] == "incomplete"
    assert closing.close_runs_of_dead_descendants(tmp_path, wait_s=0) == {}


def test_only_tp_rank_0_of_pcp_rank_0_writes() -> None:
    """Drafts are replicated across TP ranks; PCP rank 0's are broadcast to the other PCP
    ranks after propose (vLLM 0.34's PCPManager.sync_drafts): theirs are never verified."""
    from dsparklab.engines.vllm.runs import Ranks, records_here

    assert records_here(Ranks(), "tp0")
    assert not records_here(Ranks(tp=1), "tp0") and records_here(Ranks(tp=1), "all")
    for writer_ranks in ("tp0", "all"):
        assert not records_here(Ranks(pcp=1), writer_ranks)
        assert not records_here(Ranks(tp=1, pcp=2), writer_ranks)
    assert records_here(Ranks(dp=3), "tp0")
    # batch-sharded sampling: every TP rank writes the rows it samples into one run
    assert records_here(Ranks(tp=1), "tp0", joined=True)
    assert not records_here(Ranks(tp=1, pcp=1), "tp0", joined=True)


def test_a_dspark_tap_on_a_device_never_reads_the_temperature_table_through_numpy(
    tmp_path: Path,
) -> None:
    """On an accelerator the temperature table has no bytes on the host: the tap divides by
    it on the device (graph-safe) instead of asking numpy whether it is all zero, which
    raised at the first draft step and turned tracing off. A meta tensor stands in for a
    device one (it has no data either)."""
    from dsparklab.engines.vllm import dspark_taps

    meta = torch.device("meta")
    rec = TraceRecorder(N, dataset="d", writer=_writer(tmp_path / "run", "dspark"))
    tap = dspark_taps.DSparkTap(recorder=rec, n=N, max_num_reqs=4, device=meta, level="full")
    assert tap.all_greedy is None and not tap.positions_at_end
    spec = SimpleNamespace(
        temperature=torch.zeros(8, device=meta),
        sample_idx_mapping=torch.zeros(4 * N, dtype=torch.int64, device=meta),
        draft_logits=None,
        model=None,
    )
    tap.begin(spec, 2, "dense")
    base = torch.zeros(2 * N, 16, device=meta)
    tap.on_draft_logits(spec, torch.zeros(2 * N, 8, device=meta), base)
    assert tap.stash.scale is not None and tap.stash.scale.device == meta
    rec.close()


def test_eagle3_sampled_drafts_of_a_short_step_read_no_token_where_vllm_drafted_none() -> None:
    """vLLM fills a step's undrafted columns with -1 (skip_drafts, a shorter window): the
    cached log-probability there is null, never an index of -1 (a device-side assert on a
    GPU)."""
    from dsparklab.engines.vllm.eagle3_taps import Eagle3V2Tap

    logits = torch.randn(3, N, 5)  # request states x positions x vocabulary
    temperature = torch.tensor([0.0, 0.7, 1.0])
    drafts = torch.tensor([[1, 2, -1], [-1, -1, -1]])
    expected = (logits[1, :2] / 0.7).log_softmax(-1)[torch.arange(2), torch.tensor([1, 2])]
    # vLLM 0.33 keeps the cache as a tensor, 0.34 as a DraftLogitsCache holding it
    for cache in (logits, SimpleNamespace(values=logits, row_mapping=None)):
        tap = SimpleNamespace(
            n=N, spec=SimpleNamespace(draft_logits=cache, temperature=temperature)
        )
        got = Eagle3V2Tap._from_cache(tap, drafts, 2, torch.tensor([1, 2]))
        assert got.shape == (2, N)
        torch.testing.assert_close(got[0, :2], expected)
        assert torch.isnan(got[0, 2]) and torch.isnan(got[1]).all()


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_eagle3_taps_stage_their_values_after_the_draft_pass_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runner: str
) -> None:
    """The tap's own work at the draft's end (V2: the log-softmax over the cached logits;
    V1: the positions' log-probabilities stacked) runs after ``draft_end``: the step's draft
    time is vLLM's drafting, the tap's work falls outside it."""
    import time

    from dsparklab.engines.vllm import eagle3_taps

    rec = TraceRecorder(N, dataset="d", writer=_writer(tmp_path / "run", "eagle3"))
    model = SimpleNamespace(compute_logits=lambda hidden: hidden)
    common = {"recorder": rec, "n": N, "max_num_reqs": 4, "device": torch.device("cpu")}
    if runner == "v2":
        spec = SimpleNamespace(
            model=model,
            current_draft_step=torch.zeros(1, dtype=torch.int64),
            draft_logits=torch.randn(4, N, 5),
            temperature=torch.ones(4),
        )
        cls, work = eagle3_taps.Eagle3V2Tap, "_from_cache"
        tap = cls(spec=spec, level="full", **common)
    else:
        cls, work = eagle3_taps.Eagle3V1Tap, "_logprobs"
        tap = cls(drafter=SimpleNamespace(model=model), level="full", **common)
        tap.begin()
    slow = getattr(cls, work)

    def slowed(self, *args):  # the tap's work, made long enough to show in a span
        time.sleep(0.05)
        return slow(self, *args)

    monkeypatch.setattr(cls, work, slowed)
    slot = tap.acquire()
    slot.meta.update(req_ids=["a", "b"], idx_mapping=torch.tensor([0, 1]))
    tap.start_timer(slot)
    clock = slot.clock
    tap.after(slot, torch.tensor([[1, 2, 3], [0, 4, 1]]))
    assert clock.draft_s() is not None and clock.draft_s() < 0.04
    rec.close()


def test_a_draft_model_that_samples_its_block_itself_says_its_fields_are_null(
    tmp_path: Path,
) -> None:
    """vLLM 0.34 lets a DSpark model run the Markov steps with its own kernels
    (``model.sample_sequential`` returning True: Kimi K3's fused drafter): the base logits
    come, no per-position hook does. run.json names every position field and the
    confidence (no embeddings for the head either) as null, with why: never a silent null."""
    from dsparklab.engines.vllm import dspark_taps

    rec = TraceRecorder(N, dataset="d", writer=_writer(tmp_path / "run", "dspark"))
    tap = dspark_taps.DSparkTap(
        recorder=rec, n=N, max_num_reqs=4, device=torch.device("cpu"), level="full"
    )
    spec = SimpleNamespace(
        temperature=torch.zeros(4),
        sample_idx_mapping=torch.zeros(4 * N, dtype=torch.int64),
        draft_logits=None,
        model=SimpleNamespace(model=SimpleNamespace(confidence_head=object())),
    )
    tap.spec = spec
    for _ in range(2):
        tap.begin(spec, 2, "dense")
        tap.on_draft_logits(spec, torch.zeros(2 * N, 8), torch.randn(2 * N, 16))
        tap.end(spec)  # the model's own loop ran: no _sample_logits, no markov_bias
    fields = rec.writer.meta["recorded_fields"]
    for name in TAP_FIELDS:
        assert fields[name].startswith("null: the draft model's own sampling path"), name
    assert torch.isnan(tap.buffers.draft_logprob[:2]).all()
    rec.close()


def test_vllms_kernel_warmup_requests_are_not_recorded(tmp_path: Path) -> None:
    """V2 warms its kernels up before serving with requests of its own (ids as
    ``vllm/v1/worker/gpu/warmup.py`` makes them; ``test_vllm_lines.py`` checks every
    line's): the propose and target-only taps stage none of their steps, and the recorder
    never counts them as requests."""
    from dsparklab.engines.vllm import runs, v2

    warm = ["_warmup_0_", "_context_warmup_1_", "_v2_mixed_warmup_decode_"]
    assert all(runs.is_warmup_request(r) for r in warm)
    assert not any(runs.is_warmup_request(r) for r in ("cmpl-1-0", "chatcmpl-warmup", "r0"))
    batch = SimpleNamespace(num_reqs=len(warm), req_ids=warm)
    call = {"dummy_run": False, "is_profile": False, "input_batch": batch}
    assert v2.before_v2(None, None, call.__getitem__) is None  # before any slot is taken
    rec = TraceRecorder(N, dataset="d", writer=_writer(tmp_path / "run", "eagle3"))
    runs.STATE.recorders.append(rec)
    try:
        execute = runs.wrap_execute_model(lambda self, out: None)
        new = [SimpleNamespace(req_id=r) for r in (*warm, "cmpl-1-0")]
        execute(None, SimpleNamespace(scheduled_new_reqs=new, finished_req_ids=set()))
        assert rec.in_flight() == {"cmpl-1-0"}
    finally:
        runs.STATE.recorders.remove(rec)
        rec.close()
