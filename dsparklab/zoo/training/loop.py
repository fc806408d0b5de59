"""The optimizer loop: a number of steps or a wall-time budget, resumable state saved as
it goes, and callbacks after given amounts of data (the learning curve's snapshots)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from dsparklab.zoo.training.data import BatchStream
from dsparklab.zoo.training.report import smoothed

logger = logging.getLogger(__name__)

# Optimizer steps between re-estimates of a budgeted run's schedule length.
REPLAN_EVERY = 100


def lr_lambda(warmup: int, total: int) -> Callable[[int], float]:
    """Linear warmup to 1, then cosine down to 0.1."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.45 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return factor


def make_optimizer(
    params: Iterable[torch.nn.Parameter],
    lr: float,
    weight_decay: float,
    warmup: int,
    total_steps: Callable[[], int],
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over the trainable parameters with the warmup-cosine schedule.

    ``total_steps`` is read at every step: a budgeted run re-estimates its length.
    """
    trainable = [p for p in params if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr, betas=(0.9, 0.95), weight_decay=weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: lr_lambda(warmup, total_steps())(step)
    )
    return opt, sched


def optimizer_step(
    model: torch.nn.Module,
    loss: torch.Tensor,
    opt: torch.optim.Optimizer,
    sched: torch.optim.lr_scheduler.LambdaLR,
) -> float:
    """Backward, clip the gradient norm to 1, step optimizer and schedule; the loss value."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def bf16_autocast(enabled: bool) -> torch.autocast:
    """CPU bf16 autocast, or a no-op when not ``enabled``."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


def count_params(module: torch.nn.Module, trainable_only: bool = False) -> int:
    """Parameters of ``module`` (only those with gradients when ``trainable_only``)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad or not trainable_only)


@dataclass(frozen=True)
class LoopPlan:
    """How long a drafter trains, and what it leaves on the way.

    Attributes
    ----------
    steps : int
        Optimizer steps; with ``time_budget_s`` only the first estimate (the schedule's
        length is re-estimated from the measured step time every ``REPLAN_EVERY`` steps,
        and training stops when the budget is spent).
    time_budget_s : float or None
        Training wall seconds (summed over resumed runs); None trains ``steps`` steps.
    state_path : Path or None
        Where the resumable state (weights, optimizer, schedule, step) is saved every
        ``checkpoint_s`` seconds and at the end; an existing file is resumed from.
    checkpoint_s : float
        Seconds between state saves.
    milestones : tuple of int
        Answer tokens seen (first pass over the data) after which ``on_milestone`` is
        called with that count: the learning curve's snapshots.
    """

    steps: int
    time_budget_s: float | None = None
    state_path: Path | None = None
    checkpoint_s: float = 300.0
    milestones: tuple[int, ...] = ()


def train_loop(
    name: str,
    model: Any,
    plan: LoopPlan,
    lr: float,
    warmup: int,
    stream: BatchStream,
    step_fn: Callable[[list[int]], tuple[torch.Tensor, dict[str, Any]]],
    metric_fn: Callable[[dict[str, Any]], dict[str, float]],
    autocast_bf16: bool,
    on_milestone: Callable[[int], None] | None = None,
) -> tuple[list[float], dict[str, float], dict[str, Any]]:
    """Train until ``plan`` says stop; returns losses, last metrics and a summary."""
    schedule = {"total": plan.steps}
    opt, sched = make_optimizer(model.parameters(), lr, 0.0, warmup, lambda: schedule["total"])
    step, elapsed, losses = 0, 0.0, []
    if plan.state_path is not None and plan.state_path.is_file():
        state = torch.load(plan.state_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        step, elapsed, losses = state["step"], state["elapsed"], state["losses"]
        schedule["total"] = state["total"]
        logger.info("%s: resumed at step %d (%.0f s trained)", name, step, elapsed)

    def save_state() -> None:
        if plan.state_path is None:
            return
        tmp = plan.state_path.with_name(plan.state_path.name + ".tmp")
        state = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "step": step,
            "elapsed": elapsed,
            "losses": losses,
            "total": schedule["total"],
        }
        torch.save(state, tmp)
        tmp.replace(plan.state_path)

    def done() -> bool:
        if plan.time_budget_s is not None:
            return elapsed >= plan.time_budget_s
        return step >= schedule["total"]

    model.train()
    last_metrics: dict[str, float] = {}
    last_save = time.monotonic()
    bar = tqdm(desc=name, unit="step", initial=step, total=schedule["total"])
    while not done():
        started = time.perf_counter()
        torch.manual_seed(stream.seed * 1_000_003 + step)  # anchors etc.: a function of step
        with bf16_autocast(autocast_bf16):
            loss, metrics = step_fn(stream.rows(step))
        losses.append(optimizer_step(model, loss, opt, sched))
        last_metrics = metric_fn(metrics)
        step += 1
        elapsed += time.perf_counter() - started
        if plan.time_budget_s is not None and step % REPLAN_EVERY == 0:
            schedule["total"] = step + int((plan.time_budget_s - elapsed) / (elapsed / step))
            bar.total = schedule["total"]
        seen_before, seen = stream.answer_tokens_seen(step - 1), stream.answer_tokens_seen(step)
        for mark in plan.milestones:
            if seen_before < mark <= seen and on_milestone is not None:
                model.eval()
                on_milestone(mark)
                model.train()
        bar.update(1)
        bar.set_postfix(
            loss=f"{smoothed(losses):.3f}",
            **{k: f"{v:.2f}" for k, v in list(last_metrics.items())[:2]},
        )
        if time.monotonic() - last_save > plan.checkpoint_s:
            save_state()
            last_save = time.monotonic()
    bar.close()
    save_state()
    model.eval()
    summary = {
        "steps": step,
        "train_seconds": round(elapsed, 1),
        "answer_tokens_seen": stream.answer_tokens_seen(step),
        "passes_over_data": round(step * stream.per_step / stream.num, 3),
    }
    return losses, last_metrics, summary
