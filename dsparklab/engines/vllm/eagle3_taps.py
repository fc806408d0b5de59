r"""Eagle3 on Model Runner V1: the drafted token's log-probability, from vLLM's own logits.

vLLM 0.32's V1 proposer (``SpecDecodeBaseProposer`` in
``vllm/v1/spec_decode/llm_base_proposer.py``, which ``EagleProposer`` in
``vllm/v1/spec_decode/eagle.py`` extends) drafts position :math:`i` of every request with
``_greedy_sample``: ``self.model.compute_logits(h_i).argmax(dim=-1)``. The logits are
computed in full (for Eagle3 with a reduced draft vocabulary, ``compute_logits`` scatters
them into the target vocabulary with ``-inf`` elsewhere) and dropped after the argmax; no
softmax is taken. So the tap wraps the draft model's ``compute_logits`` on the instance
and, while a ``propose`` is under way, keeps per call

.. math::

    \text{draft\_logprob}_{r,i} = \max_v z_{r,i}[v] - \log \sum_v e^{z_{r,i}[v]}

(``[R]`` float32, one full-vocabulary log-sum-exp per drafted position, as the DSpark taps'
``full`` level pays): the log-softmax at temperature 1 of the drafted token, since a greedy
draft is the argmax. Where vLLM drafts probabilistically (``draft_sample_method
probabilistic`` and a batch with sampled requests) the token is sampled from
``softmax(z / T)`` and vLLM keeps that distribution (``take_last_draft_probs()``, ``[R, n,
V]``): the tap takes the drafted token's probability from it instead.

Not recorded (null), with the reason in run.json's ``draft_logprob_source``: at tap level
``light``; with ``use_local_argmax_reduction`` (vLLM takes a distributed top-1 through
``get_top_tokens``, no full logits exist); with ``use_heterogeneous_vocab`` (the argmax is
taken over logits constrained after ``compute_logits``). Eagle3 has no Markov head and no
confidence head: ``base_logprob``, ``markov_*`` and ``confidence`` stay null.
"""

from __future__ import annotations

import functools
import logging
from typing import Any

import torch

from dsparklab.engines.vllm.core import LEVEL_FIELDS, HostSlot, temperature_scale
from dsparklab.engines.vllm.staging import SpecTap, inference_mode, mark

logger = logging.getLogger(__name__)

DRAFT_LOGPROB = "draft_logprob"
# draft_logprob_source values written into run.json
FROM_LOGITS = "compute_logits: log-softmax (T = 1) of the greedy draft"
FROM_PROBS = "vLLM's draft probabilities (probabilistic drafts, softmax(z / T))"


def draft_logprob_unavailable(drafter: Any, level: str) -> str | None:
    """Why the drafted token's log-probability cannot be taken (None: it can)."""
    if DRAFT_LOGPROB not in LEVEL_FIELDS.get(level, frozenset()):
        return f"not recorded: tap level {level!r}"
    if getattr(drafter, "use_local_argmax_reduction", False):
        return "not recorded: use_local_argmax_reduction (vLLM computes no full logits)"
    if getattr(drafter, "use_heterogeneous_vocab", False):
        return "not recorded: use_heterogeneous_vocab (the argmax is over constrained logits)"
    if getattr(drafter, "parallel_drafting", False):
        return "not recorded: parallel drafting (one compute_logits call for all positions)"
    if not callable(getattr(getattr(drafter, "model", None), "compute_logits", None)):
        return "not recorded: the draft model has no compute_logits"
    return None


def top_logprob(logits: torch.Tensor) -> torch.Tensor:
    """``[R]`` float32 log-softmax of each row's argmax, ``max - logsumexp``: the largest
    log-softmax, log-softmax being monotonic (its fused kernel takes a third of the time of
    torch's logsumexp and a max on a CPU)."""
    return logits.log_softmax(dim=-1, dtype=torch.float32).amax(dim=-1)


class Eagle3Tap(SpecTap):
    """An Eagle3 tap: staging plus where its ``draft_logprob`` comes from (run.json)."""

    source: str | None = None

    def _set_source(self, source: str | None) -> None:
        if source is None or source == self.source:
            return
        self.source = source
        if self.recorder.writer is not None:
            self.recorder.writer.update_meta(draft_logprob_source=source)
        if source.startswith("not recorded: "):
            self.recorder.note_null([DRAFT_LOGPROB], source.removeprefix("not recorded: "))


class Eagle3V1Tap(Eagle3Tap):
    """A V1 model runner's tap (Eagle3), with the drafted tokens' log-probabilities."""

    def __init__(self, *, drafter: Any, **kwargs: Any) -> None:
        reason = draft_logprob_unavailable(drafter, kwargs["level"])
        fields = {DRAFT_LOGPROB: torch.float32} if reason is None else None
        super().__init__(extra_fields=fields, **kwargs)
        self.drafter = drafter
        self.recording = reason is None
        self._collecting = False
        self._calls: list[torch.Tensor] = []
        self._warned = False
        if reason is None:
            wrap_compute_logits(drafter.model, self)
        self._set_source(reason)

    def begin(self) -> None:
        """A ``propose`` starts: collect its ``compute_logits`` calls."""
        self._calls = []
        self._collecting = self.recording

    def observe(self, logits: torch.Tensor) -> None:
        if self._collecting:
            self._calls.append(top_logprob(logits))

    def _logprobs(self, drafts: torch.Tensor, rows: int) -> torch.Tensor | None:
        """``[rows, k]`` log-probabilities of this step's drafts, or None."""
        k = int(drafts.shape[1])
        if k == 0:  # a step that drafted nothing (a batch-size schedule's n = 0)
            return drafts.new_zeros((rows, 0), dtype=torch.float32)
        take = getattr(self.drafter, "take_last_draft_probs", None)
        probs = take() if callable(take) else None
        if probs is not None:  # sampled drafts: vLLM's own distribution
            picked = probs[:rows, :k].gather(-1, drafts[:rows, :k].long().unsqueeze(-1))
            self._set_source(FROM_PROBS)
            return picked.squeeze(-1).float().clamp_min(torch.finfo(torch.float32).tiny).log()
        calls = self._calls
        if len(calls) != k or any(c.shape[0] < rows for c in calls):
            if not self._warned:
                self._warned = True
                logger.warning(
                    "dsparklab: %d compute_logits calls for a %d-token draft of %d rows; "
                    "draft_logprob left null for such steps",
                    len(calls),
                    k,
                    rows,
                )
            return None
        self._set_source(FROM_LOGITS)
        return torch.stack([c[:rows] for c in calls], dim=1)

    def stage_values(self, slot: HostSlot, drafts: torch.Tensor) -> None:
        self._collecting = False
        if self.recording:
            rows = len(slot.meta["req_ids"])
            padded = torch.full(
                (rows, self.n), float("nan"), dtype=torch.float32, device=drafts.device
            )
            values = self._logprobs(drafts, rows)
            if values is not None:
                k = min(self.n, int(values.shape[1]))
                padded[:, :k] = values[:, :k]
            self.ring.copy_in(slot, DRAFT_LOGPROB, padded)
            self._calls = []


def wrap_compute_logits(model: Any, tap: Eagle3V1Tap | Eagle3V2Tap) -> None:
    """Wrap ``model.compute_logits`` on the instance: the tap observes every result."""
    original = model.compute_logits
    if getattr(original, "__dsparklab_tap__", False):
        return

    @functools.wraps(original)
    def compute_logits(*args: Any, **kwargs: Any) -> Any:
        logits = original(*args, **kwargs)
        if tap.active and isinstance(logits, torch.Tensor):
            try:
                with inference_mode():
                    tap.observe(logits)
            except Exception as err:
                tap.fail("compute_logits (draft log-probability)", err)
        return logits

    model.compute_logits = mark(compute_logits, original)


# -- Model Runner V2 ------------------------------------------------------------------------
FROM_GRAPH = "compute_logits: log-softmax (T = 1) of the greedy draft, in the draft graph"
FROM_CACHE = "vLLM's draft logits cache (probabilistic drafts, log_softmax(z / T))"


class Eagle3V2Tap(Eagle3Tap):
    """A V2 Eagle3 speculator's tap (``EagleSpeculator``), with the drafts' log-probabilities.

    V2 drafts every position through ``DraftModelSpeculator.sample_draft``:
    ``model.compute_logits(h)`` for the batch, then ``greedy_argmax`` (0.34; ``argmax``
    before) or ``gumbel_sample`` with the draft logits cache, inside FULL CUDA graphs (the
    first position in the prefill graph, the others by replaying one decode graph with
    ``current_draft_step`` set). So the greedy tap is graph-safe: the wrapped
    ``compute_logits`` writes ``max - logsumexp`` of each row into a persistent
    ``[max_num_reqs, n]`` buffer, at the column held by the device tensor
    ``current_draft_step`` (``index_copy_``): a capture records it, a replay repeats it at
    the step's column. Probabilistic drafts (``draft_logits`` is not None) are read after
    ``propose``, outside the graph: vLLM caches each step's logits before temperature,
    ``log_softmax(z / T)`` at the drafted token is the sampled distribution's.
    """

    def __init__(self, *, spec: Any, **kwargs: Any) -> None:
        reason = draft_logprob_unavailable(spec, kwargs["level"])
        step = getattr(spec, "current_draft_step", None)
        if reason is None and not isinstance(step, torch.Tensor):
            reason = "not recorded: the speculator has no current_draft_step tensor"
        fields = {DRAFT_LOGPROB: torch.float32} if reason is None else None
        super().__init__(extra_fields=fields, **kwargs)
        self.spec = spec
        self.recording = reason is None
        self.logprob = torch.full(
            (self.max_num_reqs, self.n), float("nan"), dtype=torch.float32, device=self.device
        )
        if reason is None:
            wrap_compute_logits(spec.model, self)
        self._set_source(reason)

    def observe(self, logits: torch.Tensor) -> None:
        """Graph-safe: each row's greedy log-probability into the step's column (sampled
        drafts are read from vLLM's cache after ``propose`` instead)."""
        if self.spec.draft_logits is not None:
            return
        rows = logits.shape[0]
        step = self.spec.current_draft_step.view(1).to(torch.int64)
        self.logprob[:rows].index_copy_(1, step, top_logprob(logits).unsqueeze(1))

    def before(self, rows: int) -> None:
        """A draft step starts (outside the graph): its rows read "not computed"."""
        self.logprob[:rows].fill_(float("nan"))

    def _from_cache(self, drafts: torch.Tensor, rows: int, idx_mapping: torch.Tensor) -> Any:
        cache = self.spec.draft_logits
        # 0.34: a DraftLogitsCache; before, the tensor itself (whose own ``values`` is a
        # sparse tensor's method, so the type decides, not getattr)
        values = cache if isinstance(cache, torch.Tensor) else cache.values
        if getattr(cache, "row_mapping", None) is not None:
            return None  # batch-sharded: rows live on their owning rank
        k = min(self.n, int(drafts.shape[1]))
        logits = values[idx_mapping[:rows], :k].float()  # [R, k, V] before temperature
        scale = temperature_scale(self.spec.temperature[idx_mapping[:rows]])
        assert scale is not None
        picked = drafts[:rows, :k].long().unsqueeze(-1)
        logprobs = (logits / scale.unsqueeze(-1)).log_softmax(-1)
        # a step that drafted fewer than n tokens (vLLM's skip_drafts, or the tail of a
        # shorter window) holds -1 there: no token, no log-probability (and no index)
        values = logprobs.gather(-1, picked.clamp(min=0)).squeeze(-1)
        return values.masked_fill(picked.squeeze(-1) < 0, float("nan"))

    def stage_values(self, slot: HostSlot, drafts: torch.Tensor) -> None:
        idx_mapping = slot.meta.pop("idx_mapping", None)
        if self.recording:
            rows = len(slot.meta["req_ids"])
            if self.spec.draft_logits is None:
                self._set_source(FROM_GRAPH)
                self.ring.copy_in(slot, DRAFT_LOGPROB, self.logprob[:rows])
            else:
                values = self._from_cache(drafts, rows, idx_mapping)
                if values is None:
                    self._set_source("not recorded: batch-sharded draft logits cache")
                else:
                    self._set_source(FROM_CACHE)
                    padded = torch.full_like(self.logprob[:rows], float("nan"))
                    padded[:, : values.shape[1]] = values
                    self.ring.copy_in(slot, DRAFT_LOGPROB, padded)
