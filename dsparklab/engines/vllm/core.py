r"""Graph-safe tap math: what the DSpark taps compute inside vLLM's draft step.

Pure torch, no vLLM import, so the GPU cost benchmark (``benchmarks/gpu_tap_cost.py``)
runs these very functions under CUDA-graph capture.

For drafted position :math:`i` of request row :math:`r`, with base draft logits
:math:`z^{base}_{r,i}` (the backbone + LM head), Markov bias
:math:`b_{r,i} = W_2 W_1[\text{prev}_{r,i}]` and final logits
:math:`z_{r,i} = z^{base}_{r,i} + b_{r,i}`, and the drafted token's draft-vocabulary
index :math:`t_{r,i}`:

.. math::

    \text{draft\_logprob} &= z_{r,i}[t] - \log\sum_v e^{z_{r,i}[v]} \\
    \text{base\_logprob}  &= z^{base}_{r,i}[t] - \log\sum_v e^{z^{base}_{r,i}[v]} \\
    \text{markov\_bias}   &= b_{r,i}[t], \qquad
    \text{markov\_bias\_norm} = \lVert b_{r,i} \rVert_2 \\
    \text{markov\_flip}   &= [\arg\max_v z^{base}_{r,i} \ne \arg\max_v z_{r,i}] \\
    \text{confidence}     &= \sigma(w^\top [h_{r,i}; W_1[\text{prev}_{r,i}]] + c)

In top-k mode (``dspark_draft_topk``) vLLM adds the bias to the k base candidates only,
so the bias norm is not recorded (null) and the draft log-probability is the one of the
truncated distribution the sampler saw.

Rules that keep every function here safe inside a FULL CUDA graph: only tensor ops on
the device, results written in place into buffers allocated before capture
(:class:`TapBuffers`), no ``.item()``, no host copies, no data-dependent shapes. Reading
the buffers happens outside the graph (:class:`StagingRing`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from dsparklab.engines.vllm.clock import StepClock, is_cuda_device

# Position fields the DSpark taps fill; NaN (floats) or -1 (flip) means "not computed".
# In this order in ``TapBuffers.floats``: a dense step writes a leading run of it (light:
# the bias; full: the first four), so one copy writes them all.
FLOAT_FIELDS: tuple[str, ...] = (
    "markov_bias",
    "draft_logprob",
    "markov_bias_norm",
    "base_logprob",
    "confidence",
)
TAP_FIELDS: tuple[str, ...] = (*FLOAT_FIELDS, "markov_flip")
# A host slot's float fields: views of its ``floats`` block, which one copy stages
FLOAT_VIEWS: dict[str, tuple[str, int]] = {
    name: ("floats", i) for i, name in enumerate(FLOAT_FIELDS)
}
# Fields each level computes (the rest stay null).
LEVEL_FIELDS: dict[str, frozenset[str]] = {
    "full": frozenset(TAP_FIELDS),
    "light": frozenset({"markov_bias", "markov_flip", "confidence"}),
}
FLIP_UNSET = -1


@dataclass
class TapBuffers:
    """Persistent per-(row, position) tap outputs, ``[max_num_reqs, n]`` each.

    Allocated once, before CUDA-graph capture (vLLM's ``load_draft_model``); the taps
    write rows ``[:num_reqs]`` of column ``i`` at every draft step.
    """

    draft_logprob: torch.Tensor  # [max_num_reqs, n] float32
    base_logprob: torch.Tensor  # [max_num_reqs, n] float32
    markov_bias: torch.Tensor  # [max_num_reqs, n] float32
    markov_bias_norm: torch.Tensor  # [max_num_reqs, n] float32
    confidence: torch.Tensor  # [max_num_reqs, n] float32
    markov_flip: torch.Tensor  # [max_num_reqs, n] int8, -1 = not computed
    # [len(FLOAT_FIELDS), max_num_reqs, n]: the float fields above are views of it, so one
    # op marks them all "not computed" and one copy writes a step's fields
    floats: torch.Tensor

    @classmethod
    def allocate(cls, max_num_reqs: int, n: int, device: torch.device | str) -> TapBuffers:
        shape = (len(FLOAT_FIELDS), max_num_reqs, n)
        floats = torch.full(shape, float("nan"), dtype=torch.float32, device=device)
        flip = torch.full((max_num_reqs, n), FLIP_UNSET, dtype=torch.int8, device=device)
        views = dict(zip(FLOAT_FIELDS, floats, strict=True))
        return cls(**views, markov_flip=flip, floats=floats)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in TAP_FIELDS}

    def staged(self) -> dict[str, torch.Tensor]:
        """What a step's staging copies, whole: the float fields as one block (a host
        slot's :data:`FLOAT_VIEWS`) and the flip."""
        return {"floats": self.floats, "markov_flip": self.markov_flip}

    def reset_(self, rows: int | None = None) -> None:
        """Mark rows ``[:rows]`` (all when None) "not computed"; in place, graph-safe."""
        self.floats[:, :rows].fill_(float("nan"))
        self.markov_flip[:rows].fill_(FLIP_UNSET)

    def write_floats_(self, columns: Mapping[str, torch.Tensor], rows: int, k: int) -> None:
        """Float fields' ``[rows, k]`` values into rows ``[:rows]``, positions ``[:k]``, in
        place: one copy when they are a leading run of :data:`FLOAT_FIELDS` (a dense step's),
        else one per field."""
        run = FLOAT_FIELDS[: len(columns)]
        if len(run) > 1 and set(run) == set(columns):
            torch.stack([columns[n] for n in run], out=self.floats[: len(run), :rows, :k])
            return
        for name, value in columns.items():
            getattr(self, name)[:rows, :k].copy_(value)


@dataclass(frozen=True)
class BatchShard:
    """The batch rows one tensor-parallel rank samples under vLLM 0.34's batch-sharded
    sequential sampling: row ``r`` belongs to rank ``r mod size``, and the rank runs the
    Markov loop over its rows in order, as slots ``0 .. ceil(num_reqs / size) - 1`` (slot
    ``k`` is row ``rank + k * size``; the last slots may be padding)."""

    rank: int
    size: int
    num_reqs: int

    @property
    def slots(self) -> int:
        return -(-self.num_reqs // self.size)

    def to_batch_rows_(self, buffers: TapBuffers) -> None:
        """Move the values the taps wrote by slot (rows ``[:slots]``) to their batch rows;
        the rows other ranks sample become "not computed". In place, with fixed shapes
        (a captured graph replays it)."""
        rows = torch.arange(self.num_reqs, device=buffers.markov_flip.device)
        slot_of_row = rows // self.size  # row r = rank + k * size sits in slot k
        mine = (rows % self.size == self.rank).unsqueeze(1)
        for name, tensor in buffers.tensors().items():
            unset = FLIP_UNSET if name == "markov_flip" else float("nan")
            moved = torch.where(mine, tensor[slot_of_row], torch.full_like(tensor[:1], unset))
            tensor[: self.num_reqs].copy_(moved)


@dataclass
class DraftStash:
    """References to tensors of the draft step in progress (Python side, capture-time).

    The wrapped model methods put their inputs/outputs here; the wrapped sampler reads
    them. Nothing here outlives one ``_sample_sequential`` call.
    """

    mode: str = "dense"  # "dense" | "topk"
    num_reqs: int = 0
    hidden: torch.Tensor | None = None  # [R*n, H] sample hidden states
    base: torch.Tensor | None = None  # [R, n, V] base draft logits (dense mode)
    base_argmax: torch.Tensor | None = None  # [R, n] (dense mode)
    base_lse: torch.Tensor | None = None  # [R, n] float32 (top-k mode, before the fill)
    scale: torch.Tensor | None = None  # [R, 1] the rows' temperature_scale
    greedy: bool = False  # the step's drafts are the final logits' argmax
    positions: int = 0  # positions recorded so far this step
    sampled: int = 0  # vLLM's per-position sampler calls seen this step (any mode)
    # (positions, values) of the dense positions recorded this step, written at its end
    recorded: list[tuple[list[int], dict[str, torch.Tensor]]] = field(default_factory=list)
    # (i, bias [R, V]) of each dense position whose values are taken at the step's end,
    # all at once (its drafted ids: ``drafted``; its final logits: base + bias)
    kept: list[tuple[int, torch.Tensor]] = field(default_factory=list)
    # [R, n] target ids vLLM's dense loop writes each position's draft into: the
    # speculator's ``draft_tokens``, or (vLLM 0.34) ``_sample_markov_chain``'s ``out_tokens``
    drafted: torch.Tensor | None = None
    # the step's rows are marked "not computed" at its end, where it is known which fields
    # it wrote, not at its start (a dense step on a CPU, which writes them all at its end)
    reset_at_end: bool = False
    bias: torch.Tensor | None = None  # [R, V] Markov bias of the current position
    embeds: list[torch.Tensor] = field(default_factory=list)  # n x [R, r]
    topk_values: torch.Tensor | None = None  # [R, k] base values of the candidates
    topk_index: torch.Tensor | None = None  # [R, k] candidate draft-vocab ids
    topk_final: torch.Tensor | None = None  # [R, k] candidates after the bias

    def clear(self) -> None:
        self.mode = "dense"
        self.num_reqs = 0
        self.hidden = self.base = self.base_argmax = self.base_lse = self.bias = None
        self.scale = None
        self.greedy = False
        self.positions = self.sampled = 0
        self.reset_at_end = False
        self.recorded = []
        self.kept = []
        self.drafted = None
        self.topk_values = self.topk_index = self.topk_final = None
        self.embeds = []


def target_to_draft_index(
    draft_to_target_offset: torch.Tensor | None, target_vocab_size: int
) -> torch.Tensor | None:
    """Inverse of vLLM's ``d2t`` offsets (``target = draft + d2t[draft]``).

    Returns ``[target_vocab_size]`` int64 draft ids (0 where a target id has no draft
    id), or None for a full-vocabulary drafter (identity). Built once at load time.
    """
    if draft_to_target_offset is None:
        return None
    d2t = draft_to_target_offset.to(torch.int64)
    draft_ids = torch.arange(d2t.shape[0], device=d2t.device, dtype=torch.int64)
    index = torch.zeros(target_vocab_size, dtype=torch.int64, device=d2t.device)
    index[draft_ids + d2t] = draft_ids
    return index


def draft_index(tokens: torch.Tensor, t2d: torch.Tensor | None) -> torch.Tensor:
    """Draft-vocabulary ids ``[..., 1]`` of sampled target-vocabulary ``tokens`` ``[...]``
    (``[R]``: ``[R, 1]``)."""
    idx = tokens if tokens.dtype == torch.int64 else tokens.to(torch.int64)
    if t2d is None:
        return idx.unsqueeze(-1)
    # one kernel, where advanced indexing dispatches several
    return t2d.index_select(0, idx.reshape(-1)).view(*tokens.shape, 1)


def temperature_scale(temperature: torch.Tensor | None) -> torch.Tensor | None:
    """``[R, 1]`` divisor: the request's temperature, 1 for greedy rows (T = 0).

    None (no division) when every row is greedy and the tensor is on the CPU, where asking
    costs no device sync and there is no graph to capture; on an accelerator the divisor is
    always built, so the step stays graph-safe.
    """
    if temperature is None:
        return None
    # on the CPU asked through numpy: three torch ops and a bool cost ~20 us a step there
    if temperature.is_cpu and not (_float32(temperature).numpy() > 0).any():
        return None
    t = _float32(temperature).unsqueeze(-1)
    return torch.where(t > 0, t, torch.ones_like(t))


class ZeroTest:
    """``test(t)``: whether the CPU tensor ``t`` holds +0.0 only (a temperature table where
    no request state samples), as one comparison of its bytes. In an engine step every torch
    or numpy call runs on caches the target's forward left cold: measured here after a
    matmul, a numpy comparison over 8 floats costs 45 us, this 3 us (6 us over 1,024). The
    byte view is kept for the tensor last asked about (vLLM's persistent buffer); a
    negative zero or a NaN reads as not zero."""

    def __init__(self) -> None:
        self._tensor: torch.Tensor | None = None
        self._view = memoryview(b"")
        self._zeros = b""

    def __call__(self, t: torch.Tensor) -> bool:
        if t is not self._tensor:
            view = memoryview(t.detach().contiguous().numpy()).cast("B")  # type: ignore[arg-type]
            if not t.is_contiguous():  # a copy's bytes, not the table's: asked afresh
                return view.tobytes() == bytes(len(view))
            self._view, self._zeros, self._tensor = view, bytes(len(view)), t
        return self._view.tobytes() == self._zeros


# kept per position; write_step forms the flip from it and the base log-probs at the ids
FINAL_ARGMAX = "final_argmax"
DRAFT_IDS = "draft_ids"


def _float32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32, with no call into torch where it is already (``.float()`` on a
    float32 tensor returns it, but is a dispatch of its own)."""
    return x if x.dtype == torch.float32 else x.float()


def first_argmax(x: torch.Tensor) -> torch.Tensor:
    """``x.argmax(dim=-1)``: the first maximal index over the last dimension (a NaN counts
    as the largest, as in torch). On the CPU through numpy, whose argmax is vectorised where
    torch's CPU kernel is a scalar loop (measured here over 4 x 7 x 4,096 logits: 9 us
    against 99 us in float32, 410 us in bf16); nothing is captured on a CPU. On an
    accelerator torch's own, graph-safe."""
    if not x.is_cpu:
        return x.argmax(dim=-1)
    # no conversion where there is none to make: each is a dispatch of its own
    x = x.detach() if x.requires_grad else x
    return torch.from_numpy(_float32(x).numpy().argmax(axis=-1))


def dense_position_values(
    bias: torch.Tensor,  # [R, k, V] Markov bias of k positions
    final: torch.Tensor | None,  # [R, k, V] base + bias, what the sampler saw
    ids: torch.Tensor,  # [R, k] drafted draft-vocab ids
    *,
    level: str = "full",
    scale: torch.Tensor | None = None,  # [R, 1] temperature_scale of the rows
    greedy: bool = False,  # the drafts are the final logits' argmax (vLLM's greedy drafting)
) -> dict[str, torch.Tensor]:
    """The tap values of ``k`` positions of a dense (non-top-k) DSpark draft step, ``[R, k]``
    each, for :func:`write_step`, which forms ``markov_flip`` for the whole step from the
    final argmax kept here (``FINAL_ARGMAX``) and the base argmax, and ``base_logprob`` at
    the drafted ids kept here (``DRAFT_IDS``).

    One position at a time (``k = 1``, views of its tensors) as it is sampled, or every
    position of the step at once (stacked) at its end: on a CPU each op is a few
    microseconds of dispatch, the taps' largest cost there, so the DSpark tap takes the
    step at once; under a captured graph dispatch costs nothing, and one position at a time
    needs no stacked copies of the step's logits (``DSparkTap.positions_at_end``). The base
    logits' share is taken once per step (:func:`write_step`, the base argmax), and a
    greedy draft is the final argmax already. Log-probabilities are taken at the request's
    sampling temperature (logits / T; unscaled for greedy rows), the reference engine's
    convention. Nothing here converts dtypes a buffer's copy converts anyway. ``final`` is
    read only at level ``full`` or for sampled drafts (None otherwise).
    """
    values = {"markov_bias": bias.gather(2, ids.unsqueeze(-1)).squeeze(-1), DRAFT_IDS: ids}
    values[FINAL_ARGMAX] = ids  # a greedy draft's
    if greedy and level != "full":
        return values
    if final is None:
        raise ValueError("the final logits are needed at level full and for sampled drafts")
    if not greedy:
        values[FINAL_ARGMAX] = first_argmax(final)
    if level == "full":
        values["draft_logprob"] = logprob_at(final, ids, scale)
        values["markov_bias_norm"] = torch.linalg.vector_norm(bias, dim=-1, dtype=torch.float32)
    return values


def logprob_at(
    logits: torch.Tensor,  # [R, k, V]
    ids: torch.Tensor,  # [R, k]
    scale: torch.Tensor | None = None,  # [R, 1] temperature_scale of the rows
) -> torch.Tensor:
    """``[R, k]`` float32 ``log_softmax(logits / T)`` at ``ids``; log_softmax's fused kernel
    takes half the time of logsumexp on a CPU."""
    x = logits if scale is None else logits / scale.unsqueeze(-1)  # float32 from here
    logprobs = x.log_softmax(dim=-1, dtype=torch.float32)
    return logprobs.gather(2, ids.unsqueeze(-1)).squeeze(-1)


def write_step(
    buffers: TapBuffers,
    recorded: Sequence[tuple[Sequence[int], Mapping[str, torch.Tensor]]],
    base_argmax: torch.Tensor,  # [R, n] argmax of each position's base logits
    base: torch.Tensor | None = None,  # [R, n, V] base logits, for base_logprob
    scale: torch.Tensor | None = None,  # [R, 1] temperature_scale of the rows
) -> None:
    """A dense step's recorded positions into ``buffers``, in place, with ``markov_flip =
    base argmax != final argmax`` and, given ``base`` and every position recorded,
    ``base_logprob`` (:func:`logprob_at` the drafted ids). ``recorded``: ``(positions,
    values)`` pairs from :func:`dense_position_values`, one ``[R, len(positions)]`` column
    per position by field name.

    The columns are joined into one ``[R, k]`` tensor per field (as they come when the step
    was taken at once), so the flip is one comparison and positions ``0 .. k-1`` in order
    (every step whose hooks all ran) take one copy for the float fields and one for the
    flip; any other set is written position by position.
    """
    if not recorded:
        return
    steps = [i for positions, _ in recorded for i in positions]
    columns = (
        dict(recorded[0][1])
        if len(recorded) == 1
        else {name: torch.cat([v[name] for _, v in recorded], dim=1) for name in recorded[0][1]}
    )
    final_argmax, ids = columns.pop(FINAL_ARGMAX), columns.pop(DRAFT_IDS)
    rows, k = final_argmax.shape
    if steps == list(range(k)):
        if base is not None and k == base.shape[1]:
            columns["base_logprob"] = logprob_at(base, ids, scale)
        if base_argmax.shape != final_argmax.shape:  # no slicing op where none is needed
            base_argmax = base_argmax[:rows, :k]
        torch.ne(base_argmax, final_argmax, out=buffers.markov_flip[:rows, :k])
        buffers.write_floats_(columns, rows, k)
        return
    for j, i in enumerate(steps):
        flip = buffers.markov_flip[:rows, i : i + 1]
        torch.ne(base_argmax[:rows, i : i + 1], final_argmax[:, j : j + 1], out=flip)
        for name, value in columns.items():
            getattr(buffers, name)[:rows, i : i + 1].copy_(value[:, j : j + 1])


def topk_base_lse(base: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """``[R, n]`` float32 log-sum-exp of the full base logits ``[R, n, V]`` (top-k mode).

    Must run before vLLM overwrites the base logits with ``-inf`` (it reuses the buffer).
    With ``scale`` (``[R, 1]``, :func:`temperature_scale`), of ``base / T`` (greedy rows
    unscaled).
    """
    x = base.float()
    if scale is not None:
        x = x / scale.unsqueeze(-1)
    return torch.logsumexp(x, dim=-1)


def tap_topk_position(
    buffers: TapBuffers,
    i: int,
    base_lse_i: torch.Tensor | None,  # [R] float32, None at level "light"
    values_i: torch.Tensor,  # [R, k] base logits of the candidates (sorted, largest first)
    index_i: torch.Tensor,  # [R, k] candidate draft-vocab ids
    final_i: torch.Tensor,  # [R, k] candidate logits after the Markov bias
    idx: torch.Tensor,  # [R, 1] drafted draft-vocab ids
    *,
    level: str = "full",
    scale: torch.Tensor | None = None,  # [R, 1] temperature_scale of the rows
) -> None:
    """Record position ``i`` of a top-k DSpark draft step, in place.

    ``base_lse_i`` must be taken at the same temperature (:func:`topk_base_lse`).
    """
    rows = idx.shape[0]
    hit = (index_i == idx).to(torch.float32)  # [R, k] one-hot slot of the drafted token
    bias = (final_i.float() - values_i.float()) * hit
    buffers.markov_bias[:rows, i].copy_(bias.sum(dim=-1))
    flip = index_i.gather(1, final_i.argmax(dim=-1, keepdim=True)).squeeze(1) != index_i[:, 0]
    buffers.markov_flip[:rows, i].copy_(flip.to(torch.int8))
    if level == "full":
        final_f, values_f = final_i.float(), values_i.float()
        if scale is not None:
            final_f, values_f = final_f / scale, values_f / scale
        at_token = (final_f * hit).sum(dim=-1)
        buffers.draft_logprob[:rows, i].copy_(at_token - torch.logsumexp(final_f, dim=-1))
        if base_lse_i is not None:
            base_at = (values_f * hit).sum(dim=-1)
            buffers.base_logprob[:rows, i].copy_(base_at - base_lse_i)


def tap_confidence(buffers: TapBuffers, confidence: torch.Tensor, num_reqs: int) -> None:
    """Record the confidence head's output ``[R*n]`` (row-major) for rows ``[:R]``."""
    n = buffers.confidence.shape[1]
    buffers.confidence[:num_reqs].copy_(confidence.reshape(num_reqs, n).float())


@dataclass(frozen=True)
class HeadColumns:
    """The DSpark confidence head's weight ``w [1, H + r]`` split into the columns its two
    matrix products read (``[H, 1]`` and ``[r, 1]``, views) and its bias ``c``, float32:
    made once, as each slice and transpose is a dispatch of its own."""

    hidden: torch.Tensor  # [H, 1]
    markov: torch.Tensor  # [r, 1] (r = 0: a head without Markov input)
    bias: torch.Tensor | None  # [1]

    @classmethod
    def of(cls, weight: torch.Tensor, bias: torch.Tensor | None, hidden_dim: int) -> HeadColumns:
        w = weight.float()
        return cls(w[:, :hidden_dim].T, w[:, hidden_dim:].T, None if bias is None else bias.float())

    def confidence(
        self,
        hidden: torch.Tensor,  # [R*n, H]
        embeds: torch.Tensor | None,  # [R*n, r] or None (head without Markov input)
        out: torch.Tensor | None = None,  # [R*n] float32, contiguous: written in place
    ) -> torch.Tensor:
        """``sigmoid(w_h . h + c + w_e . e)`` -> ``[R*n]`` float32, written into ``out``
        where given (a tap buffer's rows)."""
        logit = hidden.new_empty(hidden.shape[0], dtype=torch.float32) if out is None else out
        column = logit.view(-1, 1)
        hidden = _float32(hidden)
        if self.bias is None:
            torch.mm(hidden, self.hidden, out=column)
        else:
            torch.addmm(self.bias, hidden, self.hidden, out=column)
        if embeds is not None and self.markov.shape[0]:
            column.addmm_(_float32(embeds), self.markov)
        return logit.sigmoid_()


def confidence_from_head(
    head_weight: torch.Tensor,  # [1, H (+ r)]
    head_bias: torch.Tensor | None,  # [1]
    hidden: torch.Tensor,  # [R*n, H]
    markov_embeds: torch.Tensor | None,  # [R*n, r] or None (head without Markov input)
) -> torch.Tensor:
    """``sigmoid(w . [h; e] + c)`` -> ``[R*n]`` float32 (the DSpark confidence head), as
    ``w_h . h + c`` and ``+= w_e . e``: two matrix products, no joined copy of the inputs
    (:meth:`HeadColumns.confidence`)."""
    return HeadColumns.of(head_weight, head_bias, hidden.shape[-1]).confidence(
        hidden, markov_embeds
    )


def affine_map(
    head: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    hidden_dim: int,
    embed_dim: int,
    *,
    chunk: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(w [1, H + r], c [1])``, float32, with ``head(h, e) = [h; e] . w + c`` when ``head``
    is affine (the DSpark confidence head's logit), read off its outputs: ``c`` at zero,
    each weight at a unit vector, less ``c`` (exact for a head without bias). For a CPU,
    where vLLM's linear is a oneDNN call on a packed weight it does not keep, costing tens
    of microseconds for one output column; :class:`HeadColumns` then evaluates it
    with one small matmul. The caller checks the map against the head before using it.
    """
    dim = hidden_dim + embed_dim
    zero = torch.zeros(1, dim)
    c = head(zero[:, :hidden_dim], zero[:, hidden_dim:]).float().reshape(1)
    weights = []
    for start in range(0, dim, chunk):  # unit vectors a chunk at a time, bounding memory
        rows = torch.arange(min(chunk, dim - start))
        units = torch.zeros(len(rows), dim)
        units[rows, rows + start] = 1.0
        weights.append(head(units[:, :hidden_dim], units[:, hidden_dim:]).float().reshape(-1))
    return (torch.cat(weights) - c).unsqueeze(0), c


def _pinned(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, pin_memory=is_cuda_device(device))


@dataclass
class HostSlot:
    """Host copies of one draft step: verification results and the new drafts."""

    tensors: dict[str, torch.Tensor]  # host (pinned on CUDA) [max_num_reqs, ...]
    event: Any = None  # torch.cuda.Event recorded after the copies, None on CPU
    # the marks of the draft pass and, once its engine step ended, of the whole step
    clock: StepClock | None = None
    busy: bool = False
    meta: dict[str, Any] = field(default_factory=dict)  # req_ids, num_reqs, ... (host)
    # ``tensors``' memory as numpy arrays, made once: the recorder reads a slot through
    # them, as a slice of a tensor is a torch call (5-10 us each, about 20 a slot) made
    # under the interpreter lock the engine's thread needs
    arrays: dict[str, np.ndarray] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.arrays = {name: tensor.numpy() for name, tensor in self.tensors.items()}

    def ready(self) -> bool:
        copied = self.event is None or bool(self.event.query())
        return copied and (self.clock is None or self.clock.ready())

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()
        if self.clock is not None:
            self.clock.wait()


class StagingRing:
    """A few host slots that device tensors are copied into without blocking.

    ``copy_in`` issues ``non_blocking`` device-to-host copies into pinned memory and
    records an event; the host reads a slot only once its event has completed, so the
    draft step never waits for the copies. On CPU the copies are plain and immediate.
    """

    def __init__(
        self,
        specs: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
        device: torch.device | str,
        *,
        views: Mapping[str, tuple[str, int]] | None = None,
        num_slots: int = 4,
    ) -> None:
        """``views``: field name -> (block in ``specs``, index), a field read as one row of a
        block that is staged by one copy (:data:`FLOAT_VIEWS`)."""
        self.device = torch.device(device)
        self.is_cuda = is_cuda_device(self.device)  # kept: asked at every copy
        self.specs = dict(specs)
        self.slots = []
        for _ in range(num_slots):
            tensors = {k: _pinned(shape, dt, self.device) for k, (shape, dt) in specs.items()}
            for name, (block, index) in (views or {}).items():
                tensors[name] = tensors[block][index]
            self.slots.append(HostSlot(tensors))
        self._next = 0

    def acquire(self) -> HostSlot | None:
        """The next free slot, or None when every slot still waits to be read."""
        for _ in range(len(self.slots)):
            slot = self.slots[self._next]
            self._next = (self._next + 1) % len(self.slots)
            if not slot.busy:
                slot.busy = True
                slot.meta = {}
                slot.event = None
                slot.clock = StepClock(self.is_cuda)
                return slot
        return None

    def copy_in(self, slot: HostSlot, name: str, src: torch.Tensor) -> None:
        """Copy ``src`` (device) into the leading corner of ``slot``'s host tensor: rows
        ``[:R]`` of a field, ``[:, :R]`` of a block of fields."""
        dst = slot.tensors[name]
        if dst.shape != src.shape:  # no indexing op for a whole tensor (a step's tap buffers)
            dst = dst[tuple(map(slice, src.shape))]
        dst.copy_(src, non_blocking=self.is_cuda)  # converting the dtype as it copies

    def seal(self, slot: HostSlot) -> None:
        """Record the event that marks the end of ``slot``'s copies (CUDA only)."""
        if self.is_cuda:
            event = torch.cuda.Event()
            event.record()
            slot.event = event

    @staticmethod
    def release(slot: HostSlot) -> None:
        slot.busy = False
        slot.meta = {}
