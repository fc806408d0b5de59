"""Which window pays: projected speedups, the verify costs they assume beside published
ones, one run's prediction of every smaller window, and each added position's tokens
against its break-even.

Numbers come from :mod:`dsparklab.analysis.projection`. A projected curve is always drawn
dashed and named "projected on <profile>", never as a measurement; a published number is
always named "published".
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go

from dsparklab.plots._common import (
    each_line,
    empty_figure,
    error_bars,
    finish,
    label,
    levels,
    panel_row,
    require,
)
from dsparklab.plots.style import method_color


def _panels(data: pd.DataFrame) -> tuple[go.Figure, list]:
    panels = levels(data, "dataset")
    return panel_row([str(p) for p in panels], show_titles=len(panels) > 1, shared_y=True), panels


def _speedup_line(
    fig: go.Figure,
    panels: list,
    key: tuple,
    rows: pd.DataFrame,
    column: str,
    what: str,
    hover: str = "",
    **style: object,
) -> None:
    """One method's ``column`` against n in its dataset's panel, named "<method> (<what>)"
    (the legend once, from the first panel); ``hover`` adds to its hover text."""
    dataset, method = key
    name = f"{method} ({what})"
    fig.add_trace(
        go.Scatter(
            x=rows["n"],
            y=rows[column],
            mode="lines+markers",
            name=name,
            legendgroup=name,
            showlegend=panels.index(dataset) == 0,
            hovertemplate=f"{label({'method': method, 'dataset': dataset})}<br>"
            f"n=%{{x}}<br>{what}: %{{y:.3f}}x{hover}<extra></extra>",
            **style,
        ),
        row=1,
        col=panels.index(dataset) + 1,
    )


def plot_projected_speedup(
    projected: pd.DataFrame, *, measured: pd.DataFrame | None = None, title: str | None = None
) -> go.Figure:
    """Speedup against n per dataset and method under each cost profile (dashed), beside
    the measured speedup (solid) when given.

    Parameters
    ----------
    projected
        ``compute_projected_speedup(...)`` (``profile``, ``label``, ``speedup``).
    measured
        ``compute_window_scaling(...)`` of the same runs, drawn as measured.
    title
        Figure title.
    """
    require(
        projected, ["dataset", "method", "n", "profile", "speedup"], what="plot_projected_speedup"
    )
    title = title or "Speedup projected on cost profiles (dashed) beside the measurement"
    if projected.empty:
        return empty_figure("no window to project", title=title, name="projected_speedup")
    fig, panels = _panels(projected)
    for (dataset, method, profile), line in each_line(
        projected, ("dataset", "method", "profile"), sort_by="n"
    ):
        color = method_color(method or "")
        _speedup_line(
            fig, panels, (dataset, method), line, "speedup", f"projected on {profile}",
            line=dict(color=color, dash="dash"), marker=dict(symbol="diamond-open"),
        )  # fmt: skip
    for (dataset, method), line in each_line(
        measured if measured is not None else projected.iloc[:0], ("dataset", "method"), sort_by="n"
    ):
        if dataset in panels:
            bars = error_bars(line["speedup"], line["speedup_lo"], line["speedup_hi"])
            _speedup_line(
                fig, panels, (dataset, method), line, "speedup", "measured",
                line=dict(color=method_color(method or "")), error_y=bars,
            )  # fmt: skip
    fig.add_hline(y=1.0, line=dict(color="#868e96", width=1, dash="dot"))
    fig.update_xaxes(title_text="window n", dtick=1)
    fig.update_yaxes(title_text="speedup", row=1, col=1)
    return finish(fig, title=title, name="projected_speedup")


def plot_window_prediction(prediction: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Measured speedup at each smaller window (solid) against its prediction from the
    largest-window run (dashed); the hover gives the drafts' prefix agreement.

    Parameters
    ----------
    prediction
        ``compute_window_prediction(...)``.
    title
        Figure title.
    """
    require(
        prediction,
        ["dataset", "method", "n", "predicted", "measured", "prefix_agreement", "source_n"],
        what="plot_window_prediction",
    )
    title = title or "Every smaller window predicted from the largest one (dashed) vs measured"
    if prediction.empty:
        return empty_figure(
            "no run below the largest window", title=title, name="window_prediction"
        )
    fig, panels = _panels(prediction)
    for (dataset, method), line in each_line(prediction, ("dataset", "method"), sort_by="n"):
        color = method_color(method or "")
        agreement = line[["prefix_agreement", "source_n"]].to_numpy()
        for column, dash in (("measured", None), ("predicted", "dash")):
            _speedup_line(
                fig, panels, (dataset, method), line, column, column,
                "<br>prefix agreement with n=%{customdata[1]}: %{customdata[0]:.0%}",
                line=dict(color=color, dash=dash), customdata=agreement,
            )  # fmt: skip
    fig.update_xaxes(title_text="window n", dtick=1)
    fig.update_yaxes(title_text="speedup", row=1, col=1)
    return finish(fig, title=title, name="window_prediction")


def plot_position_payoff(payoff: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """Per dataset: each added position's extra tokens per step (bars, with intervals)
    against the survival it needs to pay for its cost (markers).

    Parameters
    ----------
    payoff
        ``compute_position_payoff(...)`` for one profile.
    title
        Figure title.
    """
    require(
        payoff,
        ["dataset", "method", "position", "marginal_tokens", "break_even", "pays"],
        what="plot_position_payoff",
    )
    title = title or "Does one more drafted position pay? extra tokens per step vs break-even"
    if payoff.empty:
        return empty_figure("no window to extend", title=title, name="position_payoff")
    fig, panels = _panels(payoff)
    for (dataset, method), rows in each_line(payoff, ("dataset", "method"), sort_by="position"):
        col = panels.index(dataset) + 1
        color = method_color(method or "")
        ticks = [f"{a}→{b}" for a, b in zip(rows["n_from"], rows["n_to"], strict=True)]
        fig.add_trace(
            go.Bar(
                x=ticks,
                y=rows["marginal_tokens"],
                name=f"{method}: extra tokens s_m",
                legendgroup=f"{method} tokens",
                showlegend=col == 1,
                marker=dict(color=color),
                error_y=error_bars(
                    rows["marginal_tokens"], rows["marginal_tokens_lo"], rows["marginal_tokens_hi"]
                ),
                customdata=rows[["pays", "marginal_cost"]].to_numpy(),
                hovertemplate=f"{method} n=%{{x}}<br>s_m=%{{y:.3f}}<br>cost +%{{customdata[1]:.3f}}"
                " decode steps<br>pays: %{customdata[0]}<extra></extra>",
            ),
            row=1,
            col=col,
        )
        fig.add_trace(
            go.Scatter(
                x=ticks,
                y=rows["break_even"],
                mode="markers",
                name=f"{method}: break-even s*",
                legendgroup=f"{method} break-even",
                showlegend=col == 1,
                marker=dict(color=color, symbol="line-ew-open", size=18, line=dict(width=3)),
                hovertemplate=f"{method} n=%{{x}}<br>break-even s*=%{{y:.3f}}<extra></extra>",
            ),
            row=1,
            col=col,
        )
    fig.update_layout(barmode="group")
    fig.update_xaxes(title_text="window n → n + 1")
    fig.update_yaxes(title_text="tokens per step", row=1, col=1)
    return finish(fig, title=title, name="position_payoff")


def plot_verify_costs(
    costs: pd.DataFrame, published: pd.DataFrame | None = None, *, title: str | None = None
) -> go.Figure:
    """What verifying w tokens costs, in decode steps: each cost table's profile (dashed)
    beside the published numbers (markers, one series per setup, named "published").

    Parameters
    ----------
    costs
        A cost table (``profile``, ``n``, ``verify_cost``: the verify of w = n + 1 tokens;
        ``cost_source``, where given, goes in the hover), e.g. ``nb.cost_table(COST_PROFILE,
        runs)`` or ``fitted_cost_table(...)``.
    published
        ``nb.load_published_verify_costs()``; rows without ``verify_tokens`` (the source
        did not state k) are not drawn. The hover gives each number's hardware, engine and
        how it was obtained.
    title
        Figure title.
    """
    require(costs, ["profile", "n", "verify_cost"], what="plot_verify_costs")
    title = title or "Verify cost against one decode step: the profile beside published numbers"
    fig = go.Figure()
    lines = each_line(costs.drop_duplicates(["profile", "n"]), ("profile",), sort_by="n")
    for (profile,), line in lines:
        # where the table says where each number came from (a published profile), so does
        # the hover
        sourced = "cost_source" in line
        fig.add_trace(
            go.Scatter(
                x=line["n"] + 1,
                y=line["verify_cost"],
                mode="lines+markers",
                name=f"{profile} (profile)",
                line=dict(color="#495057", dash="dash"),
                customdata=line[["cost_source"]].to_numpy() if sourced else None,
                hovertemplate=f"{profile}<br>w=%{{x}} tokens<br>%{{y:.3f}} decode steps"
                + ("<br>%{customdata[0]}" if sourced else "")
                + "<extra></extra>",
            )
        )
    placed = published[published["verify_tokens"].notna()] if published is not None else None
    if placed is not None and len(placed):
        for (setup,), rows in each_line(placed, ("setup",), sort_by="verify_tokens"):
            fig.add_trace(
                go.Scatter(
                    x=rows["verify_tokens"].astype(float),
                    y=rows["cost_vs_decode"],
                    mode="lines+markers",
                    name=f"{setup} (published)",
                    customdata=rows[["hardware", "engine", "how_obtained"]].to_numpy(),
                    hovertemplate=f"{setup} (published)<br>k=%{{x}} tokens<br>"
                    "%{y:.3f} decode steps<br>%{customdata[0]}, %{customdata[1]}<br>"
                    "%{customdata[2]}<extra></extra>",
                )
            )
    fig.add_hline(y=1.0, line=dict(color="#868e96", width=1, dash="dot"))
    fig.update_xaxes(title_text="tokens verified in one target pass", type="log", dtick=0.30103)
    fig.update_yaxes(title_text="cost in decode steps")
    return finish(fig, title=title, name="verify_costs")
