"""Helpers shared by the zoo's vLLM tests (tiny and smol tiers)."""

from __future__ import annotations

from typing import Any

from dsparklab.engines.vllm.parity import divergences, vllm_greedy


def assert_same_or_near_tie(model: Any, prompts, got, want, *, max_ties: int = 1) -> None:
    """Exact equality, except a first divergence at a float64 near-tie (at most max_ties)."""
    found = divergences(model, prompts, got, want)
    for d in found:
        assert d.near_tie, (
            f"prompt {d.prompt}: divergence at token {d.token}, top-2 gap {d.gap:.3g}"
        )
    assert len(found) <= max_ties, f"{len(found)} prompts diverged (near-ties)"


def vllm_generate(target, prompts, gen_len: int, **engine_kwargs: Any):
    """Greedy token ids and metrics from a fresh vllm.LLM (see vllm_greedy)."""
    return vllm_greedy(target, prompts, gen_len, **engine_kwargs)
