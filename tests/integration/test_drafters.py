"""The drafters compute what the checkpoints were trained to compute, and sampling is exact.

The reference engine re-implements the drafters' inference paths (incremental context
K/V for DSpark, a cropped KV cache for Eagle3); these tests hold them against the
checkpoints' own training-time modules, and rejection sampling against its target law.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch

from dsparklab.engines.reference import (
    DSparkDrafter,
    Generation,
    MarkovHeadWeights,
    dspark_markov_step,
    verify_rejection,
)
from tests.integration.conftest import GEN_LEN, Zoo

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def context(zoo: Zoo, prompt_ids: list[list[int]]) -> tuple[list[int], torch.Tensor]:
    """A prompt and the target's hidden states over it (all layers, no cache)."""
    ids = prompt_ids[1][:96]
    with torch.inference_mode():
        out = zoo.target(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return ids, torch.stack([h[0] for h in out.hidden_states])  # [layers + 1, T, H]


def _aux(hidden: torch.Tensor | Sequence[torch.Tensor], layer_ids: list[int]) -> torch.Tensor:
    return torch.cat([hidden[i] for i in layer_ids], dim=-1)


@torch.inference_mode()
@pytest.mark.parametrize(("n", "sample_from_anchor"), [(3, True), (7, True), (5, False)])
def test_dspark_block_pass_matches_training_layers(
    zoo: Zoo, context: tuple[list[int], torch.Tensor], n: int, sample_from_anchor: bool
) -> None:
    """Incremental context K/V + own attention == the speculators layers on the full context.

    Both query layouts: anchor + n - 1 masks (``sample_from_anchor``, DSpark's) and
    anchor + n masks (DFlash's fill-in layout, slots 1..n sampled).
    """
    ids, hidden = context
    model = zoo.dspark
    aux = _aux(hidden, model.config.aux_hidden_state_layer_ids)[:-1]  # positions 0..T-2
    drafter = DSparkDrafter(model)
    drafter.sample_from_anchor = sample_from_anchor
    cut = len(aux) // 3  # feed the context in two updates, as steps do
    drafter._extend_context(aux[:cut], 0)
    drafter._extend_context(aux[cut:], cut)
    anchor_pos = len(ids) - 1
    got = drafter.block_hidden(ids[-1], anchor_pos, n)

    q_len = n if drafter.sample_from_anchor else n + 1
    block = torch.full((1, q_len), drafter.mask_token_id)
    block[0, 0] = ids[-1]
    states = model.embed_tokens(block)
    ctx = model.hidden_norm(model.fc(aux)).unsqueeze(0)
    positions = torch.arange(anchor_pos + q_len).unsqueeze(0)
    cos_sin = model.rotary_emb(states, positions)
    for layer in model.layers:
        states = layer(
            target_hidden=ctx,
            hidden_states=states,
            attention_mask=None,
            position_embeddings=cos_sin,
        )
    want = model.norm(states)[0]
    want = want if sample_from_anchor else want[1:]
    assert got.shape == (n, want.shape[-1])
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-4)


def _decode_then_target(
    zoo: Zoo, method: str, n: int, ids: list[int], layer_ids: list[int]
) -> tuple[Generation, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Decode ``ids`` with the engine, then run the target once over prompt + output.

    Returns the generation, the ``[1, T]`` sequence, the target's hidden states of
    ``layer_ids`` concatenated (the drafter's input) and its last layer's states.
    """
    engine = zoo.engine(method, n, max_new_tokens=GEN_LEN, stop_at_eos=False)
    result = engine.generate(ids, request_id="anchors")
    x = torch.tensor([ids + result.output_token_ids])
    out = zoo.target(input_ids=x, output_hidden_states=True)
    return result, x, _aux(out.hidden_states, layer_ids), out.hidden_states[-1]


def _assert_drafts_agree(result: Generation, drafts_at: Callable[[int], list[int] | None]) -> None:
    """The decode's drafts equal ``drafts_at(anchor position)`` (None: nothing to compare
    there), each step's up to and including its first rejection: at most one disagrees, and
    the drafts compared number at least two thirds of the steps."""
    agree = compared = 0
    for step in result.steps:
        want = drafts_at(step.context_len - 1)  # the step's anchor position
        if want is None:
            continue
        for row in (p for p in result.positions if p.step == step.step):
            compared += 1
            agree += row.draft_token == want[row.position]
            if not row.accepted:
                break
    assert compared >= 2 * len(result.steps) // 3
    assert agree >= compared - 1, f"{agree} of {compared} drafts agree"


@torch.inference_mode()
def test_dspark_decode_drafts_equal_training_forward(zoo: Zoo, prompt_ids: list[list[int]]) -> None:
    """At n = block size, every step drafts what ``_backbone_forward`` + the Markov head
    (speculators' training path, teacher-forced) drafts at the same anchor."""
    model = zoo.dspark
    block = model.block_size
    ids = prompt_ids[0]
    layer_ids = model.config.aux_hidden_state_layer_ids
    result, x, aux, last = _decode_then_target(zoo, "dspark", block, ids, layer_ids)
    total = x.shape[1]
    loss_mask = torch.zeros(1, total, dtype=torch.long)
    loss_mask[0, len(ids) - 1 :] = 1
    anchors_n = total - block - (len(ids) - 1)  # every valid anchor
    hidden, logits, _, _, index = model._backbone_forward(
        aux,
        x,
        loss_mask,
        last,
        torch.zeros(1, total, dtype=torch.long),
        torch.arange(total).unsqueeze(0),
        max_anchors=anchors_n,
    )
    blocks = x[0, index].view(anchors_n, block)
    bias = model.markov_head.block_bias(
        prev_token_ids=blocks, hidden_states=hidden.view(anchors_n, block, -1)
    )
    drafts = (logits.view(anchors_n, block, -1) + bias).argmax(-1).tolist()
    anchors = {a: i for i, a in enumerate(index.view(-1, block)[:, 0].tolist())}
    _assert_drafts_agree(result, lambda a: drafts[anchors[a]] if a in anchors else None)


@torch.inference_mode()
def test_eagle3_decode_drafts_equal_training_forward(zoo: Zoo, prompt_ids: list[list[int]]) -> None:
    """Every step drafts what the training-time-test forward (teacher-forced) drafts from
    the same start: the anchor's token with the target's hidden state before it."""
    model = zoo.eagle3
    n = 7
    layer_ids = model.config.eagle_aux_hidden_state_layer_ids
    result, x, aux, _ = _decode_then_target(zoo, "eagle3", n, prompt_ids[0], layer_ids)
    total = x.shape[1]
    drafts = model(  # speculators' alignment: token t + 1 with hidden state t
        hidden_states=aux[:, :-1],
        input_ids=x[:, 1:],
        document_ids=torch.zeros(1, total - 1, dtype=torch.long),
        position_ids=torch.arange(1, total).unsqueeze(0),
        ttt_steps=n,
    )
    table = torch.stack([d[0] for d in drafts], dim=1).tolist()  # [T - 1, n]
    _assert_drafts_agree(result, lambda a: table[a - 1] if a + n <= total - 1 else None)


def test_markov_step_reduced_vocab_matches_loop() -> None:
    """The pure function on a reduced draft vocabulary, against a plain per-row loop."""
    gen = torch.Generator().manual_seed(0)
    v_target, v_draft, rank, hidden, reqs, n = 50, 20, 4, 6, 3, 5
    kept = torch.randperm(v_target, generator=gen)[:v_draft].sort().values
    head = MarkovHeadWeights(
        w1=torch.randn(v_target, rank, generator=gen),
        w2=torch.randn(v_draft, rank, generator=gen),
        confidence_weight=torch.randn(1, hidden + rank, generator=gen),
        confidence_bias=torch.randn(1, generator=gen),
        confidence_with_markov=True,
        draft_to_target=kept - torch.arange(v_draft),
    )
    base = torch.randn(reqs, n, v_draft, generator=gen)
    hid = torch.randn(reqs, n, hidden, generator=gen)
    anchors = torch.randint(0, v_target, (reqs,), generator=gen)
    got = dspark_markov_step(base, anchors, head, hidden=hid)
    for r in range(reqs):
        prev = int(anchors[r])
        for i in range(n):
            bias = head.w2 @ head.w1[prev]
            logits = base[r, i] + bias
            draft_id = int(logits.argmax())
            token = int(kept[draft_id])
            feat = torch.cat([hid[r, i], head.w1[prev]])
            conf = torch.sigmoid(feat @ head.confidence_weight[0] + head.confidence_bias[0])
            assert int(got.tokens[r, i]) == token
            assert int(got.draft_ids[r, i]) == draft_id
            assert float(got.bias_at_token[r, i]) == pytest.approx(float(bias[draft_id]), abs=1e-5)
            assert float(got.bias_norm[r, i]) == pytest.approx(float(bias.norm()), rel=1e-5)
            assert bool(got.flip(base)[r, i]) == (int(base[r, i].argmax()) != draft_id)
            assert float(got.confidence[r, i]) == pytest.approx(float(conf), abs=1e-6)
            prev = token


def test_rejection_sampling_emits_the_target_distribution() -> None:
    """The first emitted token follows p_0 whatever the drafter's q (chi-square bound)."""
    gen = torch.Generator().manual_seed(1)
    vocab, n, temperature, trials = 6, 3, 0.7, 6000
    target_logits = torch.randn(n + 1, vocab, generator=gen) * 2
    draft_logits = torch.randn(n, vocab, generator=gen) * 2
    q = torch.softmax(draft_logits.double() / temperature, -1)
    p0 = torch.softmax(target_logits[0].double() / temperature, -1)
    counts = torch.zeros(vocab)
    accepted_first = 0
    for _ in range(trials):
        drafts = [int(torch.multinomial(q[i], 1, generator=gen)) for i in range(n)]
        verdict = verify_rejection(drafts, q, target_logits, temperature=temperature, generator=gen)
        first = drafts[0] if verdict.accepted_len > 0 else verdict.bonus_token
        counts[first] += 1
        accepted_first += verdict.accepted_len > 0
    expected = p0 * trials
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 20.5  # df = 5, p = 0.001
    # acceptance rate of position 0 is sum_x min(p, q)
    rate = float(torch.minimum(p0, q[0]).sum())
    assert accepted_first / trials == pytest.approx(rate, abs=0.03)


@pytest.mark.parametrize("method", ["dspark", "eagle3"])
def test_sampling_is_seeded_and_traced(zoo: Zoo, prompt_ids: list[list[int]], method: str) -> None:
    engine = zoo.engine(method, 4, max_new_tokens=24, temperature=0.8, seed=7)
    first = engine.generate(prompt_ids[2], request_id="r")
    again = engine.generate(prompt_ids[2], request_id="r")
    other = engine.generate(prompt_ids[2], request_id="other")
    assert first.output_token_ids == again.output_token_ids
    assert first.output_token_ids != other.output_token_ids  # seeds differ per request
    for step in first.steps:
        rows = [p for p in first.positions if p.step == step.step]
        assert sum(p.accepted for p in rows) == step.accepted_len
        for p in rows[: step.accepted_len]:
            assert p.target_token == p.draft_token
        assert all(p.target_token is None for p in rows[step.accepted_len + 1 :])
