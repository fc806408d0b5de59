"""Confidence-head figures: reliability diagrams, calibration metrics, adaptive what-if.

Numbers come from :func:`dsparklab.analysis.compute_reliability`,
:func:`dsparklab.analysis.compute_calibration` and
:func:`dsparklab.analysis.compute_adaptive_verification`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from dsparklab.plots._common import (
    choose,
    each_line,
    empty_figure,
    error_bars,
    facet_grid,
    finish,
    label,
    levels,
    method_window_lines,
    panel_row,
    require,
    select,
)
from dsparklab.plots.style import method_shade, position_color

# score -> what it is judged against
SCORE_LABELS: dict[str, str] = {
    "confidence": "confidence c_i vs accepted | reached",
    "prefix_confidence": "prefix confidence ∏ c_j vs accepted (survival)",
}
TOKEN_LEVEL = "token-level"  # the source of bins counted from the runs' own rows
# metric -> axis label
CALIBRATION_METRICS: dict[str, str] = {
    "ece": "ECE (lower is better)",
    "brier": "Brier (lower is better)",
    "auroc": "AUROC (higher is better)",
    "temperature": "fitted temperature (1 = calibrated)",
}


def plot_reliability(
    reliability: pd.DataFrame,
    *,
    score: str = "confidence",
    facet: str | None = "dataset",
    methods: Sequence[str] | None = None,
    positions: Sequence[int] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Reliability diagram: acceptance rate against mean score per bin, one line per position.

    Parameters
    ----------
    reliability
        From ``compute_reliability(..., per_position=True)``, or the bins a source
        reported, ``compute_reported_reliability(calibration)`` (rows with a ``source``;
        both tables may be concatenated).
    score
        ``"confidence"`` or ``"prefix_confidence"``.
    facet
        Column whose values get one panel each (e.g. ``"dataset"``); absent: one panel.
    methods, positions
        Keep only these.
    title
        Figure title.

    Notes
    -----
    Points below the diagonal are bins where the head is over-confident; marker area is
    proportional to the rows (a reported bin: its weight) in the bin. Each point sits at its
    bin's mean score; a reported bin is drawn dotted, labelled with its source, and a
    horizontal bar spans its edges ``[bin_lo, bin_hi]`` as the source wrote them.
    """
    score_label = choose("score", score, SCORE_LABELS)
    require(reliability, ["score", "mean_score", "accept_rate", "count"], what="plot_reliability")
    data = select(reliability, score=score, method=methods, position=positions)
    title = title or f"Reliability per draft position — {score_label}"
    if data.empty:
        return empty_figure(
            "no confidence recorded in this selection (DSpark runs only)",
            title=title,
            name="reliability",
        )
    panels = levels(data, facet)
    fig = facet_grid([None], panels, row_name=None, col_name=facet)
    all_positions = levels(data, "position")
    k = len(all_positions)
    size_ref = float(np.sqrt(data["count"].max()))
    if "source" in data:
        sources = data["source"].fillna(TOKEN_LEVEL)
    else:
        sources = pd.Series(TOKEN_LEVEL, index=data.index)
    for c, value in enumerate(panels, start=1):
        panel = data if value is None else data.loc[data[facet] == value]
        fig.add_trace(
            go.Scatter(
                x=[0, 1],
                y=[0, 1],
                mode="lines",
                line=dict(color="#adb5bd", dash="dash"),
                name="perfect calibration",
                showlegend=c == 1,
                hoverinfo="skip",
            ),
            row=1,
            col=c,
        )
        for (position, source), line in each_line(
            panel.assign(source=sources.loc[panel.index]),
            ("position", "source"),
            sort_by="mean_score",
        ):
            color = position_color(all_positions.index(position), k)
            fig.add_trace(_reliability_line(line, position, source, color, size_ref, c == 1), 1, c)
    fig.update_xaxes(title_text="mean score in bin")
    fig.update_xaxes(range=[-0.03, 1.03])
    fig.update_yaxes(title_text="acceptance rate in bin", range=[-0.03, 1.05], col=1)
    return finish(fig, title=title, name="reliability")


def _reliability_line(
    line: pd.DataFrame, position: Any, source: str, color: str, size_ref: float, legend: bool
) -> go.Scatter:
    """One position's bins (of one source) as a line of markers at their mean score."""
    reported = source != TOKEN_LEVEL
    name = f"position {position}" + (f" · {source}" if reported else "")
    edges = ["bin", "bin_lo", "bin_hi"] if {"bin_lo", "bin_hi"} <= set(line.columns) else []
    customdata = line[["count", *edges]].to_numpy()
    where = (
        "<br>bin %{customdata[1]:d} [%{customdata[2]:.3f}, %{customdata[3]:.3f}]" if edges else ""
    )
    weight = "weight" if reported else "rows"
    return go.Scatter(
        x=line["mean_score"],
        y=line["accept_rate"],
        mode="lines+markers",
        name=name,
        legendgroup=f"p{position}-{source}",
        showlegend=legend,
        line=dict(color=color, dash="dot" if reported else "solid"),
        marker=dict(
            size=4 + 14 * np.sqrt(line["count"].to_numpy(dtype=float)) / size_ref,
            color=color,
            symbol="diamond" if reported else "circle",
        ),
        error_x=(
            error_bars(line["mean_score"], line["bin_lo"], line["bin_hi"], color=color, width=0)
            if reported and edges
            else None
        ),
        customdata=customdata,
        hovertemplate=f"{name}{where}<br>mean score=%{{x:.3f}}<br>"
        f"accept rate=%{{y:.3f}}<br>{weight}=%{{customdata[0]}}<extra></extra>",
    )


def plot_calibration_metrics(
    calibration: pd.DataFrame,
    *,
    metrics: Sequence[str] = ("ece", "brier", "auroc"),
    methods: Sequence[str] | None = None,
    datasets: Sequence[str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """ECE, Brier and AUROC by draft position, for each score (one panel per metric).

    Parameters
    ----------
    calibration
        From ``compute_calibration(..., per_position=True)``.
    metrics
        Any of ``"ece"``, ``"brier"``, ``"auroc"``, ``"temperature"``.
    methods, datasets
        Keep only these; several datasets are drawn with different markers.
    title
        Figure title.
    """
    for metric in metrics:
        choose("calibration metric", metric, CALIBRATION_METRICS)
    require(calibration, ["score", "position", *metrics], what="plot_calibration_metrics")
    data = select(calibration, method=methods, dataset=datasets)
    title = title or "Calibration of the confidence head by draft position"
    if data.empty:
        return empty_figure(
            "no confidence recorded in this selection", title=title, name="calibration_metrics"
        )
    fig = panel_row([CALIBRATION_METRICS[m] for m in metrics])
    scores = levels(data, "score")
    all_datasets = levels(data, "dataset")
    symbols = ("circle", "square", "diamond", "triangle-up", "x", "star")
    for c, metric in enumerate(metrics, start=1):
        for (score, dataset, method), line in each_line(
            data, ("score", "dataset", "method"), sort_by="position"
        ):
            s, d = scores.index(score), all_datasets.index(dataset)
            name = label({"score": score, "method": method, "dataset": dataset})
            fig.add_trace(
                go.Scatter(
                    x=line["position"],
                    y=line[metric],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=c == 1,
                    line=dict(
                        color=method_shade(method or "dspark", s, len(scores) + 1),
                        dash="solid" if s == 0 else "dash",
                    ),
                    marker=dict(symbol=symbols[d % len(symbols)], size=7),
                ),
                row=1,
                col=c,
            )
    fig.update_xaxes(title_text="draft position", dtick=1)
    return finish(fig, title=title, name="calibration_metrics")


def plot_adaptive_whatif(
    adaptive: pd.DataFrame,
    *,
    methods: Sequence[str] | None = None,
    datasets: Sequence[str] | None = None,
    ns: Sequence[int] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Adaptive verification what-if: tokens per step against positions verified per step.

    Each curve sweeps the threshold τ on the prefix confidence (τ = 0 verifies every
    drafted position, the star); the right panel shows emitted tokens per verified slot.

    Parameters
    ----------
    adaptive
        From ``compute_adaptive_verification(..., by=("method", "n"))`` (or with dataset).
    methods, datasets, ns
        Keep only these.
    title
        Figure title.
    """
    require(
        adaptive,
        ["tau", "tokens_per_step", "verified_per_step", "tokens_per_verified"],
        what="plot_adaptive_whatif",
    )
    data = select(adaptive, method=methods, dataset=datasets, n=ns)
    title = title or "Adaptive verification what-if (replay of the recorded steps)"
    if data.empty:
        return empty_figure(
            "no confidence recorded in this selection", title=title, name="adaptive_whatif"
        )
    fig = panel_row(
        [
            "tokens per step vs verified positions per step",
            "tokens per verified slot vs τ",
        ]
    )
    for line, color, name in method_window_lines(data, sort_by="tau", default_method=""):
        hover = [f"τ={t:.2f}" for t in line["tau"]]
        fig.add_trace(
            go.Scatter(
                x=line["verified_per_step"],
                y=line["tokens_per_step"],
                mode="lines+markers",
                name=name,
                legendgroup=name,
                line=dict(color=color),
                marker=dict(size=5),
                text=hover,
                hovertemplate="%{text}<br>verified/step=%{x:.2f}<br>"
                "tokens/step=%{y:.2f}<extra>" + name + "</extra>",
            ),
            row=1,
            col=1,
        )
        if "tokens_per_step_full" in line:
            fig.add_trace(
                go.Scatter(
                    x=line["verified_per_step_full"].iloc[:1],
                    y=line["tokens_per_step_full"].iloc[:1],
                    mode="markers",
                    marker=dict(
                        symbol="star",
                        size=13,
                        color=color,
                        line=dict(color="#212529", width=1),
                    ),
                    name=f"{name}: verify all",
                    legendgroup=name,
                    showlegend=False,
                ),
                row=1,
                col=1,
            )
        fig.add_trace(
            go.Scatter(
                x=line["tau"],
                y=line["tokens_per_verified"],
                mode="lines",
                name=name,
                legendgroup=name,
                showlegend=False,
                line=dict(color=color),
            ),
            row=1,
            col=2,
        )
    fig.update_xaxes(title_text="verified positions per step", row=1, col=1)
    fig.update_yaxes(title_text="tokens per step", row=1, col=1)
    fig.update_xaxes(title_text="threshold τ on ∏ c_j", range=[0, 1], row=1, col=2)
    fig.update_yaxes(title_text="tokens per (verified + 1)", row=1, col=2)
    return finish(fig, title=title, name="adaptive_whatif")
