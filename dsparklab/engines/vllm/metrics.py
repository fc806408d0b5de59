r"""Per-run draft tallies, in vLLM's own terms, to check traces against vLLM's counters.

For drafts :math:`d = 1..D` with :math:`a_d` accepted and :math:`k_d` verified positions:

.. math::

    \text{num\_drafts} = D, \quad
    \text{num\_draft\_tokens} = \sum_d k_d, \quad
    \text{num\_accepted\_tokens} = \sum_d a_d, \quad
    \text{accepted\_per\_pos}[i] = \#\{d : a_d > i\}

These are exactly vLLM's ``SpecDecodingStats`` counters (``vllm/v1/spec_decode/
metrics.py``) and the Prometheus series ``vllm:spec_decode_num_accepted_tokens_per_pos``.
Convention (as in vLLM): the mean acceptance length includes the bonus token,
:math:`1 + \text{num\_accepted\_tokens} / \text{num\_drafts}`, and is 1 with no drafts.
Tallies merge by addition (:meth:`DraftStats.merge`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from dsparklab.errors import DSparkLabError

ACCEPTED_PER_POS_METRIC = "vllm:spec_decode_num_accepted_tokens_per_pos"
NUM_DRAFTS_METRIC = "vllm:spec_decode_num_drafts"
NUM_DRAFT_TOKENS_METRIC = "vllm:spec_decode_num_draft_tokens"
NUM_ACCEPTED_METRIC = "vllm:spec_decode_num_accepted_tokens"


@dataclass
class DraftStats:
    """Counters over verified drafts; ``accepted_per_pos[i]`` counts accepted position i."""

    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    @classmethod
    def new(cls, num_spec_tokens: int) -> DraftStats:
        return cls(num_spec_tokens=num_spec_tokens, accepted_per_pos=[0] * num_spec_tokens)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """Count one verified draft (``num_draft_tokens`` verified, a prefix accepted)."""
        if not 0 <= num_accepted_tokens <= min(num_draft_tokens, self.num_spec_tokens):
            raise DSparkLabError(
                f"accepted {num_accepted_tokens} of {num_draft_tokens} verified tokens with "
                f"n={self.num_spec_tokens}: need 0 <= accepted <= verified <= n"
            )
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        for i in range(num_accepted_tokens):
            self.accepted_per_pos[i] += 1

    def merge(self, other: DraftStats) -> DraftStats:
        if other.num_spec_tokens != self.num_spec_tokens:
            raise DSparkLabError(
                f"cannot merge tallies of n={other.num_spec_tokens} into n={self.num_spec_tokens}"
            )
        return DraftStats(
            num_spec_tokens=self.num_spec_tokens,
            num_drafts=self.num_drafts + other.num_drafts,
            num_draft_tokens=self.num_draft_tokens + other.num_draft_tokens,
            num_accepted_tokens=self.num_accepted_tokens + other.num_accepted_tokens,
            accepted_per_pos=[
                a + b for a, b in zip(self.accepted_per_pos, other.accepted_per_pos, strict=True)
            ],
        )

    def mean_acceptance_length(self) -> float:
        """``1 + accepted / drafts`` (bonus token included); 1.0 with no drafts."""
        if self.num_drafts == 0:
            return 1.0
        return 1.0 + self.num_accepted_tokens / self.num_drafts

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_accepted(cls, num_spec_tokens: int, drafts: Iterable[tuple[int, int]]) -> DraftStats:
        """Tally ``(num_verified, num_accepted)`` pairs."""
        stats = cls.new(num_spec_tokens)
        for verified, accepted in drafts:
            stats.observe_draft(verified, accepted)
        return stats


def stats_from_vllm_metrics(metrics: Iterable[Any], num_spec_tokens: int) -> DraftStats:
    """Read vLLM's spec-decode counters from ``LLM.get_metrics()`` into a DraftStats.

    ``metrics`` are ``vllm.v1.metrics.reader`` objects (``Counter``/``Vector`` with
    ``name``, ``labels`` and ``value``/``values``); counters of several engines add up.
    """
    stats = DraftStats.new(num_spec_tokens)
    for metric in metrics:
        name = getattr(metric, "name", "")
        if name == ACCEPTED_PER_POS_METRIC:
            values = getattr(metric, "values", None)
            if values is not None:  # a Vector: one value per position
                for pos, value in enumerate(values[:num_spec_tokens]):
                    stats.accepted_per_pos[pos] += int(value)
            else:  # one Counter per position label
                pos = int(_labels(metric).get("position", -1))
                if 0 <= pos < num_spec_tokens:
                    stats.accepted_per_pos[pos] += int(metric.value)
        elif name == NUM_DRAFTS_METRIC:
            stats.num_drafts += int(metric.value)
        elif name == NUM_DRAFT_TOKENS_METRIC:
            stats.num_draft_tokens += int(metric.value)
        elif name == NUM_ACCEPTED_METRIC:
            stats.num_accepted_tokens += int(metric.value)
    return stats


def _labels(metric: Any) -> Mapping[str, str]:
    labels = getattr(metric, "labels", None)
    return labels if isinstance(labels, Mapping) else {}
