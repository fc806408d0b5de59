"""A measured acceptance curve as vLLM's synthetic acceptance: replay it to measure its cost.

vLLM's ``rejection_sample_method: "synthetic"`` accepts draft tokens with given
per-position *unconditional* rates (``synthetic_acceptance_rates``, vLLM
``vllm/config/speculative.py``, ``SpeculativeConfig``: "Position i's entry is the marginal
probability that the first i+1 draft tokens are all accepted; the list must have length
num_speculative_tokens, each entry in [0, 1], and be monotonically non-increasing";
checked by ``_resolve_synthetic_acceptance_rates``, 0.32.0 and 0.34.0 alike). That is this
lab's survival :math:`s_i`, so the acceptance measured on one fleet can be served on other
hardware, at any load, with any drafter of the same window, and its throughput measured
there without the drafter's quality in the way.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from dsparklab.analysis._frames import require_columns
from dsparklab.errors import MissingInputError

SYNTHETIC_METHOD = "synthetic"


def synthetic_acceptance_config(
    by_position: pd.DataFrame, *, method: str, n: int, speculative_method: str | None = None
) -> dict[str, Any]:
    """vLLM's speculative config replaying one group's survival curve.

    Parameters
    ----------
    by_position
        One group's rows of :func:`~dsparklab.analysis.compute_acceptance_by_position`
        (``position``, ``survival``), the window ``n`` long.
    method, n
        The drafter the curve was measured with and its window (provenance; ``n`` is
        ``num_speculative_tokens``).
    speculative_method
        vLLM's ``method`` of the config (default: ``method``; the drafter served with it
        decides the draft pass's cost, the rates decide acceptance).

    Returns
    -------
    dict
        ``{"method", "num_speculative_tokens", "rejection_sample_method": "synthetic",
        "synthetic_acceptance_rates": [r_0, ..., r_{n-1}]}``, with

        .. math:: r_i = s_i = \\prod_{j \\le i} a_j

        (:math:`a_j` NaN where nothing was reached counts as 0), rounded to 6 digits and
        made non-increasing by a running minimum, which only absorbs that rounding.

    Raises
    ------
    MissingInputError
        The rows do not cover positions 0 .. n - 1 exactly once.
    """
    require_columns(by_position, ("position", "survival"), what="synthetic_acceptance_config")
    positions = sorted(int(p) for p in by_position["position"])
    if positions != list(range(n)):
        raise MissingInputError(
            f"a synthetic acceptance curve needs positions 0..{n - 1} once each (one group "
            f"at n = {n}); got positions {positions}"
        )
    survival = by_position.sort_values("position")["survival"].astype(float).tolist()
    rates: list[float] = []
    for value in survival:
        value = 0.0 if math.isnan(value) else min(max(round(value, 6), 0.0), 1.0)
        rates.append(min(value, rates[-1]) if rates else value)
    return {
        "method": speculative_method or method,
        "num_speculative_tokens": int(n),
        "rejection_sample_method": SYNTHETIC_METHOD,
        "synthetic_acceptance_rates": rates,
    }
