"""Evaluation written on the zoo's cards: target degeneracy and drafters' offline acceptance.

Offline acceptance replays decode-time drafting with teacher forcing on sequences the
target wrote itself (held-out prompt + its greedy continuation). With greedy
verification a drafted position is accepted iff every earlier one was and its token is
the target's argmax; given that all earlier positions were accepted, the drafter's
inputs (anchor/bonus token, target hidden states of the accepted prefix, the Markov
head's previous token) are exactly the ground-truth ones teacher forcing feeds. So the
per-start correctness matrix gives the decode-time acceptance at each start position:
DSpark exactly (one non-causal pass per block), Eagle3 up to its training-time-test
approximation of its own draft-step KV entries.

Definitions (bonus token included):

.. math::

    s_i = P(\\text{positions } 1..i \\text{ accepted}), \\quad
    a_i = s_i / s_{i-1}, \\quad
    AL(n) = 1 + \\sum_{i=1}^{n} s_i
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from dsparklab.zoo.hidden import capture_hidden_states
from dsparklab.zoo.training.config import DrafterEvalConfig

logger = logging.getLogger(__name__)


@torch.no_grad()
def greedy_continuation(
    model: Any, prompt_ids: Sequence[int], gen_len: int, *, eos_token_id: int | None = None
) -> list[int]:
    """Greedy (argmax) continuation of one unpadded prompt, ``gen_len`` tokens.

    Pure argmax with a KV cache, no padding: the reference the engines' greedy outputs
    are compared with. EOS is ignored unless ``eos_token_id`` is given, in which case
    the continuation ends with it.
    """
    from transformers import DynamicCache

    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    cache = DynamicCache()
    out = model(input_ids=ids, past_key_values=cache, use_cache=True)
    generated: list[int] = []
    for step in range(gen_len):
        token = int(out.logits[0, -1].argmax())
        generated.append(token)
        if token == eos_token_id:
            break
        if step + 1 < gen_len:
            out = model(
                input_ids=torch.tensor([[token]]),
                past_key_values=out.past_key_values,
                use_cache=True,
            )
    return generated


def distinct_ratio(tokens: Sequence[int]) -> float:
    """Distinct-token ratio ``len(set(tokens)) / len(tokens)`` (1.0 = no repeats)."""
    if not tokens:
        raise ValueError("distinct_ratio of an empty continuation")
    return len(set(tokens)) / len(tokens)


def acceptance_summary(correct: np.ndarray) -> dict[str, Any]:  # [num_starts, n] bool
    """Per-position acceptance from a per-start correctness matrix.

    Parameters
    ----------
    correct : np.ndarray
        ``[num_starts, n]``: whether draft position ``i`` (0-based) matched the target's
        argmax, for every start (anchor) position.

    Returns
    -------
    dict
        ``survival`` (``s_i``, list of n), ``conditional`` (``a_i``, list of n; NaN when
        never reached), ``accept_len`` (``{n: AL(n)}`` for every window ``1..n``),
        ``num_starts``.
    """
    correct = np.asarray(correct, dtype=bool)
    if correct.ndim != 2 or correct.shape[0] == 0:
        raise ValueError(f"expected a non-empty [num_starts, n] matrix, got {correct.shape}")
    prefix = np.cumprod(correct, axis=1).astype(float)  # [S, n]
    survival = prefix.mean(axis=0)
    reached = np.concatenate([[1.0], survival[:-1]])
    with np.errstate(invalid="ignore", divide="ignore"):
        conditional = np.where(reached > 0, survival / reached, np.nan)
    accept_len = {n: float(1.0 + survival[:n].sum()) for n in range(1, correct.shape[1] + 1)}
    return {
        "num_starts": int(correct.shape[0]),
        "survival": [float(x) for x in survival],
        "conditional": [float(x) for x in conditional],
        "accept_len": accept_len,
    }


@torch.no_grad()
def dspark_block_correct(
    drafter: Any,
    target: Any,
    ids: Sequence[int],
    prompt_len: int,
    *,
    max_anchors: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """DSpark greedy correctness and confidence per block, anchors in the continuation.

    Every position ``p`` with ``prompt_len <= p <= len(ids) - block_size - 1`` is an
    anchor (or ``max_anchors`` of them, chosen at random by ``speculators``): the block
    drafts ``ids[p+1 .. p+block_size]`` from the target's hidden states before ``p``
    and the anchor token ``ids[p]`` (``sample_from_anchor``), Markov bias from the
    ground-truth previous token.

    Returns
    -------
    correct : np.ndarray
        ``[num_blocks, block_size]`` bool, draft argmax == target argmax.
    confidence : np.ndarray
        ``[num_blocks, block_size]`` confidence-head probabilities (NaN without the head).
    """
    if not drafter.config.sample_from_anchor:
        raise ValueError("dspark_block_correct expects a sample_from_anchor=True drafter")
    block = drafter.block_size
    x = torch.tensor([list(ids)], dtype=torch.long)
    total = x.shape[1]
    valid = total - block - prompt_len
    if valid <= 0:
        raise ValueError(
            f"sequence of {total} tokens leaves no anchor after a {prompt_len}-token prompt"
        )
    aux, last, target_logits = capture_hidden_states(target, x, drafter.target_layer_ids)
    assert target_logits is not None  # with_logits defaults to True
    loss_mask = torch.zeros(1, total, dtype=torch.long)
    loss_mask[0, prompt_len:] = 1
    num_anchors = valid if max_anchors is None else min(valid, max_anchors)
    hidden, logits, verifier_logits, _, block_idx = drafter._backbone_forward(
        aux,
        x,
        loss_mask,
        last,
        torch.zeros(1, total, dtype=torch.long),
        torch.arange(total).unsqueeze(0),
        max_anchors=num_anchors,
    )
    blocks = x[0, block_idx].view(num_anchors, block)
    hidden = hidden.view(num_anchors, block, -1)
    logits = logits.view(num_anchors, block, -1)
    confidence = torch.full((num_anchors, block), float("nan"))
    if drafter.markov_head is not None:
        emb = drafter.markov_head.prev_embeddings(blocks)
        logits = logits + drafter.markov_head.block_bias(
            prev_token_ids=blocks, hidden_states=hidden, prev_emb=emb
        )
    if drafter.confidence_head is not None:
        features = (
            torch.cat([hidden, emb], dim=-1)
            if drafter.config.confidence_head_with_markov
            else hidden
        )
        confidence = torch.sigmoid(drafter.confidence_head(features))
    # Compared in target ids: a draft vocabulary cannot hit a target argmax outside it.
    drafted = draft_to_target(drafter, logits.argmax(-1))
    want = target_logits[0].argmax(-1)[block_idx].view(num_anchors, block)
    correct = drafted == want
    return correct.numpy(), confidence.float().numpy()


def draft_to_target(drafter: Any, draft_ids: torch.Tensor) -> torch.Tensor:
    """Draft-vocabulary ids -> target ids (``id + d2t[id]``; identity without a draft vocab)."""
    d2t = getattr(drafter, "d2t", None)
    return draft_ids if d2t is None else draft_ids + d2t[draft_ids]


@torch.no_grad()
def eagle3_start_correct(
    drafter: Any, target: Any, ids: Sequence[int], prompt_len: int, *, max_n: int
) -> np.ndarray:
    """Eagle3 greedy correctness for every start position in the continuation.

    Start ``t`` (``prompt_len - 1 <= t <= len(ids) - 2 - max_n``) drafts ``ids[t+2 ..
    t+1+max_n]`` from the target's hidden state at ``t`` and the token ``ids[t+1]``,
    unrolled ``max_n`` steps with teacher forcing (``speculators``' TTT forward).

    Returns
    -------
    np.ndarray
        ``[num_starts, max_n]`` bool.
    """
    x = torch.tensor([list(ids)], dtype=torch.long)
    total = x.shape[1]
    aux, _, logits = capture_hidden_states(target, x, drafter.target_layer_ids)
    assert logits is not None  # with_logits defaults to True
    # speculators' shift: pair token t+1 with hidden state t (positions start at 1).
    draft_tokens = drafter(
        hidden_states=aux[:, :-1],
        input_ids=x[:, 1:],
        document_ids=torch.zeros(1, total - 1, dtype=torch.long),
        position_ids=torch.arange(1, total).unsqueeze(0),
        ttt_steps=max_n,
    )
    want = logits[0, 1:].argmax(-1)  # [T-1]: shifted index t predicts ids[t+2]
    starts = range(prompt_len - 1, total - 1 - max_n)
    if len(starts) == 0:
        raise ValueError(f"sequence of {total} tokens leaves no start for max_n={max_n}")
    correct = np.zeros((len(starts), max_n), dtype=bool)
    for k in range(max_n):
        drafted = draft_to_target(drafter, draft_tokens[k][0])
        for row, t in enumerate(starts):
            correct[row, k] = bool(drafted[t] == want[t + k])
    return correct


def evaluate_drafters(
    target: Any,
    sequences: Sequence[tuple[Sequence[int], int]],
    settings: DrafterEvalConfig,
    *,
    dspark: Any | None = None,
    eagle3: Any | None = None,
) -> dict[str, dict[str, Any]]:
    """Offline acceptance of each given drafter over (ids, prompt_len) sequences.

    ``settings`` gives the windows (up to ``max_n``), the DSpark anchors per sequence and
    the seed.

    Returns
    -------
    dict
        ``{"dspark": summary, "eagle3": summary}`` for the drafters given, each an
        :func:`acceptance_summary` (DSpark adds ``confidence_mean`` per position).
    """
    max_n, dspark_anchors = settings.max_n, settings.dspark_anchors
    torch.manual_seed(settings.seed)
    results: dict[str, dict[str, Any]] = {}
    if dspark is not None:
        if dspark.block_size < max_n:
            raise ValueError(f"DSpark block_size {dspark.block_size} < max_n {max_n}")
        rows, confs = [], []
        for ids, prompt_len in tqdm(sequences, desc="eval dspark", leave=False):
            correct, conf = dspark_block_correct(
                dspark, target, ids, prompt_len, max_anchors=dspark_anchors
            )
            rows.append(correct[:, :max_n])
            confs.append(conf[:, :max_n])
        summary = acceptance_summary(np.concatenate(rows))
        summary["confidence_mean"] = [float(x) for x in np.nanmean(np.concatenate(confs), 0)]
        results["dspark"] = summary
    if eagle3 is not None:
        rows = [
            eagle3_start_correct(eagle3, target, ids, prompt_len, max_n=max_n)
            for ids, prompt_len in tqdm(sequences, desc="eval eagle3", leave=False)
        ]
        results["eagle3"] = acceptance_summary(np.concatenate(rows))
    return results
