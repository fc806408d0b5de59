"""The Markov counterfactual draws what the analysis gives: the bias's rate and the base
argmax's bounds, nothing computed in between."""

from __future__ import annotations

import math

import pandas as pd

from dsparklab.plots import plot_markov_counterfactual


def test_the_base_argmax_is_drawn_as_its_bounds_only() -> None:
    rows = pd.DataFrame(
        {
            "method": "dspark",
            "n": 3,
            "position": [0, 1, 2],
            "accept_rate": [0.8, 0.6, 0.5],
            "base_accept_rate_lo": [0.70, 0.40, 0.30],
            "base_accept_rate_hi": [0.90, 0.65, 0.55],
        }
    )
    fig = plot_markov_counterfactual(rows)
    (rate,) = [t for t in fig.data if t.name.endswith("with bias")]
    (bounds,) = [t for t in fig.data if t.name.endswith("(bounds)")]
    assert list(rate.y) == [0.8, 0.6, 0.5]
    drawn = [v for v in bounds.y if v is not None and not math.isnan(v)]
    assert drawn == [0.70, 0.90, 0.40, 0.65, 0.30, 0.55]  # no midpoint among them
