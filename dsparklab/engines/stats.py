r"""The per-run draft tally every engine keeps, and the acceptance length computed from it.

For the verify steps :math:`s = 1..S` of a run, step s drafting :math:`k_s` positions of
which the verifier accepts a prefix of length :math:`a_s` (and emits :math:`a_s + 1`
tokens, the bonus included):

.. math::

    \text{num\_steps} = S, \quad
    \text{num\_drafted} = \sum_s k_s, \quad
    \text{num\_accepted} = \sum_s a_s, \quad
    \text{num\_emitted} = \sum_s (a_s + 1), \quad
    \text{accepted\_per\_pos}[i] = \#\{s : a_s > i\}

    \mathrm{AL} = 1 + \frac{\text{num\_accepted}}{S} \quad (1 \text{ when } S = 0), \qquad
    a_i = \frac{\text{accepted\_per\_pos}[i]}{\text{accepted\_per\_pos}[i - 1]}
    \quad (\text{accepted\_per\_pos}[-1] = S)

The names are the ones run.json's ``stats`` has always carried (the committed traces, the
zoo cards read them). vLLM's ``SpecDecodingStats`` / Prometheus counters map onto them:
``num_drafts`` -> ``num_steps``, ``num_draft_tokens`` -> ``num_drafted``,
``num_accepted_tokens`` -> ``num_accepted``, ``num_accepted_tokens_per_pos`` ->
``accepted_per_pos``. Tallies of the same n merge by addition. Standard library only: both
engines import this module without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dsparklab.errors import DSparkLabError


def acceptance_length(num_accepted: float, num_steps: float) -> float:
    """Mean acceptance length with the bonus token, ``1 + accepted / steps``; 1.0 with no steps."""
    return 1.0 + num_accepted / num_steps if num_steps else 1.0


@dataclass
class DraftStats:
    """Counters over the verify steps of one run (or several of the same n, merged)."""

    num_steps: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    num_emitted: int = 0
    # accepted_per_pos[i] = steps whose position i was accepted; its length is n
    accepted_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, num_speculative_tokens: int) -> DraftStats:
        return cls(accepted_per_pos=[0] * num_speculative_tokens)

    @property
    def num_speculative_tokens(self) -> int:
        return len(self.accepted_per_pos)

    def observe_draft(self, num_drafted: int, accepted_len: int) -> None:
        """Count one verify step that drafted ``num_drafted`` positions and accepted a prefix."""
        n = self.num_speculative_tokens
        if not 0 <= accepted_len <= num_drafted <= n:
            raise DSparkLabError(
                f"accepted {accepted_len} of {num_drafted} drafted tokens with n={n}: need "
                "0 <= accepted <= drafted <= n"
            )
        self.num_steps += 1
        self.num_drafted += num_drafted
        self.num_accepted += accepted_len
        self.num_emitted += accepted_len + 1
        for i in range(accepted_len):
            self.accepted_per_pos[i] += 1

    def _combine(self, other: DraftStats, sign: int) -> DraftStats:
        if other.num_speculative_tokens != self.num_speculative_tokens:
            raise DSparkLabError(
                f"cannot combine tallies of n={other.num_speculative_tokens} and "
                f"n={self.num_speculative_tokens}"
            )
        return DraftStats(
            num_steps=self.num_steps + sign * other.num_steps,
            num_drafted=self.num_drafted + sign * other.num_drafted,
            num_accepted=self.num_accepted + sign * other.num_accepted,
            num_emitted=self.num_emitted + sign * other.num_emitted,
            accepted_per_pos=[
                a + sign * b
                for a, b in zip(self.accepted_per_pos, other.accepted_per_pos, strict=True)
            ],
        )

    def merge(self, other: DraftStats) -> DraftStats:
        """The sum of two tallies of the same n."""
        return self._combine(other, 1)

    def since(self, earlier: DraftStats) -> DraftStats:
        """What was counted after ``earlier`` (two readings of growing counters)."""
        return self._combine(earlier, -1)

    @property
    def mean_acceptance_length(self) -> float:
        """AL (:func:`acceptance_length`) of the tally."""
        return acceptance_length(self.num_accepted, self.num_steps)

    @property
    def conditional_acceptance_per_pos(self) -> list[float | None]:
        """a_i = P(accepted_i | reached_i); None where position i was never reached."""
        reached = [self.num_steps, *self.accepted_per_pos[:-1]]
        return [a / r if r else None for a, r in zip(self.accepted_per_pos, reached, strict=True)]

    def to_json(self) -> dict[str, Any]:
        """Counters plus the acceptance length, as run.json's ``stats`` holds them."""
        return {
            "num_steps": self.num_steps,
            "num_drafted": self.num_drafted,
            "num_accepted": self.num_accepted,
            "num_emitted": self.num_emitted,
            "accepted_per_pos": list(self.accepted_per_pos),
            "mean_acceptance_length": self.mean_acceptance_length,
        }
