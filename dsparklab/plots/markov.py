"""Markov-head figures: flip rates, bias distributions, the base-argmax counterfactual.

Numbers come from :func:`dsparklab.analysis.compute_markov_attribution` and
:func:`dsparklab.analysis.compute_markov_bias_distribution`.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsparklab.plots._common import (
    each_line,
    empty_figure,
    finish,
    label,
    levels,
    method_window_lines,
    panel_row,
    require,
    select,
)
from dsparklab.plots.style import ACCEPT_COLORS, method_shade

_EMPTY = "no Markov head in this selection (DSpark runs only)"


def plot_flip_rates(
    attribution: pd.DataFrame,
    *,
    ns: Sequence[int] | None = None,
    datasets: Sequence[str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """How often the Markov bias changed the argmax, and acceptance with and without a flip.

    Parameters
    ----------
    attribution
        From ``compute_markov_attribution(..., by=("method", "n"), per_position=True)``.
    ns, datasets
        Keep only these windows / datasets.
    title
        Figure title.
    """
    require(
        attribution,
        ["position", "flip_rate", "accept_rate_flip", "accept_rate_noflip"],
        what="plot_flip_rates",
    )
    data = select(attribution, n=ns, dataset=datasets)
    title = title or "Markov head: flip rate and acceptance with / without a flip"
    if data.empty:
        return empty_figure(_EMPTY, title=title, name="flip_rates")
    fig = panel_row(
        [
            "flip rate (the bias changed the argmax)",
            "accepted | reached: flipped (solid), not (dotted)",
        ]
    )
    for line, color, name in method_window_lines(data, sort_by="position", default_method="dspark"):
        fig.add_trace(
            go.Scatter(
                x=line["position"],
                y=line["flip_rate"],
                mode="lines+markers",
                name=name,
                legendgroup=name,
                line=dict(color=color),
            ),
            row=1,
            col=1,
        )
        for column, suffix, mode, line_style in (
            ("accept_rate_flip", "flipped", "lines+markers", dict(color=color)),
            ("accept_rate_noflip", "not flipped", "lines", dict(color=color, dash="dot")),
        ):
            fig.add_trace(
                go.Scatter(
                    x=line["position"],
                    y=line[column],
                    mode=mode,
                    name=f"{name} {suffix}",
                    legendgroup=name,
                    showlegend=False,
                    line=line_style,
                ),
                row=1,
                col=2,
            )
    fig.update_xaxes(title_text="draft position", dtick=1)
    fig.update_yaxes(rangemode="tozero", col=1)
    fig.update_yaxes(range=[0, 1.02], col=2)
    return finish(fig, title=title, name="flip_rates")


def plot_bias_distribution(
    distribution: pd.DataFrame,
    *,
    facet: str | None = "n",
    title: str | None = None,
) -> go.Figure:
    """Histogram (density) of the Markov bias at the drafted token, accepted vs rejected.

    Parameters
    ----------
    distribution
        From ``compute_markov_bias_distribution(...)``.
    facet
        Column with one panel per value (e.g. ``"n"`` or ``"dataset"``).
    title
        Figure title.
    """
    require(
        distribution, ["accepted", "bin_lo", "bin_hi", "density"], what="plot_bias_distribution"
    )
    title = title or "Markov bias at the drafted token: accepted vs rejected"
    if distribution.empty:
        return empty_figure(_EMPTY, title=title, name="bias_distribution")
    panels = levels(distribution, facet)
    cols = min(len(panels), 4)
    rows = -(-len(panels) // cols)
    titles = [label({facet or "": v}) for v in panels] if panels != [None] else None
    grid = make_subplots(rows=rows, cols=cols, subplot_titles=titles, shared_xaxes=True)
    for i, value in enumerate(panels):
        r, c = divmod(i, cols)
        panel = distribution if value is None else distribution.loc[distribution[facet] == value]
        for accepted, state in ((True, "accepted"), (False, "rejected")):
            part = panel.loc[panel["accepted"] == accepted].sort_values("bin_lo")
            if part.empty:
                continue
            grid.add_trace(
                go.Bar(
                    x=(part["bin_lo"] + part["bin_hi"]) / 2,
                    y=part["density"],
                    width=(part["bin_hi"] - part["bin_lo"]).tolist(),
                    marker=dict(color=ACCEPT_COLORS[state]),
                    opacity=0.6,
                    name=state,
                    legendgroup=state,
                    showlegend=i == 0,
                ),
                row=r + 1,
                col=c + 1,
            )
    grid.update_layout(barmode="overlay", bargap=0)
    grid.update_xaxes(title_text="bias at the drafted token (logit units)", row=rows)
    grid.update_yaxes(title_text="density", col=1)
    return finish(grid, title=title, n_rows=rows, name="bias_distribution")


def plot_markov_counterfactual(
    attribution: pd.DataFrame,
    *,
    n: int | None = None,
    dataset: str | None = None,
    title: str | None = None,
) -> go.Figure:
    """Acceptance with the bias vs bounds on acceptance of the base argmax, by position.

    Parameters
    ----------
    attribution
        From ``compute_markov_attribution(..., per_position=True)``; the bounds are
        ``base_accept_rate_lo`` / ``_hi`` (flipped-and-rejected rows are undetermined).
    n, dataset
        One window / dataset (``None``: every row, one line per group).
    title
        Figure title.
    """
    require(
        attribution,
        ["position", "accept_rate", "base_accept_rate_lo", "base_accept_rate_hi"],
        what="plot_markov_counterfactual",
    )
    data = select(attribution, n=n, dataset=dataset)
    title = title or "Counterfactual: acceptance with the Markov bias vs the base argmax"
    if data.empty:
        return empty_figure(_EMPTY, title=title, name="markov_counterfactual")
    fig = go.Figure()
    windows = levels(data, "n")
    for (method, window), line in each_line(data, ("method", "n"), sort_by="position"):
        k = windows.index(window)
        color = method_shade(method or "dspark", k, len(windows))
        name = label({"method": method, "n": window})
        offset = (k - (len(windows) - 1) / 2) * 0.08
        x = line["position"] + offset
        fig.add_trace(
            go.Scatter(
                x=x,
                y=line["accept_rate"],
                mode="markers",
                marker=dict(color=color, size=10, symbol="circle"),
                name=f"{name}: with bias",
                legendgroup=name,
            )
        )
        # the bounds alone, one vertical segment per position (no point estimate exists)
        segments = [
            (v, lo, hi)
            for v, lo, hi in zip(
                x, line["base_accept_rate_lo"], line["base_accept_rate_hi"], strict=True
            )
        ]
        fig.add_trace(
            go.Scatter(
                x=[v for at, _, _ in segments for v in (at, at, None)],
                y=[v for _, lo, hi in segments for v in (lo, hi, None)],
                mode="lines+markers",
                line=dict(color=color, width=3),
                marker=dict(color=color, size=9, symbol="line-ew"),
                name=f"{name}: base argmax (bounds)",
                legendgroup=name,
            )
        )
    fig.update_xaxes(title_text="draft position", dtick=1)
    fig.update_yaxes(title_text="acceptance rate given reached", range=[0, 1.02])
    return finish(fig, title=title, name="markov_counterfactual")
