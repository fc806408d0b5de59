"""Regression-diagnosis figures: per-prompt, per-position and per-token-class deltas.

Numbers come from :func:`dsparklab.analysis.compute_regression_diff` (levels
``"prompt"`` and ``"position"``) and :func:`dsparklab.analysis.compute_token_class_diff`;
deltas are new - base, coloured on the diverging scale centred on 0 (red = worse).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from dsparklab.plots._common import (
    choose,
    empty_figure,
    finish,
    interval_bars,
    label,
    levels,
    panel_row,
    require,
    select,
)
from dsparklab.plots.acceptance import ACCEPTANCE_SHORT, ACCEPTANCE_VALUES
from dsparklab.plots.style import DIVERGING_SCALE, dash_for, method_color
from dsparklab.plots.window import WINDOW_SHORT

DELTA_COLUMNS = ("metric", "base", "new", "delta", "delta_lo", "delta_hi")


def _delta_marker(delta: pd.Series) -> dict:
    bound = float(max(delta.abs().max(), 1e-9)) if delta.notna().any() else 1.0
    return dict(
        color=delta.fillna(0.0).to_numpy(dtype=float),
        colorscale=DIVERGING_SCALE,
        cmin=-bound,
        cmax=bound,
        cmid=0.0,
        line=dict(color="#495057", width=0.5),
    )


def _ci(frame: pd.DataFrame) -> dict | None:
    return interval_bars(frame, "delta", color="#495057", thickness=1, width=3)


def _sides_hover(frame: pd.DataFrame, head: str, labels: tuple[str, str]) -> dict:
    """``customdata`` and ``hovertemplate`` showing both run sets' values after ``head``."""
    return dict(
        customdata=frame[["base", "new"]].to_numpy(),
        hovertemplate=f"{head}<br>{labels[0]}=%{{customdata[0]:.3f}} · "
        f"{labels[1]}=%{{customdata[1]:.3f}}<extra></extra>",
    )


def plot_prompt_deltas(
    prompt_diff: pd.DataFrame,
    *,
    metric: str = "accept_len",
    highlight: Sequence[str] | None = None,
    labels: tuple[str, str] = ("base", "new"),
    title: str | None = None,
) -> go.Figure:
    """Per-prompt delta of acceptance length, sorted, with bootstrap intervals.

    Parameters
    ----------
    prompt_diff
        ``compute_regression_diff(..., level="prompt")``.
    metric
        The diff's metric to draw (``"accept_len"``).
    highlight
        Prompt ids to outline (e.g. the worst prompts).
    labels
        Names of the two run sets, for the title.
    title
        Figure title.
    """
    require(prompt_diff, ["prompt_id", *DELTA_COLUMNS], what="plot_prompt_deltas")
    data = prompt_diff.loc[prompt_diff["metric"] == metric].sort_values("delta", kind="stable")
    title = title or f"Per-prompt change in {metric}: {labels[1]} − {labels[0]}"
    if data.empty:
        return empty_figure("no prompt in both run sets", title=title, name="prompt_deltas")
    keys = data["prompt_id"].astype(str)
    if "dataset" in data and data["dataset"].nunique() > 1:
        keys = data["dataset"].astype(str) + " · " + keys
    marked = set(highlight or ())
    outline = ["#212529" if p in marked else "rgba(0,0,0,0)" for p in data["prompt_id"]]
    marker = _delta_marker(data["delta"])
    marker["line"] = dict(color=outline, width=2.5)
    fig = go.Figure(
        go.Bar(
            x=keys.tolist(),
            y=data["delta"],
            marker=marker,
            error_y=_ci(data),
            **_sides_hover(data, "%{x}<br>Δ=%{y:.3f}", labels),
            name="Δ " + metric,
        )
    )
    fig.add_hline(y=0, line=dict(color="#495057", width=1))
    fig.update_xaxes(
        title_text="prompt (sorted by Δ)", showticklabels=len(keys) <= 40, tickangle=-60
    )
    short = {**ACCEPTANCE_SHORT, **WINDOW_SHORT}.get(metric, metric)
    fig.update_yaxes(title_text=f"Δ {short}")
    return finish(fig, title=title, name="prompt_deltas")


def plot_position_deltas(
    position_diff: pd.DataFrame,
    *,
    metric: str = "accept_rate",
    datasets: Sequence[str] | None = None,
    labels: tuple[str, str] = ("base", "new"),
    title: str | None = None,
) -> go.Figure:
    """Per-position values of both run sets (left) and their delta with intervals (right).

    Parameters
    ----------
    position_diff
        ``compute_regression_diff(..., level="position")``.
    metric
        ``"accept_rate"`` or ``"survival"``.
    datasets
        Keep only these.
    labels
        Names of the two run sets (legend and title).
    title
        Figure title.
    """
    metric_label = choose("position metric", metric, ACCEPTANCE_VALUES)
    require(position_diff, ["position", *DELTA_COLUMNS], what="plot_position_deltas")
    data = select(position_diff.loc[position_diff["metric"] == metric], dataset=datasets)
    title = title or f"Per-position {ACCEPTANCE_SHORT[metric]}: {labels[1]} vs {labels[0]}"
    if data.empty:
        return empty_figure("no positions in both run sets", title=title, name="position_deltas")
    fig = panel_row([metric_label, f"Δ = {labels[1]} − {labels[0]}"])
    all_datasets = levels(data, "dataset")
    side_colors = {labels[0]: method_color(labels[0]), labels[1]: method_color(labels[1])}
    if side_colors[labels[0]] == side_colors[labels[1]]:
        side_colors[labels[1]] = method_color(f"{labels[1]}:new")
    for dataset in all_datasets:
        part = select(data, dataset=dataset).sort_values("position")
        dash = dash_for(dataset, all_datasets)
        for side, column in ((labels[0], "base"), (labels[1], "new")):
            name = label({"side": side, "dataset": dataset if len(all_datasets) > 1 else None})
            fig.add_trace(
                go.Scatter(
                    x=part["position"],
                    y=part[column],
                    mode="lines+markers",
                    name=name,
                    line=dict(color=side_colors[side], dash=dash),
                ),
                row=1,
                col=1,
            )
        fig.add_trace(
            go.Bar(
                x=part["position"],
                y=part["delta"],
                marker=_delta_marker(part["delta"]),
                error_y=_ci(part),
                name=label({"Δ": "Δ", "dataset": dataset}),
                showlegend=False,
                hovertemplate="position %{x}<br>Δ=%{y:.3f}<extra>" + str(dataset) + "</extra>",
            ),
            row=1,
            col=2,
        )
    fig.add_hline(y=0, line=dict(color="#495057", width=1), row=1, col=2)
    fig.update_xaxes(title_text="draft position", dtick=1)
    fig.update_yaxes(range=[0, 1.02], row=1, col=1)
    return finish(fig, title=title, name="position_deltas")


def plot_token_class_deltas(
    class_diff: pd.DataFrame,
    *,
    datasets: Sequence[str] | None = None,
    labels: tuple[str, str] = ("base", "new"),
    title: str | None = None,
) -> go.Figure:
    """Delta of acceptance given reached per token class (horizontal bars, intervals).

    Parameters
    ----------
    class_diff
        ``compute_token_class_diff(...)``.
    datasets
        Keep only these (one panel each).
    labels
        Names of the two run sets.
    title
        Figure title.
    """
    require(class_diff, ["token_class", *DELTA_COLUMNS], what="plot_token_class_deltas")
    data = select(class_diff, dataset=datasets)
    title = title or f"Acceptance by token class: {labels[1]} − {labels[0]}"
    if data.empty:
        return empty_figure(
            "no reached tokens in both run sets", title=title, name="token_class_deltas"
        )
    panels = levels(data, "dataset")
    fig = panel_row([str(p) for p in panels], show_titles=panels != [None], shared_y=True)
    for c, dataset in enumerate(panels, start=1):
        part = select(data, dataset=dataset).sort_values("token_class")
        fig.add_trace(
            go.Bar(
                y=part["token_class"],
                x=part["delta"],
                orientation="h",
                marker=_delta_marker(part["delta"]),
                error_x=_ci(part),
                **_sides_hover(part, "%{y}<br>Δ=%{x:.3f}", labels),
                showlegend=False,
            ),
            row=1,
            col=c,
        )
        fig.add_vline(x=0, line=dict(color="#495057", width=1), row=1, col=c)
    fig.update_xaxes(title_text="Δ acceptance given reached")
    return finish(fig, title=title, name="token_class_deltas")
