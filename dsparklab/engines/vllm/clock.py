r"""The engine step's clock: named marks of one engine step, read off the hot path.

A mark is taken where vLLM's host code runs, never inside a captured CUDA graph: on a GPU
it is a CUDA event recorded on the current stream (``record`` queues it, nothing waits),
on CPU the host clock (``time.perf_counter``). The recorder reads a step's marks only once
its last event has completed (:meth:`StepClock.ready`), so timing never synchronises the
step.

The marks of one engine step, in the order vLLM's model runner reaches them:

=================  ===================================================================
``step_start``     ``execute_model`` is entered
``forward_start``  the target's forward is about to run (Model Runner V2: vLLM's own
                   ``StepTimingCollector.forward_start`` call, right before it)
``forward_end``    ``execute_model`` returns (the forward and its output state issued)
``sample_start``   the runner's ``sample`` is entered (V2: the rejection sampler, which
``sample_end``     verifies the previous drafts) / returns
``draft_start``    the speculator's ``propose`` is entered / returns (the draft pass)
``draft_end``
``step_end``       ``sample_tokens`` returns
=================  ===================================================================

and what a step costs, from them:

.. math::

    T = t_{step\_end} - t_{step\_start}, \qquad
    D = t_{draft\_end} - t_{draft\_start}, \\
    V = (t_{forward\_end} - t_{forward\_start}) + (t_{sample\_end} - t_{sample\_start}),
    \qquad O = T - V - D

``V`` (verify) is the target's forward over the batch and the sampler's verification,
``D`` the draft pass, ``O`` (other) the rest: input preparation, post-processing, the
prompt log-probabilities, bookkeeping and the wait between ``execute_model`` and
``sample_tokens``. Where a runner gives no forward or sample marks (Model Runner V1),
``V`` is unknown and the recorder keeps ``T - D`` as verify and other together.

The step being timed is kept per thread (a worker runs its model runner on one thread), so
the speculator's ``propose`` wrapper, which does not see the runner, knows whether its
draft pass belongs to a timed step.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import torch


class StepClock:
    """The marks of one engine step (host seconds, or CUDA events on the current stream)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.marks: dict[str, Any] = {}

    def mark(self, name: str) -> None:
        """Take mark ``name`` now (a later mark of the same name replaces it)."""
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks[name] = event
        else:
            self.marks[name] = time.perf_counter()

    def adopt(self, other: StepClock | None) -> None:
        """Take the marks of ``other`` that this clock lacks (the runner's step marks into a
        draft slot's clock)."""
        if other is not None:
            for name, value in other.marks.items():
                self.marks.setdefault(name, value)

    def seconds(self, start: str, end: str) -> float | None:
        """Seconds from mark ``start`` to mark ``end``; None when either is missing."""
        a, b = self.marks.get(start), self.marks.get(end)
        if a is None or b is None:
            return None
        if self.cuda:
            return float(a.elapsed_time(b)) / 1e3
        return float(b - a)

    def ready(self) -> bool:
        """Whether every mark can be read without waiting."""
        return not self.cuda or all(bool(e.query()) for e in self.marks.values())

    def wait(self) -> None:
        if self.cuda:
            for event in self.marks.values():
                event.synchronize()

    # -- what a step cost --------------------------------------------------------------
    def step_s(self) -> float | None:
        """:math:`T`, the whole engine step."""
        return self.seconds("step_start", "step_end")

    def draft_s(self) -> float | None:
        """:math:`D`, the draft pass."""
        return self.seconds("draft_start", "draft_end")

    def verify_s(self) -> float | None:
        """:math:`V`, the target's forward plus the sampler; None without both spans."""
        forward = self.seconds("forward_start", "forward_end")
        sample = self.seconds("sample_start", "sample_end")
        if forward is None or sample is None:
            return None
        return forward + sample


_THREAD = threading.local()


def begin_step(cuda: bool) -> StepClock:
    """Start timing an engine step on this thread (``step_start`` taken)."""
    clock = StepClock(cuda)
    clock.mark("step_start")
    _THREAD.step = clock
    return clock


def active_step() -> StepClock | None:
    """The engine step being timed on this thread, if any."""
    return getattr(_THREAD, "step", None)


def mark_active(name: str) -> None:
    """Take mark ``name`` on the step being timed, if one is."""
    clock = active_step()
    if clock is not None:
        clock.mark(name)


def end_step() -> StepClock | None:
    """Stop timing: ``step_end`` taken; returns the step's clock (None if none was timed)."""
    clock = active_step()
    _THREAD.step = None
    if clock is not None:
        clock.mark("step_end")
    return clock


def drop_step() -> None:
    """Forget the step being timed (it ended without a ``sample_tokens``)."""
    _THREAD.step = None


def on_cuda(owner: Any) -> bool:
    """Whether ``owner`` (a model runner) runs on a CUDA device."""
    device = getattr(owner, "device", None)
    return isinstance(device, torch.device) and is_cuda_device(device)


@functools.lru_cache(maxsize=16)
def is_cuda_device(device: torch.device) -> bool:
    """Whether ``device`` is a CUDA device, asked once per device: ``torch.device.type``
    builds its string through a C++ stream, ~14 us on the caches an engine step leaves
    cold (timed here), and a device hashes without it."""
    return device.type == "cuda"
