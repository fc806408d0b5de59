"""Helpers shared by the zoo's vLLM tests (tiny and smol tiers)."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

NEAR_TIE = 1e-3


def _near_tie_gap(model: Any, ids: Sequence[int]) -> float:
    """Top-2 logit gap of the target's next-token distribution in float64."""
    m64 = model.to(torch.float64)
    try:
        with torch.no_grad():
            logits = m64(input_ids=torch.tensor([list(ids)])).logits[0, -1]
    finally:
        model.to(torch.float32)
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


def assert_same_or_near_tie(model: Any, prompts, got, want, *, max_ties: int = 1) -> None:
    """Exact equality, except a first divergence at a float64 near-tie (at most max_ties)."""
    ties = 0
    for ids, a, b in zip(prompts, got, want, strict=True):
        if a == b:
            continue
        first = next(i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y)
        gap = _near_tie_gap(model, list(ids) + list(b[:first]))
        assert gap < NEAR_TIE, f"divergence at token {first} with a clear top-2 gap {gap:.3g}"
        ties += 1
    assert ties <= max_ties, f"{ties} prompts diverged (near-ties)"


def vllm_generate(
    target: Path, prompts, gen_len: int, *, ignore_eos: bool = True, **engine_kwargs: Any
):
    """Greedy token ids from a fresh in-process vllm.LLM, plus its metrics; shut down."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    torch.set_num_threads(1)
    llm = LLM(
        model=str(target),
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=1024,
        # a fixed KV cache, so the test does not depend on how much memory is free
        kv_cache_memory_bytes=256 << 20,
        disable_log_stats=False,
        **engine_kwargs,
    )
    try:
        outs = llm.generate(
            [TokensPrompt(prompt_token_ids=list(ids)) for ids in prompts],
            SamplingParams(temperature=0.0, max_tokens=gen_len, ignore_eos=ignore_eos),
            use_tqdm=False,
        )
        tokens = [list(o.outputs[0].token_ids) for o in outs]
        metrics = {m.name: m for m in llm.get_metrics()}
    finally:
        del llm
        gc.collect()
    return tokens, metrics
