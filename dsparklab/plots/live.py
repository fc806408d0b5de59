"""Figures for imported and live runs: acceptance over time, AL over time, coverage."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsparklab.plots._common import (
    cell_grid,
    choose,
    empty_figure,
    finish,
    levels,
    panel_column,
    require,
    select,
)
from dsparklab.plots.acceptance import ACCEPTANCE_VALUES
from dsparklab.plots.style import SEQUENTIAL_SCALE, method_color

_NO_LIVE_RUN = "no live run here: `dsparklab watch --metrics-url URL` records one"


def _run_label(frame: pd.DataFrame, run_id: object) -> str:
    rows = frame[frame["run_id"] == run_id] if "run_id" in frame else frame
    parts = [str(rows[c].iloc[0]) for c in ("method", "dataset") if c in rows and len(rows)]
    if "n" in rows and len(rows):
        parts.insert(1, f"n={rows['n'].iloc[0]}")
    return " · ".join(parts) or str(run_id)


def plot_acceptance_over_time(
    over_time: pd.DataFrame,
    *,
    value: str = "survival",
    run_ids: list[str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Heatmap of acceptance by draft position (y) and scrape interval (x), one panel per run.

    Parameters
    ----------
    over_time
        From ``compute_acceptance_over_time(counters, totals, by=("run_id",))`` (add
        ``method``/``n``/``dataset`` columns for panel titles).
    value
        ``"survival"`` (:math:`s_i`) or ``"accept_rate"`` (:math:`a_i`).
    run_ids
        Keep only these runs.
    """
    axis_label = choose("acceptance value", value, ACCEPTANCE_VALUES)
    title = title or f"Acceptance by position over time — {axis_label}"
    require(over_time, ["interval", "position", "t_mid_s", value], what="plot_acceptance_over_time")
    data = select(over_time, run_id=run_ids)
    if data.empty:
        return empty_figure(_NO_LIVE_RUN, title=title, name="acceptance_over_time")
    runs = levels(data, "run_id")
    fig = panel_column([_run_label(data, r) for r in runs], show_titles=runs != [None])
    for r, run in enumerate(runs, start=1):
        panel = select(data, run_id=run)
        known = panel[panel[value].notna()]
        positions = sorted(known["position"].unique())
        times = sorted(known["t_mid_s"].unique())
        z = cell_grid(
            known,
            known[value],
            rows="position",
            row_levels=positions,
            cols="t_mid_s",
            col_levels=times,
        )
        fig.add_trace(
            go.Heatmap(
                z=z,
                x=[float(t) for t in times],
                y=[int(p) for p in positions],
                coloraxis="coloraxis",
                hovertemplate="t=%{x:.1f} s position=%{y}<br>" + value + "=%{z:.3f}<extra></extra>",
                name=_run_label(data, run) if run is not None else value,
            ),
            row=r,
            col=1,
        )
        fig.update_yaxes(title_text="draft position", dtick=1, row=r, col=1)
    fig.update_xaxes(title_text="seconds since the watch began", row=len(runs), col=1)
    fig.update_layout(
        coloraxis=dict(colorscale=SEQUENTIAL_SCALE, cmin=0.0, cmax=1.0, colorbar=dict(title=value))
    )
    return finish(fig, title=title, n_rows=len(runs), name="acceptance_over_time")


def plot_accept_len_over_time(
    over_time: pd.DataFrame, *, run_ids: list[str] | None = None, title: str | None = None
) -> go.Figure:
    """Each interval's acceptance length (line) and its drafts (bars), per live run.

    ``over_time`` is ``compute_acceptance_over_time(...)``; an idle interval (no drafts)
    has no AL and leaves a gap.
    """
    title = title or "Acceptance length per scrape interval (per step, bonus included)"
    require(
        over_time,
        ["interval", "t_mid_s", "accept_len", "num_drafts"],
        what="plot_accept_len_over_time",
    )
    data = select(over_time, run_id=run_ids)
    if data.empty:
        return empty_figure(_NO_LIVE_RUN, title=title, name="accept_len_over_time")
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    runs = levels(data, "run_id")
    for run in runs:
        rows = select(data, run_id=run).drop_duplicates("interval")
        rows = rows.sort_values("t_mid_s")
        method = str(rows["method"].iloc[0]) if "method" in rows else ""
        name = _run_label(data, run) if run is not None else "AL"
        fig.add_trace(
            go.Scatter(
                x=rows["t_mid_s"],
                y=rows["accept_len"],
                mode="lines+markers",
                name=name,
                line=dict(color=method_color(method)),
                hovertemplate="t=%{x:.1f} s AL=%{y:.3f}<extra></extra>",
            ),
            secondary_y=False,
        )
        fig.add_trace(
            go.Bar(
                x=rows["t_mid_s"],
                y=rows["num_drafts"],
                name=f"{name}: drafts",
                opacity=0.25,
                marker=dict(color=method_color(method)),
                hovertemplate="t=%{x:.1f} s drafts=%{y}<extra></extra>",
            ),
            secondary_y=True,
        )
    fig.update_xaxes(title_text="seconds since the watch began")
    fig.update_yaxes(title_text="acceptance length", secondary_y=False)
    fig.update_yaxes(title_text="drafts in the interval", secondary_y=True, showgrid=False)
    return finish(fig, title=title, name="accept_len_over_time")


def plot_coverage(coverage: pd.DataFrame, *, title: str | None = None) -> go.Figure:
    """What each run can show (green) and cannot (grey, with the reason on hover and text).

    ``coverage`` is ``dsparklab.analysis.compute_coverage(...)``.
    """
    title = title or "What each run can show"
    require(
        coverage, ["run_id", "analysis", "available", "reason", "granularity"], what="plot_coverage"
    )
    if coverage.empty:
        return empty_figure("no runs", title=title, name="coverage")
    runs = list(dict.fromkeys(coverage["run_id"]))
    analyses = list(dict.fromkeys(coverage["analysis"]))
    table = coverage.set_index(["run_id", "analysis"])
    z = [[float(bool(table.loc[(r, a), "available"])) for a in analyses] for r in runs]
    text = [
        [
            ("yes" if table.loc[(r, a), "available"] else "no")
            + (f": {table.loc[(r, a), 'reason']}" if table.loc[(r, a), "reason"] else "")
            for a in analyses
        ]
        for r in runs
    ]
    labels = [f"{r} ({table.loc[(r, analyses[0]), 'granularity']})" for r in runs]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=analyses,
            y=labels,
            text=text,
            hovertemplate="%{y}<br>%{x}: %{text}<extra></extra>",
            colorscale=[[0.0, "#dee2e6"], [1.0, "#2f9e44"]],
            zmin=0.0,
            zmax=1.0,
            showscale=False,
            xgap=2,
            ygap=2,
        )
    )
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=10))
    height = max(260, 120 + 22 * len(runs))
    fig.update_layout(margin=dict(l=40))
    out = finish(fig, title=title, height=height, name="coverage")
    out.update_traces(texttemplate="", selector=dict(type="heatmap"))
    return out


__all__ = ["plot_accept_len_over_time", "plot_acceptance_over_time", "plot_coverage"]
