r"""Per-run draft tallies of the reference engine.

A step drafts n tokens and the verifier accepts a prefix of length :math:`a`; the step
emits :math:`a + 1` tokens (the bonus included). Over S steps

.. math::

    \mathrm{AL} = 1 + \frac{\sum_s a_s}{S}, \qquad
    \hat s_i = \frac{\#\{s : a_s > i\}}{S}

(AL is the mean acceptance length with the bonus token, :math:`\hat s_i` the survival
of position i). Counters are ``num_*`` sums so runs merge by addition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class DraftStats:
    """Counters over the steps of one run (or several, merged)."""

    num_steps: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    num_emitted: int = 0
    # accepted_per_pos[i] = steps whose position i was accepted
    accepted_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, num_speculative_tokens: int) -> DraftStats:
        return cls(accepted_per_pos=[0] * num_speculative_tokens)

    def observe_draft(self, num_drafted: int, accepted_len: int) -> None:
        """Count one verified step that drafted ``num_drafted`` and accepted a prefix."""
        if len(self.accepted_per_pos) < num_drafted:
            self.accepted_per_pos.extend([0] * (num_drafted - len(self.accepted_per_pos)))
        self.num_steps += 1
        self.num_drafted += num_drafted
        self.num_accepted += accepted_len
        self.num_emitted += accepted_len + 1
        for i in range(accepted_len):
            self.accepted_per_pos[i] += 1

    def merge(self, other: DraftStats) -> DraftStats:
        """The sum of two tallies."""
        width = max(len(self.accepted_per_pos), len(other.accepted_per_pos))
        pad = [0] * width
        return DraftStats(
            num_steps=self.num_steps + other.num_steps,
            num_drafted=self.num_drafted + other.num_drafted,
            num_accepted=self.num_accepted + other.num_accepted,
            num_emitted=self.num_emitted + other.num_emitted,
            accepted_per_pos=[
                a + b
                for a, b in zip(
                    (self.accepted_per_pos + pad)[:width],
                    (other.accepted_per_pos + pad)[:width],
                    strict=True,
                )
            ],
        )

    @property
    def mean_acceptance_length(self) -> float:
        """AL = 1 + accepted / steps (bonus token included); 1.0 when nothing was drafted."""
        if self.num_steps == 0:
            return 1.0
        return 1.0 + self.num_accepted / self.num_steps

    @property
    def survival_per_pos(self) -> list[float]:
        """Fraction of steps whose position i was accepted (every earlier one too)."""
        if self.num_steps == 0:
            return [0.0] * len(self.accepted_per_pos)
        return [a / self.num_steps for a in self.accepted_per_pos]

    @property
    def conditional_acceptance_per_pos(self) -> list[float | None]:
        """a_i = P(accepted_i | reached_i); None where position i was never reached."""
        reached = [self.num_steps, *self.accepted_per_pos[:-1]]
        return [a / r if r else None for a, r in zip(self.accepted_per_pos, reached, strict=True)]

    def to_json(self) -> dict[str, Any]:
        """Counters plus the derived figures, for run.json."""
        return {
            "num_steps": self.num_steps,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "num_emitted": self.num_emitted,
            "accepted_per_pos": list(self.accepted_per_pos),
            "mean_acceptance_length": self.mean_acceptance_length,
        }
