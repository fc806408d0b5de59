"""In-graph DSpark taps: what runs inside vLLM's (FULL CUDA graph) DSpark draft step.

``DSparkSpeculator.load_draft_model`` allocates the persistent tap buffers
(``[max_num_reqs, n]``, before graph capture) and wraps four methods of the loaded draft
model on the instance (any DSpark model class: Qwen3, DeepSeek-V4, Kimi, MuseSpark):
``compute_draft_logits``, ``markov_embed`` (or a recurrent head's ``markov_step``, vLLM 0.34),
``markov_bias`` and, for the top-k path, ``apply_markov_bias_gathered``; one wrapper serves
them all and only keeps references
to their tensors. The wrapped ``_sample_sequential`` / ``_sample_sequential_topk`` /
``_sample_logits`` of the speculator run the tap math of
:mod:`dsparklab.engines.vllm.core`: device ops writing in place into the buffers, so a
graph captures them and replays them with the draft step.

Per step, graph-safe: ``begin`` marks the batch rows "not computed" (NaN, flip -1), so a
field whose hook a draft model skips (its own ``sample_sequential`` fast path, a fused
Markov kernel) is null in the trace, never the previous step's value. Each position
consumes the Markov bias it was given, so a skipped ``markov_bias`` is not reused.

The fused Markov bias (vLLM 0.34): with probabilistic drafts on a full-vocabulary drafter
without watermark, acceptance estimator or output transform, ``_fuse_markov_bias`` is set
and ``_sample_logits`` receives the *base* logits with ``bias=`` (the Gumbel kernel adds it);
the tap records the distribution the sampler used, base + bias, either way.

Batch-sharded sampling (vLLM 0.34, TP > 1): each rank runs ``_sample_markov_chain`` over
its own batch rows (row r on rank r mod TP size) from logits an all-to-all assembled, so
no ``compute_draft_logits`` call is seen; the chain's wrapper hands the tap those logits,
the taps record by slot, and ``end`` moves each slot to its batch row (:class:`BatchShard`).
Every TP rank writes the position rows of the rows it samples into one run, which TP rank 0
owns (run.json, steps); with ``DSPARKLAB_WRITER_RANKS=all`` each rank writes a run of its
own instead, whose run.json marks the DSpark fields ``partial``.

One footing for the log-probabilities: when the draft model has an output logit
transform (``apply_output_logit_transform``, vLLM 0.33: multiplier and tanh soft-cap,
applied to base + bias before sampling), ``draft_logprob``, ``base_logprob`` and
``markov_flip`` are all taken on transformed logits (the sampler's distribution), while
``markov_bias`` / ``markov_bias_norm`` stay the additive bias before the transform.

Confidence: vLLM's own ``draft_token_confidence_probs`` whenever vLLM computes it (the
confidence head under adaptive verification, or the online acceptance estimator when
there is no head); otherwise the taps evaluate the loaded head once per step.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from dsparklab.engines.vllm.core import (
    TAP_FIELDS,
    BatchShard,
    DraftStash,
    HeadColumns,
    HostSlot,
    TapBuffers,
    ZeroTest,
    affine_map,
    dense_position_values,
    draft_index,
    first_argmax,
    tap_confidence,
    tap_topk_position,
    target_to_draft_index,
    temperature_scale,
    topk_base_lse,
    write_step,
)
from dsparklab.engines.vllm.runs import make_tap
from dsparklab.engines.vllm.staging import (
    TAP_ATTR,
    ArgumentReader,
    SpecTap,
    mark,
    tap_of,
)
from dsparklab.errors import DSparkLabError

logger = logging.getLogger(__name__)

# confidence_source values written into run.json
CONFIDENCE_HEAD = "confidence_head"  # vLLM's head output (adaptive verification on)
ACCEPTANCE_ESTIMATOR = "acceptance_estimator"  # vLLM's online estimator (no head)
HEAD_BY_TAPS = "confidence_head_evaluated_by_taps"  # the loaded head, vLLM did not run it


class DSparkTap(SpecTap):
    """A V2 DSpark speculator's tap: host staging plus the in-graph buffers and stash."""

    def __init__(self, *, t2d: torch.Tensor | None = None, **kwargs: Any) -> None:
        buffers = TapBuffers.allocate(kwargs["max_num_reqs"], kwargs["n"], kwargs["device"])
        super().__init__(buffers=buffers, **kwargs)
        self.buffers: TapBuffers = buffers
        self.t2d = t2d
        # a dense step's positions taken at its end, all at once, on a CPU (where each op's
        # dispatch is the taps' largest cost); one by one under a captured graph, which
        # replays without dispatch and so needs no stacked copies of the step's logits
        on_cpu = torch.device(kwargs["device"]).type == "cpu"
        self.positions_at_end = on_cpu
        # whether no request state samples (the temperature table all zero), asked of the
        # table's bytes on a CPU only (a device tensor has none to read, and a captured
        # graph must divide by the temperature whatever it holds)
        self.all_greedy = ZeroTest() if on_cpu else None
        # the confidence head as the affine map it is (:func:`affine_map`), on a CPU: None
        # until the first step checks it against vLLM's head, False where vLLM's is used
        self.head_map: HeadColumns | None | bool = None if on_cpu else False
        self.spec: Any = None  # the speculator this tap belongs to (set at attach)
        self.stash = DraftStash()
        self.in_step = False
        self.confidence_source: str | None = None
        # vLLM 0.34's batch-sharded sampling: the rows this rank samples in this step
        self.shard: BatchShard | None = None
        self.sharded_noted = False  # run.json says which rows the sharded path records
        self._transform: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._transform_of: Any = None  # the draft model _transform was read from
        self._skipped_warned = False

    def on_fail(self) -> None:
        self.in_step = False
        self.shard = None
        self.stash.clear()

    def stage_values(self, slot: HostSlot, drafts: torch.Tensor) -> None:
        """Say whether the step's draft was sampled batch-sharded (the recorder then writes
        the rows this rank sampled). Asked of the speculator at every step, on the host: a
        replayed graph runs no tap Python."""
        size = sharded_sampling_size(self.spec)
        if size is not None:
            slot.meta["sharded_over"] = size

    # -- one draft step ----------------------------------------------------------------
    def begin(self, spec: Any, num_reqs: int, mode: str) -> None:
        """A draft step of ``num_reqs`` batch rows starts; ``mode``: ``"dense"``,
        ``"topk"`` or ``"sharded"`` (vLLM 0.34's batch-sharded loop, dense over this
        rank's rows: the taps write them by slot, and ``end`` moves them to their rows)."""
        stash = self.stash
        stash.clear()
        self.shard = None
        if mode == "sharded":
            rank, size = tensor_parallel_rank_and_size()
            self.shard = BatchShard(rank=rank, size=size, num_reqs=num_reqs)
            self._note_sharded(spec, rank)
            mode = "dense"
        stash.mode = mode
        stash.num_reqs = num_reqs if self.shard is None else self.shard.slots
        self.in_step = self.active
        if self.in_step and mode == "topk" and self.level == "full":
            self.recorder.note_null(
                ["markov_bias_norm"], "draft top-k: the bias is added to the k candidates only"
            )
        if self.in_step:
            # a dense step on a CPU (no graph) writes what it recorded at its end, all at once
            stash.reset_at_end = self.positions_at_end and mode == "dense" and self.shard is None
            if not stash.reset_at_end:
                self.buffers.reset_(num_reqs)
            if spec.model is not self._transform_of:  # once: a module's missing attribute
                self._transform_of = spec.model  # raises inside nn.Module.__getattr__
                self._transform = getattr(spec.model, "apply_output_logit_transform", None)
            # without a draft logits cache vLLM drafts the argmax (``_sample_logits``)
            stash.greedy = getattr(spec, "draft_logits", None) is None

    def _note_sharded(self, spec: Any, rank: int) -> None:
        if self.sharded_noted:
            return
        self.sharded_noted = True
        if self.recorder.joined_rank is not None:  # every rank writes its rows into one run
            logger.info(SHARDED_JOINED, rank, self.recorder.run_dir)
            return
        # vLLM gathers every row's confidence after the loop; the other fields stay on
        # the rank that sampled the row
        gathered = {"confidence"} if vllm_confidence_source(spec) is not None else set()
        local = [name for name in TAP_FIELDS if name not in gathered]
        self.recorder.note_partial(local, SHARDED_WHY.format(rank=rank))

    def on_draft_logits(
        self,
        spec: Any,
        hidden: torch.Tensor,
        base: torch.Tensor,
        states: torch.Tensor | None = None,
    ) -> None:
        """The step's base logits ``[R*n, V]`` and sample hidden states ``[R*n, H]``;
        ``states``: each row's request state (``[R]``, -1 for a padding slot), where the
        caller has them, else read from the speculator's ``sample_idx_mapping``."""
        rows, stash = self.stash.num_reqs, self.stash
        stash.hidden = hidden
        view = base.view(rows, self.n, -1)
        stash.base = view
        if states is None:
            stash.scale = row_scale(spec, rows, self.n, self.all_greedy)
        else:
            stash.scale = state_scale(spec, states, self.all_greedy)
        if stash.mode == "topk":
            if self.level == "full":
                # the top-k path overwrites the base logits with -inf right after this
                stash.base_lse = topk_base_lse(view, stash.scale)
        else:
            # every position's base argmax at once (an output transform is monotonic)
            stash.base_argmax = first_argmax(view)

    def on_topk_bias(self, values: torch.Tensor, index: torch.Tensor, out: torch.Tensor) -> None:
        self.stash.topk_values = values
        self.stash.topk_index = index
        self.stash.topk_final = out.gather(1, index)

    def _skipped(self, what: str, *, confidence: bool = False) -> None:
        """Say once in run.json (and the log) that the draft model's own sampling path
        skips the hook ``what``: the position fields (and ``confidence`` where the head
        could not be evaluated either) are null for that reason, never silently."""
        if not self._skipped_warned:
            self._skipped_warned = True
            why = f"the draft model's own sampling path does not call {what}"
            kept = [name for name in TAP_FIELDS if confidence or name != "confidence"]
            self.recorder.note_null(kept, why)

    def on_sampled(self, logits: torch.Tensor, step: int, tokens: torch.Tensor) -> None:
        stash = self.stash
        stash.sampled += 1
        if stash.mode == "topk":
            idx = draft_index(tokens, self.t2d)
            values, index, final = stash.topk_values, stash.topk_index, stash.topk_final
            stash.topk_values = stash.topk_index = stash.topk_final = None
            if values is None or index is None or final is None:
                self._skipped("apply_markov_bias_gathered")
                return
            base_lse = stash.base_lse[:, step] if stash.base_lse is not None else None
            tap_topk_position(
                self.buffers,
                step,
                base_lse,
                values,
                index,
                final,
                idx,
                level=self.level,
                scale=stash.scale,
            )
            return
        bias, stash.bias = stash.bias, None
        if stash.base_argmax is None or bias is None:
            self._skipped("compute_draft_logits / markov_bias")
            return
        stash.positions += 1
        # ``logits`` already went through any output transform (vLLM applies it to base +
        # bias); the base share, taken once per step in ``end``, goes through it there
        if self.positions_at_end:  # vLLM's loop makes the bias afresh at every position
            # the drafted ids are read at the step's end, where vLLM's dense loop writes
            # each position's (``stash.drafted``); the logits are formed there again
            stash.kept.append((step, bias))
            return
        idx = draft_index(tokens, self.t2d)
        position = self._values(bias.unsqueeze(1), logits.unsqueeze(1), idx)
        stash.recorded.append(([step], position))

    def _values(
        self, bias: torch.Tensor, final: torch.Tensor | None, ids: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        stash = self.stash
        return dense_position_values(
            bias, final, ids, level=self.level, scale=stash.scale, greedy=stash.greedy
        )

    def _take_kept_positions(self) -> list[int]:
        """The values of the positions kept for the step's end, all at once (into
        ``stash.recorded``; no buffer is written); returns those positions."""
        stash = self.stash
        kept, stash.kept = stash.kept, []
        steps = [i for i, _ in kept]
        if not kept or stash.base is None:  # kept only once the step's base logits came
            return steps
        # positions 0 .. k-1 (every step whose hooks all ran): slices, not index copies
        at: slice | list[int] = slice(len(steps)) if steps == list(range(len(steps))) else steps
        # the step's drafted ids, mapped to the draft vocabulary at once
        drafted = stash.drafted if stash.drafted is not None else self.spec.draft_tokens
        ids = draft_index(drafted[: stash.num_reqs, at], self.t2d).squeeze(-1)
        bias = torch.stack([b for _, b in kept], dim=1)
        final = None
        # a greedy draft is the final argmax already: light reads no final logits then
        if self.level == "full" or not stash.greedy:
            # what vLLM sampled from: its loop's (or fused kernel's) base + bias at each
            # position, then any output transform, both elementwise, so the same values
            # formed here for the whole step at once, one pass where a stack of the
            # positions' logits was another
            final = stash.base[:, at] + bias
            if self._transform is not None:
                final = self._transform(final)
        stash.recorded.append((steps, self._values(bias, final, ids)))
        return steps

    def end(self, spec: Any) -> None:
        """After the sequential loop: the base log-probabilities of every position, and
        vLLM's confidence or the head evaluated."""
        try:
            if not self.in_step:
                return
            rows, stash = self.stash.num_reqs, self.stash
            # every position in order: the step's end writes each field of its level
            steps = self._take_kept_positions()
            whole = stash.base_argmax is not None and steps == list(range(self.n))
            if stash.reset_at_end and not whole:
                self.buffers.reset_(rows)
            # the dense positions' values, and the base log-probs at their drafted ids
            if stash.base_argmax is not None:
                base = None
                if self.level == "full" and stash.positions == self.n:
                    base = stash.base
                    if base is not None and self._transform is not None:
                        base = self._transform(base)
                write_step(self.buffers, stash.recorded, stash.base_argmax, base, stash.scale)
            from_vllm = vllm_confidence_source(spec)
            source = from_vllm or self._evaluate_head(spec, rows)  # the head: by slot
            if stash.base is not None and stash.sampled == 0:
                # the model sampled the block itself (a fused Markov kernel: vLLM's
                # sample_sequential hook) and called none of the per-position hooks
                self._skipped("_sample_logits / markov_bias", confidence=source is None)
            if source is None and stash.reset_at_end and whole:
                self.buffers.confidence[:rows].fill_(float("nan"))
            if self.shard is not None:
                self.shard.to_batch_rows_(self.buffers)
                rows = self.shard.num_reqs
            if from_vllm is not None:
                # vLLM's own, for every batch row (gathered across ranks when sharded)
                probs = spec.draft_token_confidence_probs
                self.buffers.confidence[:rows].copy_(probs[:rows, : self.n].float())
            if source != self.confidence_source:
                self.confidence_source = source
                writer = self.recorder.writer
                if writer is not None:
                    writer.update_meta(confidence_source=source)
        finally:
            self.in_step = False
            self.shard = None
            self.stash.clear()

    def _evaluate_head(self, spec: Any, rows: int) -> str | None:
        model = spec.model
        head = getattr(getattr(model, "model", None), "confidence_head", None)
        stash = self.stash
        if head is None or stash.hidden is None or len(stash.embeds) != self.n:
            return None
        embeds = torch.stack(stash.embeds, dim=1).flatten(0, 1)
        if isinstance(self.head_map, HeadColumns):  # straight into the buffer's rows
            out = self.buffers.confidence[:rows].view(-1)
            self.head_map.confidence(stash.hidden, embeds, out=out)
            return HEAD_BY_TAPS
        confidence = model.compute_confidence(stash.hidden, embeds)
        if self.head_map is None:
            self.head_map = checked_head_map(head, stash.hidden, embeds, confidence)
        tap_confidence(self.buffers, confidence, rows)
        return HEAD_BY_TAPS


def checked_head_map(
    head: Any, hidden: torch.Tensor, embeds: torch.Tensor, confidence: torch.Tensor
) -> HeadColumns | bool:
    """The head's :func:`affine_map` (as :class:`HeadColumns`) where it gives vLLM's
    ``confidence`` on this step's inputs (within 1e-6), else False: vLLM's own head from
    then on."""
    try:
        weight, bias = affine_map(head, hidden.shape[-1], embeds.shape[-1])
        columns = HeadColumns.of(weight, bias, hidden.shape[-1])
        again = columns.confidence(hidden, embeds)
    except Exception:  # not a head of two inputs
        return False
    matches = again.shape == confidence.shape and torch.allclose(
        again, confidence.float(), rtol=0.0, atol=1e-6
    )
    if not matches:
        logger.info("dsparklab: the confidence head is not affine; vLLM evaluates it")
        return False
    return columns


def vllm_confidence_source(spec: Any) -> str | None:
    """Whether vLLM fills ``draft_token_confidence_probs`` this step, and from what."""
    if not isinstance(getattr(spec, "draft_token_confidence_probs", None), torch.Tensor):
        return None
    if getattr(spec, "use_confidence_head", False):
        return CONFIDENCE_HEAD
    if getattr(spec, "acceptance_estimator", None) is not None:
        return ACCEPTANCE_ESTIMATOR
    return None


def row_scale(
    spec: Any, rows: int, n: int, all_greedy: ZeroTest | None = None
) -> torch.Tensor | None:
    """``[R, 1]`` :func:`temperature_scale` of each row of the draft step, by
    :func:`state_scale` (None: no division)."""
    mapping = getattr(spec, "sample_idx_mapping", None)
    if not isinstance(mapping, torch.Tensor) or greedy_table(spec, all_greedy):
        return None
    # row r's sample slots are [r*n, (r+1)*n); all map to the row's request state
    return state_scale(spec, mapping[: rows * n : n])


def greedy_table(spec: Any, all_greedy: ZeroTest | None) -> bool:
    """Whether no request state of ``spec`` samples, asked by ``all_greedy`` (a tap's, on a
    CPU: its byte view of the temperature table); False where that is not asked."""
    temperature = getattr(spec, "temperature", None)
    return (
        all_greedy is not None and isinstance(temperature, torch.Tensor) and all_greedy(temperature)
    )


def state_scale(
    spec: Any, states: torch.Tensor, all_greedy: ZeroTest | None = None
) -> torch.Tensor | None:
    """``[R, 1]`` :func:`temperature_scale` of the request states ``states`` (-1: a padding
    slot, read as state 0 and never recorded). None (no division) where the temperature is
    unknown, or on a CPU where none of the rows samples (:func:`temperature_scale`); where
    the caller keeps an ``all_greedy`` (:func:`greedy_table`), first asked of the whole
    table, before any indexing, as greedy serving is the common case."""
    temperature = getattr(spec, "temperature", None)
    if not isinstance(temperature, torch.Tensor) or greedy_table(spec, all_greedy):
        return None
    return temperature_scale(temperature[states.clamp(min=0)])


def tensor_parallel_rank_and_size() -> tuple[int, int]:
    """This process's rank in its tensor-parallel group and the group's size, as vLLM's
    batch-sharded sampling reads them (``get_tp_group()``)."""
    from vllm.distributed import parallel_state

    group = parallel_state.get_tp_group()
    return int(group.rank_in_group), int(group.world_size)


def sharded_sampling_size(spec: Any) -> int | None:
    """The TP size vLLM shards the speculator's sequential sampling over (vLLM 0.34 sets
    ``_sharded_sequential_comm`` at load when it shards, and then shards every draft step),
    else None."""
    if getattr(spec, "_sharded_sequential_comm", None) is None:
        return None
    return tensor_parallel_rank_and_size()[1]


def _dspark_tap(obj: Any) -> DSparkTap | None:
    tap = tap_of(obj)
    return tap if isinstance(tap, DSparkTap) else None


# -- the draft model's methods (on the instance) ------------------------------------------
# What the tap keeps of each call: (tap, the call's arguments, output).
_Record = Callable[[DSparkTap, Callable[[str], Any], Any], None]


def _keep_logits(tap: DSparkTap, arg: Callable[[str], Any], out: Any) -> None:
    tap.on_draft_logits(tap.spec, arg("hidden_states"), out)


def _keep_embed(tap: DSparkTap, arg: Callable[[str], Any], out: Any) -> None:
    tap.stash.embeds.append(out)


def _keep_bias(tap: DSparkTap, arg: Callable[[str], Any], out: Any) -> None:
    tap.stash.bias = out


def _keep_step_embed(tap: DSparkTap, arg: Callable[[str], Any], out: Any) -> None:
    tap.stash.embeds.append(out[0])  # (embedding, carried state): vLLM 0.34's recurrent heads


def _keep_topk(tap: DSparkTap, arg: Callable[[str], Any], out: Any) -> None:
    tap.on_topk_bias(arg("values"), arg("index"), out)


MODEL_TAPS: dict[str, _Record] = {
    "compute_draft_logits": _keep_logits,
    "markov_bias": _keep_bias,
}
# the Markov embedding: ``markov_embed`` (every line), or for a recurrent head (vLLM 0.34,
# ``has_recurrent_markov_head``) ``markov_step``, which vLLM calls instead; a model has one
EMBED_TAPS: dict[str, _Record] = {"markov_embed": _keep_embed, "markov_step": _keep_step_embed}
MODEL_TAPS_OPTIONAL: dict[str, _Record] = {"apply_markov_bias_gathered": _keep_topk}


def wrap_model_method(original: Callable[..., Any], tap: DSparkTap, name: str) -> Any:
    """The one wrapper of the draft model's methods: call vLLM's, keep what the tap needs."""
    record = {**MODEL_TAPS, **EMBED_TAPS, **MODEL_TAPS_OPTIONAL}[name]
    reader = ArgumentReader(original)

    @functools.wraps(original)
    def method(*args: Any, **kwargs: Any) -> Any:
        out = original(*args, **kwargs)
        if tap.in_step:  # called at every drafted position: as few calls as it takes
            try:
                record(tap, lambda a: reader.get(a, args, kwargs), out)
            except Exception as err:
                tap.fail(name, err)
        return out

    return mark(method, original)


def wrap_dspark_model(model: Any, tap: DSparkTap) -> None:
    """Wrap the draft model's DSpark methods on the instance (any DSpark model class)."""
    if not any(callable(getattr(model, name, None)) for name in EMBED_TAPS):
        raise DSparkLabError(
            f"{type(model).__name__} has neither {' nor '.join(EMBED_TAPS)}; cannot tap this "
            "DSpark model"
        )
    for name in (*MODEL_TAPS, *EMBED_TAPS, *MODEL_TAPS_OPTIONAL):
        original = getattr(model, name, None)
        if original is None:
            if name in MODEL_TAPS:
                raise DSparkLabError(
                    f"{type(model).__name__}.{name} is missing; cannot tap this DSpark model"
                )
            continue
        if not getattr(original, "__dsparklab_tap__", False):
            setattr(model, name, wrap_model_method(original, tap, name))


def attach_dspark_tap(spec: Any, model: Any) -> DSparkTap | None:
    """Create the DSpark tap of ``spec`` (buffers, model wrappers); None if not recording."""
    t2d = target_to_draft_index(
        getattr(model, "draft_id_to_target_id", None),
        int(spec.vllm_config.model_config.get_vocab_size()),
    )
    tap = make_tap(spec, model_runner="v2", factory=DSparkTap, t2d=t2d)
    spec.__dict__[TAP_ATTR] = tap
    if isinstance(tap, DSparkTap):
        tap.spec = spec
        wrap_dspark_model(model, tap)
    return tap if isinstance(tap, DSparkTap) else None


# -- the speculator's methods (on the class) ----------------------------------------------
def wrap_load_draft_model(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def load_draft_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = original(self, *args, **kwargs)
        try:
            attach_dspark_tap(self, model)
        except Exception as err:  # fail open: no tap, vLLM loads as usual
            self.__dict__[TAP_ATTR] = None
            logger.error(
                "dsparklab: could not attach the DSpark taps (%s: %s); tracing is off for "
                "this engine",
                type(err).__name__,
                err,
                exc_info=err,
            )
        return model

    return mark(load_draft_model, original)


def _wrap_sequential(original: Callable[..., Any], mode: str) -> Callable[..., Any]:
    reader = ArgumentReader(original)

    @functools.wraps(original)
    def sample_sequential(self: Any, *args: Any, **kwargs: Any) -> Any:
        tap = _dspark_tap(self)
        # dense: with a draft top-k the original delegates to the (wrapped) top-k method
        if tap is None or (mode == "dense" and getattr(self, "_draft_topk", None) is not None):
            return original(self, *args, **kwargs)
        try:
            num_reqs = int(reader.get("num_reqs", (self, *args), kwargs))
            tap.begin(self, num_reqs, mode)
        except Exception as err:
            tap.fail(f"_sample_sequential ({mode})", err)
        try:
            return original(self, *args, **kwargs)
        finally:
            try:
                tap.end(self)
            except Exception as err:
                tap.fail("confidence", err)

    return mark(sample_sequential, original)


def wrap_sample_sequential(original: Callable[..., Any]) -> Callable[..., Any]:
    return _wrap_sequential(original, "dense")


def wrap_sample_sequential_topk(original: Callable[..., Any]) -> Callable[..., Any]:
    return _wrap_sequential(original, "topk")


def sampled_logits(logits: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The logits the sampler drew from: ``logits`` itself, or with vLLM 0.34's fused Markov
    bias (``_sample_logits(base, ..., bias=bias)``, ``_fuse_markov_bias``) base + bias,
    which the Gumbel kernel forms in the logits' dtype, as ``+`` does here."""
    return logits if bias is None else logits + bias


# vLLM 0.34's batch-sharded sequential sampling (TP > 1, --enable-batch-sharded-sampling)
SHARDED_WHY = (
    "batch-sharded sequential sampling (TP > 1 with --enable-batch-sharded-sampling): each "
    "tensor-parallel rank runs the Markov loop over its own batch rows (row r on rank "
    "r mod TP size), so this run, written by rank {rank}, records these fields for that "
    "rank's rows; the other rows are null (DSPARKLAB_WRITER_RANKS=all: every rank's run)"
)


SHARDED_JOINED = (
    "dsparklab: batch-sharded sequential sampling: TP rank %d writes the position rows of "
    "the batch rows it samples into the run %s, which every TP rank writes"
)


def wrap_sample_sequential_sharded(original: Callable[..., Any]) -> Callable[..., Any]:
    return _wrap_sequential(original, "sharded")


def wrap_sample_markov_chain(original: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM 0.34's Markov loop over a block of rows, writing its drafts into
    ``out_tokens`` (the speculator's ``draft_tokens``, or on the sharded path this rank's
    slots), where the tap reads them at the step's end. On the sharded path, where the base
    logits come from an all-to-all of vocabulary shards (no ``compute_draft_logits``
    call), the tap also takes them, the hidden states and the rows' request states here."""
    reader = ArgumentReader(original)

    @functools.wraps(original)
    def sample_markov_chain(self: Any, *args: Any, **kwargs: Any) -> Any:
        tap = _dspark_tap(self)
        if tap is not None and tap.in_step:
            call = (self, *args)
            try:
                tap.stash.drafted = reader.get("out_tokens", call, kwargs)
                if tap.stash.base is None:
                    base = reader.get("base_logits", call, kwargs)
                    states = reader.get("idx_map", call, kwargs)[:, 0]
                    hidden = reader.get("hidden", call, kwargs)
                    tap.on_draft_logits(self, hidden, base.flatten(0, 1), states)
            except Exception as err:
                tap.fail("_sample_markov_chain", err)
        return original(self, *args, **kwargs)

    return mark(sample_markov_chain, original)


def wrap_sample_logits(original: Callable[..., Any]) -> Callable[..., Any]:
    reader = ArgumentReader(original)

    @functools.wraps(original)
    def _sample_logits(self: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        out = original(self, *args, **kwargs)
        tap = _dspark_tap(self)
        if tap is not None and tap.in_step:  # at every drafted position
            try:
                call = (self, *args)
                bias = reader.get("bias", call, kwargs) if "bias" in reader.position else None
                logits = sampled_logits(reader.get("logits", call, kwargs), bias)
                tap.on_sampled(logits, int(reader.get("step", call, kwargs)), out)
            except Exception as err:
                tap.fail("_sample_logits", err)
        return out

    return mark(_sample_logits, original)
