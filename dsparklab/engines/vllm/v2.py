"""Model Runner V2 (GPU): the ``propose`` wrapper of the DFlash-family and Eagle3 speculators.

Runs outside the graph. Before the draft step it stages what verification of the
previous drafts produced, read from vLLM's own objects: ``num_sampled`` / ``num_rejected``
(``[num_reqs]``, batch order), ``InputBatch.seq_lens`` and the emitted token from
``RequestState.last_sampled_tokens`` (``[max_num_reqs, 1]``, request-state order, so
gathered by ``idx_mapping``). After it the new drafts (and the DSpark tap buffers).

"Planned" and "verified": ``num_drafted`` is what this draft step proposed
(``num_speculative_tokens``, which adaptive verification may lower); the next step's
``num_sampled - 1 + num_rejected`` is what the target verified, which under adaptive
verification may be fewer (vLLM admits drafts by confidence). Both go into ``steps``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dsparklab.engines.vllm.core import HostSlot
from dsparklab.engines.vllm.eagle3_taps import Eagle3V2Tap
from dsparklab.engines.vllm.runs import is_warmup_request, lazy_tap
from dsparklab.engines.vllm.staging import TAP_ATTR, Arguments, SpecTap, tap_of, wrap_propose


def emitted_tokens(last_sampled: torch.Tensor, idx_mapping: torch.Tensor) -> torch.Tensor:
    """``[R]`` last token each batch row emitted, from vLLM's per-request-state tensor.

    ``last_sampled`` is ``[max_num_reqs, 1]`` in vLLM 0.32/0.33 (``[max_num_reqs]`` in
    older code); the last column is the token the next draft continues from.
    """
    per_state = last_sampled if last_sampled.dim() == 1 else last_sampled[:, -1]
    return per_state.index_select(0, idx_mapping)  # one op, where indexing takes two


def before_v2(tap: SpecTap, _spec: Any, arg: Arguments) -> HostSlot | None:
    if arg("dummy_run") or arg("is_profile"):
        return None
    batch = arg("input_batch")
    rows = int(batch.num_reqs)
    if rows <= 0 or all(is_warmup_request(str(r)) for r in batch.req_ids[:rows]):
        return None  # nothing scheduled, or vLLM's kernel warmup before serving
    slot = tap.acquire()
    ring = tap.ring
    ring.copy_in(slot, "num_sampled", arg("num_sampled")[:rows])
    ring.copy_in(slot, "num_rejected", arg("num_rejected")[:rows])
    ring.copy_in(slot, "seq_lens", batch.seq_lens[:rows])
    ring.copy_in(slot, "last_token", emitted_tokens(arg("last_sampled"), batch.idx_mapping[:rows]))
    num_spec = arg("num_speculative_tokens")
    slot.meta.update(
        req_ids=list(batch.req_ids[:rows]),
        num_drafted=min(tap.n, int(num_spec)) if num_spec is not None else tap.n,
        # host-side: one token scheduled marks a decode step after a step that drafted
        # nothing (a batch-size schedule's n = 0), which the recorder keeps as a step
        num_scheduled=batch.num_scheduled_tokens[:rows].tolist(),
    )
    if isinstance(tap, Eagle3V2Tap):  # reads vLLM's draft logits cache by request state
        slot.meta["idx_mapping"] = batch.idx_mapping[:rows]
        tap.before(rows)
    tap.start_timer(slot)
    return slot


def v2_tap(spec: Any) -> SpecTap | None:
    """The speculator's tap: the DSpark one made at load, else (Eagle3, an autoregressive
    draft model drafting through ``sample_draft``) made on first use."""
    if TAP_ATTR in spec.__dict__:  # made (or declined) already: every step after the first
        return tap_of(spec)
    eagle = callable(getattr(spec, "sample_draft", None)) and hasattr(spec, "current_draft_step")
    if eagle:
        return lazy_tap(spec, "v2", factory=Eagle3V2Tap, spec=spec)
    return lazy_tap(spec, "v2")


def wrap_v2_propose(original: Callable[..., Any]) -> Callable[..., Any]:
    return wrap_propose(original, "propose", v2_tap, before_v2)
