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


# NVIDIA specdec_bench's speculation_profile.json, read field by field from
# NVIDIA/Model-Optimizer examples/specdec_bench/specdec_bench/speculation_profile.py
# (build_profile, commit edf879d3daf7879acdeb2dab9f54a591837da7b0): schema 1.0
SPECULATION_PROFILE_SCHEMA = "1.0"
# drafters whose n-token draft is the prefix of their (n + 1)-token draft: one window's
# marginals give every smaller one (that file's _CHAIN_DRAFTING_METHODS)
CHAIN_DRAFTING_METHODS = frozenset({"eagle", "eagle1", "eagle2", "eagle3", "draft_model"})


def speculation_profile(
    counts: pd.DataFrame,
    *,
    method: str,
    n: int,
    draft_checkpoint: dict[str, Any] | None = None,
    target_model: dict[str, Any] | None = None,
    measurement_conditions: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """specdec_bench's ``speculation_profile.json`` of one drafter at one window.

    Parameters
    ----------
    counts
        Per-request acceptance counts of the runs (``run_id``, ``request_id``,
        ``position``, ``n_drafted``, ``n_reached``, ``n_accepted``: the lab's
        ``count_runs(..., "acceptance")``), positions 0 .. n - 1.
    method, n
        The drafter and its window (``num_speculative_tokens``).
    draft_checkpoint, target_model, measurement_conditions
        What was measured, as the profile records it (names and content hashes, never
        local paths; dataset, concurrency, engine, hardware).

    Returns
    -------
    dict
        The profile. With :math:`N` steps and :math:`A_i` of them accepting position
        :math:`i` (prefix-closed), the ``marginal_accept_rates`` are the survival
        :math:`s_i` (as :func:`synthetic_acceptance_config` exports them), the
        ``conditional_accept_rates`` :math:`s_i / s_{i-1}` (:math:`s_{-1} = 1`), the
        ``acceptance_length_histogram`` (tokens a step emitted, bonus included)
        :math:`h_1 = N - A_0`, :math:`h_{k+1} = A_{k-1} - A_k`, :math:`h_{n+1} = A_{n-1}`,
        ``mean_accept_length`` the per-step mean :math:`\\sum_L L h_L / N` and
        ``mean_accept_length_per_request`` the mean of each request's. ``validation``
        holds the source's two checks: :math:`1 + \\sum_i s_i` against the per-step mean
        (tolerance 0.02) and non-increasing marginals.
    """
    from dsparklab.analysis.aggregate import compute_acceptance_by_position

    require_columns(
        counts,
        ("run_id", "request_id", "position", "n_drafted", "n_accepted"),
        what="speculation_profile",
    )
    curve = compute_acceptance_by_position(counts, by=(), n_boot=0)
    marginal = synthetic_acceptance_config(curve, method=method, n=n)["synthetic_acceptance_rates"]
    conditional, previous = [], 1.0
    for value in marginal:
        conditional.append(round(value / previous, 6) if previous > 0 else 0.0)
        previous = value
    pooled = counts.groupby("position")[["n_drafted", "n_accepted"]].sum().reindex(range(n))
    steps = int(pooled.loc[0, "n_drafted"])
    accepted = [int(a) for a in pooled["n_accepted"].fillna(0)]
    histogram = {"1": steps - accepted[0]}
    for k in range(1, n):
        histogram[str(k + 1)] = accepted[k - 1] - accepted[k]
    histogram[str(n + 1)] = accepted[n - 1]
    mean = sum(int(length) * c for length, c in histogram.items()) / steps
    first = counts[counts["position"] == 0].set_index(["run_id", "request_id"])["n_drafted"]
    per_request = counts.groupby(["run_id", "request_id"])["n_accepted"].sum() / first
    implied = 1.0 + sum(marginal)
    rising = [
        {"position": i, "value": marginal[i], "previous": marginal[i - 1]}
        for i in range(1, n)
        if marginal[i] > marginal[i - 1] + 1e-9
    ]
    return {
        "schema_version": SPECULATION_PROFILE_SCHEMA,
        "measured": True,
        "method": method,
        "draft_checkpoint": draft_checkpoint,
        "target_model": target_model,
        "num_speculative_tokens": int(n),
        "block_size": None,
        "max_supported_k": int(n),
        "verification_method": "longest_prefix",
        "conditional_accept_rates": conditional,
        "marginal_accept_rates": marginal,
        "mean_accept_length": round(mean, 6),
        "mean_accept_length_per_request": round(float(1.0 + per_request.mean()), 6),
        "accept_length_model": (
            "chain_analytic" if method.lower() in CHAIN_DRAFTING_METHODS else "measured_per_k"
        ),
        "accept_length_by_k": {str(n): round(mean, 6)},
        "acceptance_length_histogram": histogram,
        "per_category": None,
        "measurement_conditions": measurement_conditions,
        "validation": {
            "mean_consistency": {
                "implied_mean_accept_length": round(implied, 6),
                "reported_mean_accept_length": round(mean, 6),
                "abs_delta": round(abs(implied - mean), 6),
                "tolerance": 0.02,
                "passed": abs(implied - mean) <= 0.02,
            },
            "marginal_monotonicity": {"passed": not rising, "violations": rising},
        },
    }
