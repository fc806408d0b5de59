"""The plugin's V2 ``propose`` wrapper around a draft step that runs on CPU.

vLLM's V2 ``propose`` builds the draft batch with a Triton kernel (``prepare_dflash_inputs``)
and an attention forward, neither of which runs on CPU. The tests wrap a stand-in instead:
it has the real method's signature and its body is the draft step itself (the real
``_sample_sequential`` on fixed backbone outputs), and they call it positionally, the way
the V2 model runner calls ``propose``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from dsparklab.engines.vllm import staging, v2


def wrapped_draft_step(draft_inputs: dict[str, Any]) -> Callable[..., Any]:
    """The plugin's propose wrapper around the stand-in; each call drafts
    ``draft_inputs["rows"]`` rows from the backbone outputs ``draft_inputs["hidden"]``
    (set them before the call)."""
    from vllm.v1.worker.gpu.spec_decode.dflash.speculator import DFlashSpeculator

    def draft_step(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        rows = draft_inputs["rows"]
        self._sample_sequential(rows, draft_inputs["hidden"])
        return self.draft_tokens[:rows]

    draft_step.__signature__ = inspect.signature(  # type: ignore[attr-defined]
        staging.unwrap(DFlashSpeculator.propose)
    )
    return v2.wrap_v2_propose(draft_step)


def propose_as_v2_runner(
    propose: Callable[..., Any],
    spec: Any,
    input_batch: Any,
    num_sampled: torch.Tensor,
    num_rejected: torch.Tensor,
    last_sampled: torch.Tensor,
    *,
    next_prefill_tokens: torch.Tensor | None = None,
    temperature: torch.Tensor | None = None,
    seeds: torch.Tensor | None = None,
    **keywords: Any,
) -> None:
    """``propose(spec, ...)`` with the V2 model runner's positional arguments (no attention
    metadata, slot mappings or hidden states: the stand-in reads none of them)."""
    with torch.inference_mode():
        propose(
            spec,
            input_batch,
            {},  # attn_metadata
            {},  # slot_mappings
            None,  # last_hidden_states
            None,  # aux_hidden_states
            num_sampled,
            num_rejected,
            last_sampled,
            next_prefill_tokens,
            temperature,
            seeds,
            **keywords,
        )
