"""Host staging: one speculator's tap state outside the graph, and the propose wrapper.

A :class:`SpecTap` belongs to one speculator (Model Runner V2) or model runner (V1). Around
each ``propose`` it copies, before the draft step, what verification of the previous
drafts produced (``num_sampled`` / ``num_rejected``, the emitted token, sequence lengths)
and, after it, the new draft tokens and any in-graph tap buffers, with ``non_blocking``
copies into a pinned :class:`~dsparklab.engines.vllm.core.StagingRing` slot. The recorder
reads a slot once its CUDA event has completed, so the draft step never waits for the
trace. Any exception is caught (:meth:`SpecTap.fail`): tracing stops for that engine and
vLLM runs on unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

import torch

from dsparklab.engines.vllm.clock import StepClock, active_step
from dsparklab.engines.vllm.core import FLOAT_VIEWS, HostSlot, StagingRing, TapBuffers
from dsparklab.engines.vllm.recorder import TraceRecorder
from dsparklab.errors import DSparkLabError

logger = logging.getLogger(__name__)

# Marks our wrappers, so patching twice is a no-op and _unwrap finds vLLM's function.
MARK = "__dsparklab_tap__"
# Where a speculator / model runner keeps its tap (None, kept too, when not recording).
TAP_ATTR = "_dsparklab_tap"
# Enough slots for the flush thread's read interval at hundreds of steps/s.
STAGING_SLOTS = 64


def mark(wrapper: Any, original: Any) -> Any:
    """Tag ``wrapper`` as ours, wrapping ``original``; returns ``wrapper``."""
    setattr(wrapper, MARK, True)
    wrapper.__wrapped__ = original
    return wrapper


class ArgumentReader:
    """Reads named arguments of calls to one function without ``Signature.bind`` (which
    costs ~10 us a call, paid per drafted position in the DSpark taps)."""

    def __init__(self, fn: Any) -> None:
        parameters = inspect.signature(fn).parameters
        self.position = {name: i for i, name in enumerate(parameters)}
        self.defaults = {
            name: p.default for name, p in parameters.items() if p.default is not p.empty
        }

    def get(self, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> Any:
        """The value ``name`` takes in the call ``fn(*args, **kwargs)``."""
        if name in kwargs:
            return kwargs[name]
        index = self.position[name]
        if index < len(args):
            return args[index]
        if name in self.defaults:
            return self.defaults[name]
        raise TypeError(f"missing argument {name!r}")


def unwrap(fn: Any) -> Any:
    """vLLM's own function under any of our wrappers."""
    while hasattr(fn, "__wrapped__") and getattr(fn, MARK, False):
        fn = fn.__wrapped__
    return fn


class SpecTap:
    """Host-side tap state of one speculator (V2) or model runner (V1) in this process."""

    def __init__(
        self,
        *,
        recorder: TraceRecorder,
        n: int,
        max_num_reqs: int,
        device: torch.device,
        level: str,
        model_runner: str = "v2",
        buffers: TapBuffers | None = None,
        extra_fields: Mapping[str, torch.dtype] | None = None,
    ) -> None:
        self.recorder = recorder
        self.n = n
        self.max_num_reqs = max_num_reqs
        self.device = device
        self.level = level
        self.model_runner = model_runner
        self.buffers = buffers
        self.active = True
        specs: dict[str, tuple[tuple[int, ...], torch.dtype]] = {
            "num_sampled": ((max_num_reqs,), torch.int32),
            "num_rejected": ((max_num_reqs,), torch.int32),
            "seq_lens": ((max_num_reqs,), torch.int64),
            "last_token": ((max_num_reqs,), torch.int64),
            "draft_tokens": ((max_num_reqs, n), torch.int64),
        }
        if buffers is not None:
            specs |= {name: (tuple(t.shape), t.dtype) for name, t in buffers.staged().items()}
        # per-(row, position) fields a subclass stages itself (``[max_num_reqs, n]``)
        for name, dtype in (extra_fields or {}).items():
            specs[name] = ((max_num_reqs, n), dtype)
        views = FLOAT_VIEWS if buffers is not None else None
        self.ring = StagingRing(specs, device, views=views, num_slots=STAGING_SLOTS)
        # the slot of the engine step in progress, staged when the step ends
        # (:mod:`~dsparklab.engines.vllm.clock` times the whole step)
        self.held: HostSlot | None = None

    def fail(self, where: str, err: BaseException) -> None:
        """Fail open: log once, stop tracing for this engine, mark the run failed."""
        if not self.active:
            return
        self.active = False
        held, self.held = self.held, None
        if held is not None:
            self.ring.release(held)
        self.on_fail()
        logger.error(
            "dsparklab: tap error in %s (%s: %s); tracing is disabled for this engine, "
            "vLLM's drafts and outputs are unaffected",
            where,
            type(err).__name__,
            err,
            exc_info=err,
        )
        self.recorder.fail(f"tap error in {where}: {type(err).__name__}: {err}")

    def on_fail(self) -> None:
        """Drop per-step state (subclasses with in-graph state override)."""

    # -- staging -----------------------------------------------------------------------
    def acquire(self) -> HostSlot:
        slot = self.ring.acquire()
        if slot is None:  # every slot still queued: read the oldest (rare)
            self.recorder.process_ready(block=True)
            slot = self.ring.acquire()
        if slot is None:
            raise DSparkLabError("no free staging slot after draining the recorder")
        return slot

    @staticmethod
    def start_timer(slot: HostSlot) -> None:
        """The draft pass starts (``draft_start`` on the slot's clock)."""
        assert slot.clock is not None
        slot.clock.mark("draft_start")

    def after(self, slot: HostSlot, drafts: torch.Tensor) -> None:
        """The draft pass ended: stage the method's own values (:meth:`stage_values`), the
        new drafts and the tap buffers of the rows in ``slot``; hand it on, or hold it until
        its engine step ends when that step is timed."""
        assert slot.clock is not None
        slot.clock.mark("draft_end")  # before any tap's work: that is not vLLM's draft
        self.stage_values(slot, drafts)
        rows = len(slot.meta["req_ids"])
        if "num_drafted" not in slot.meta:
            slot.meta["num_drafted"] = min(self.n, int(drafts.shape[1]))
        if slot.meta["num_drafted"]:  # nothing drafted (a schedule's n = 0): nothing to copy
            self.ring.copy_in(slot, "draft_tokens", drafts[:rows, : self.n])
        if self.buffers is not None:
            # every row: the first rows of a [fields, rows, n] block are not contiguous, and a
            # non-contiguous copy into pinned memory waits for the GPU (a pageable temporary)
            for name, tensor in self.buffers.staged().items():
                self.ring.copy_in(slot, name, tensor)
        self.ring.seal(slot)
        stale, self.held = self.held, None
        if stale is not None:  # a held step whose end was not seen: hand it on first
            self.hand_on(stale)
        if active_step() is not None:  # the step clock hands it on when the step ends
            self.held = slot
            return
        self.hand_on(slot)

    def stage_values(self, slot: HostSlot, drafts: torch.Tensor) -> None:
        """Stage into ``slot`` what this method's taps take on the host after the draft
        pass (the in-graph buffers :meth:`after` stages itself); nothing by default."""

    def hand_on(self, slot: HostSlot) -> None:
        """Queue ``slot`` for the recorder (and read it here without a flush thread)."""
        self.recorder.stage(slot, release=self.ring.release)
        if not self.recorder.background:
            self.recorder.process_ready()

    def end_step(self, step: StepClock) -> None:
        """The engine step ended: hand on its held slot with the step's marks."""
        slot, self.held = self.held, None
        if slot is None:
            return
        assert slot.clock is not None
        slot.clock.adopt(step)
        self.hand_on(slot)


def tap_of(obj: Any) -> SpecTap | None:
    """The active tap kept on ``obj`` (a speculator or model runner), or None."""
    tap = obj.__dict__.get(TAP_ATTR) if hasattr(obj, "__dict__") else None
    return tap if isinstance(tap, SpecTap) and tap.active else None


def inference_mode() -> contextlib.AbstractContextManager[Any]:
    """``torch.inference_mode()``, or no context when it is on already: vLLM's runners
    call ``propose`` in it, and entering it again costs tens of microseconds on a CPU."""
    return _NO_CONTEXT if torch.is_inference_mode_enabled() else torch.inference_mode()


_NO_CONTEXT = contextlib.nullcontext()

# What a ``before`` hook reads the propose call's arguments with: name -> value (its default
# where the call left it out)
Arguments = Callable[[str], Any]


def wrap_propose(
    original: Callable[..., Any],
    where: str,
    get_tap: Callable[[Any], SpecTap | None],
    before: Callable[[SpecTap, Any, Arguments], HostSlot | None],
    check: Callable[[Any], None] | None = None,
) -> Callable[..., Any]:
    """Wrap a propose method: stage what verification saw before it, the drafts after it.

    Every argument, known or not, is passed on to vLLM unchanged.
    """
    reader = ArgumentReader(original)

    @functools.wraps(original)
    def propose(self: Any, *args: Any, **kwargs: Any) -> Any:
        tap = get_tap(self)
        if tap is None:
            return original(self, *args, **kwargs)
        slot = None
        mode = inference_mode()  # asked once: each ask is a few microseconds in a step
        try:
            call = (self, *args)
            with mode:
                slot = before(tap, self, lambda name: reader.get(name, call, kwargs))
        except Exception as err:
            tap.fail(f"{where} (verification copy)", err)
        out = original(self, *args, **kwargs)
        if slot is not None and tap.active:
            try:
                if check is not None:
                    check(out)
                with mode:
                    tap.after(slot, out)
            except Exception as err:
                tap.fail(f"{where} (draft copy)", err)
        return out

    return mark(propose, original)
