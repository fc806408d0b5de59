"""What one engine step cost, and each of its rows' share: from the step's clock to the
``steps`` rows' cost columns and run.json's ``step_costs``."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from dsparklab.engines.vllm.core import HostSlot


@dataclass(frozen=True)
class StepCost:
    """One engine step's batch size and each of its rows' shares of its time (seconds).

    From the step's clock (:mod:`~dsparklab.engines.vllm.clock`): :math:`T`, :math:`D` and,
    where the runner marks its forward and sampler (Model Runner V2), :math:`V`. With
    :math:`V` every part is timed apart: verify :math:`V / B`, other
    :math:`(T - V - D) / B`. Without it (Model Runner V1) verify is :math:`(T - D) / B`,
    verify and other together, and other is unknown (None).
    """

    batch_size: int
    step_time_s: float | None  # the whole engine step, T (None: not timed)
    draft_time_s: float | None  # the draft pass, D (None: none, or not timed)
    verify_time_s: float | None  # the target's forward and the sampler, V (None: not apart)
    draft_share_s: float | None  # D / B
    verify_share_s: float | None  # V / B; else (T - D) / B, or T / B without a draft pass
    other_share_s: float | None  # (T - V - D) / B where V is known

    @classmethod
    def of(cls, slot: HostSlot, batch_size: int) -> StepCost:
        """The costs of the engine step ``slot`` staged (its marks can be read)."""
        clock = slot.clock
        step = clock.step_s() if clock is not None else None
        draft = clock.draft_s() if clock is not None else None
        verify = clock.verify_s() if clock is not None and step is not None else None
        b = max(int(batch_size), 1)
        other = None
        if verify is not None:
            assert step is not None
            verify_share: float | None = verify / b
            other = (step - verify - (draft or 0.0)) / b
        elif step is None or (draft is None and not slot.meta.get("target_only")):
            verify_share = None
        else:
            verify_share = (step - (draft or 0.0)) / b
        return cls(
            batch_size=b,
            step_time_s=step,
            draft_time_s=draft,
            verify_time_s=verify,
            draft_share_s=None if draft is None else draft / b,
            verify_share_s=verify_share,
            other_share_s=other,
        )

    @property
    def share_s(self) -> float | None:
        """One row's share of the whole step (draft + verify + other), when it was timed."""
        if self.step_time_s is None:
            return None
        return self.step_time_s / self.batch_size


@dataclass
class StepCostTally:
    """run.json's ``step_costs``: what the timed engine steps cost and where it went.

    ``step_time_s`` / ``draft_time_s`` / ``verify_time_s``: sums of :math:`T`, :math:`D`
    and :math:`V` over the engine steps timed (``verify_time_s`` over those with :math:`V`,
    ``verify_timed_steps`` of them); ``batch_rows``: sum of their batch sizes;
    ``step_rows``: ``steps`` rows they resolved; ``attributed_s``: those rows' shares (draft
    + verify + other); ``unattributed_s``: the shares of the batch rows that resolved no
    step (prefill chunks, first tokens).
    """

    engine_steps: int = 0
    untimed_engine_steps: int = 0
    verify_timed_steps: int = 0
    step_time_s: float = 0.0
    draft_time_s: float = 0.0
    verify_time_s: float = 0.0
    batch_rows: int = 0
    step_rows: int = 0
    attributed_s: float = 0.0
    unattributed_s: float = 0.0

    def observe(self, cost: StepCost, rows: int) -> None:
        share = cost.share_s
        if share is None:
            self.untimed_engine_steps += 1
            return
        assert cost.step_time_s is not None
        self.engine_steps += 1
        self.step_time_s += cost.step_time_s
        self.draft_time_s += cost.draft_time_s or 0.0
        if cost.verify_time_s is not None:
            self.verify_timed_steps += 1
            self.verify_time_s += cost.verify_time_s
        self.batch_rows += cost.batch_size
        self.step_rows += rows
        self.attributed_s += rows * share
        self.unattributed_s += (cost.batch_size - rows) * share

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
