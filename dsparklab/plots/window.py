"""Window-scaling figures: AL(n), speedup(n) measured vs model, costs, published numbers.

Numbers come from :func:`dsparklab.analysis.compute_window_scaling` and
:func:`dsparklab.analysis.compute_speedup_model`; the published table is read by
:func:`dsparklab.lab.published.load_published`. The builders only select and reshape.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from dsparklab.plots._common import (
    choose,
    each_line,
    empty_figure,
    finish,
    interval_bars,
    label,
    levels,
    method_window_lines,
    panel_row,
    require,
    select,
)
from dsparklab.plots.style import PUBLISHED_DASH, dash_for, method_color

# metric -> axis label
WINDOW_METRICS: dict[str, str] = {
    "accept_len": "acceptance length AL(n) = 1 + Σ s_i",
    "tokens_per_step": "tokens per step (accepted + bonus)",
    "speedup": "speedup vs target-only decoding",
}
# what the y axis and the hover say for each metric (short)
WINDOW_SHORT: dict[str, str] = {
    "accept_len": "AL(n)",
    "tokens_per_step": "tokens per step",
    "speedup": "speedup",
}


def _error_bars(frame: pd.DataFrame, metric: str) -> dict | None:
    return interval_bars(frame, metric, thickness=1.2, width=4)


def plot_window_scaling(
    scaling: pd.DataFrame,
    *,
    metric: str = "speedup",
    show_model: bool = True,
    methods: Sequence[str] | None = None,
    datasets: Sequence[str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """A window metric against n, one panel per dataset, one line per method.

    Parameters
    ----------
    scaling
        From ``compute_window_scaling(..., by=("method", "dataset"))`` or
        ``compute_speedup_model(...)`` (which adds ``speedup_model``).
    metric
        ``"speedup"``, ``"accept_len"`` or ``"tokens_per_step"``; ``<metric>_lo`` /
        ``_hi`` draw error bars.
    show_model
        Draw ``<metric>_model`` (dotted) where the frame has it.
    methods, datasets
        Keep only these.
    title
        Figure title.
    """
    axis_label = choose("window metric", metric, WINDOW_METRICS)
    short = WINDOW_SHORT[metric]
    require(scaling, ["n", metric], what="plot_window_scaling")
    data = select(scaling, method=methods, dataset=datasets)
    title = title or f"{axis_label} as the window n grows"
    if data.empty:
        return empty_figure("no runs in this selection", title=title, name="window_scaling")
    panels = levels(data, "dataset")
    fig = panel_row([str(p) for p in panels], show_titles=len(panels) > 1, shared_y=True)
    model_col = f"{metric}_model"
    for (dataset, method), line in each_line(data, ("dataset", "method"), sort_by="n"):
        c = panels.index(dataset) + 1
        color = method_color(method or "")
        group = label({"method": method})
        fig.add_trace(
            go.Scatter(
                x=line["n"],
                y=line[metric],
                mode="lines+markers",
                name=f"{group} (measured)",
                legendgroup=group,
                showlegend=c == 1,
                line=dict(color=color),
                error_y=_error_bars(line, metric),
                hovertemplate=f"{label({'method': method, 'dataset': dataset})}<br>"
                f"n=%{{x}}<br>{short}=%{{y:.3f}}<extra></extra>",
            ),
            row=1,
            col=c,
        )
        if show_model and model_col in line and line[model_col].notna().any():
            fig.add_trace(
                go.Scatter(
                    x=line["n"],
                    y=line[model_col],
                    mode="lines",
                    name=f"{group} (model)",
                    legendgroup=group,
                    showlegend=c == 1,
                    line=dict(color=color, dash="dot"),
                    hovertemplate=f"{group} model<br>n=%{{x}}<br>{short}=%{{y:.3f}}<extra></extra>",
                ),
                row=1,
                col=c,
            )
    fig.update_xaxes(title_text="window n", dtick=1)
    fig.update_yaxes(title_text=short, col=1)
    return finish(fig, title=title, name="window_scaling")


def plot_draft_costs(
    model: pd.DataFrame,
    *,
    methods: Sequence[str] | None = None,
    datasets: Sequence[str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Draft cost c_draft(n) and verify overhead v(n), measured (markers) vs fitted (lines).

    Parameters
    ----------
    model
        From ``compute_speedup_model`` (``draft_cost``, ``verify_cost`` and their
        ``_model`` columns), costs relative to one target-only decode step.
    methods, datasets
        Keep only these; several datasets are drawn with different dashes.
    title
        Figure title.
    """
    require(model, ["n", "method", "draft_cost", "verify_cost"], what="plot_draft_costs")
    data = select(model, method=methods, dataset=datasets)
    title = title or "Costs per step relative to one target decode step"
    if data.empty:
        return empty_figure("no runs in this selection", title=title, name="draft_costs")
    fig = panel_row(
        [
            "draft cost c_draft(n): block = c0, autoregressive = c0 + c1·n",
            "verify overhead v(n)",
        ]
    )
    all_datasets = levels(data, "dataset")
    for col, (measured, fitted) in enumerate(
        (("draft_cost", "draft_cost_model"), ("verify_cost", "verify_cost_model")), start=1
    ):
        for (method, dataset), line in each_line(data, ("method", "dataset"), sort_by="n"):
            color = method_color(method or "")
            name = label({"method": method, "dataset": dataset if len(all_datasets) > 1 else None})
            fig.add_trace(
                go.Scatter(
                    x=line["n"],
                    y=line[measured],
                    mode="markers",
                    marker=dict(color=color, size=8),
                    name=f"{name} (measured)",
                    legendgroup=name,
                    showlegend=col == 1,
                ),
                row=1,
                col=col,
            )
            if fitted in line and line[fitted].notna().any():
                fig.add_trace(
                    go.Scatter(
                        x=line["n"],
                        y=line[fitted],
                        mode="lines",
                        line=dict(color=color, dash=dash_for(dataset, all_datasets)),
                        name=f"{name} (fit)",
                        legendgroup=name,
                        showlegend=col == 1,
                    ),
                    row=1,
                    col=col,
                )
    fig.update_xaxes(title_text="window n", dtick=1)
    fig.update_yaxes(title_text="× target step", col=1)
    return finish(fig, title=title, name="draft_costs")


def plot_published_comparison(
    measured: pd.DataFrame,
    published: pd.DataFrame,
    *,
    benchmark: str = "mean6",
    methods: Sequence[str] | None = None,
    measured_label: str = "measured (these runs)",
    title: str | None = None,
) -> go.Figure:
    """Measured speedup(n) beside the published Kimi numbers, labelled "published".

    Parameters
    ----------
    measured
        Speedup per method and n, e.g. ``compute_window_scaling(steps, by=("method",))``
        (one line per method; a ``dataset`` column, when present, is drawn dashed).
    published
        :func:`dsparklab.lab.published.load_published` (target, drafter, method, benchmark, n,
        speedup, source).
    benchmark
        Which published benchmark to draw (``"mean6"``: the unweighted mean of six sets).
    methods
        Keep only these (by the lab's method names, e.g. ``"dspark"``).
    measured_label
        Title of the measured panel.
    title
        Figure title.
    """
    require(measured, ["method", "n", "speedup"], what="plot_published_comparison")
    require(
        published,
        ["target", "drafter", "method", "benchmark", "n", "speedup"],
        what="plot_published_comparison",
    )
    ours = select(measured, method=methods)
    theirs = select(published, method=methods, benchmark=benchmark)
    title = title or "Speedup as n grows: these runs beside the published numbers"
    fig = panel_row([measured_label, f"published (Kimi, Novita; {benchmark})"])
    our_datasets = levels(ours, "dataset")
    for (method, dataset), line in each_line(ours, ("method", "dataset"), sort_by="n"):
        fig.add_trace(
            go.Scatter(
                x=line["n"],
                y=line["speedup"],
                mode="lines+markers",
                name=label({"method": method, "dataset": dataset}),
                line=dict(color=method_color(method or ""), dash=dash_for(dataset, our_datasets)),
                error_y=_error_bars(line, "speedup"),
            ),
            row=1,
            col=1,
        )
    targets = levels(theirs, "target")
    for (target, drafter), line in each_line(theirs, ("target", "drafter"), sort_by="n"):
        method = str(line["method"].iloc[0])
        fig.add_trace(
            go.Scatter(
                x=line["n"],
                y=line["speedup"],
                mode="lines+markers",
                name=f"published · {target} · {drafter}",
                line=dict(
                    color=method_color(method),
                    dash=PUBLISHED_DASH if targets.index(target) else "solid",
                ),
                marker=dict(symbol="circle-open", size=9),
                hovertemplate=f"published · {target} · {drafter}<br>n=%{{x}}<br>"
                "speedup=%{y:.2f}<extra></extra>",
            ),
            row=1,
            col=2,
        )
    if theirs.empty:
        fig.add_annotation(
            text=f"no published rows for benchmark {benchmark!r}",
            showarrow=False,
            xref="x2 domain",
            yref="y2 domain",
            x=0.5,
            y=0.5,
        )
    fig.update_xaxes(title_text="window n", dtick=1)
    fig.update_yaxes(title_text="speedup", col=1)
    return finish(fig, title=title, name="published_comparison")


def plot_speedup_by_load(
    scaling: pd.DataFrame,
    *,
    schedule: pd.DataFrame | None = None,
    title: str | None = None,
) -> go.Figure:
    """Speedup against the requests in flight, one line per method and window n, one
    panel per dataset where the frame has several; a ring marks the n the schedule serves
    at each load.

    Parameters
    ----------
    scaling
        From ``compute_window_scaling(..., by=("method", "concurrency"))`` (``dataset``
        too for one panel each); ``speedup_lo`` / ``_hi`` draw error bars.
    schedule
        From ``compute_speculation_schedule(scaling, by=("method",))``: its ``n`` per
        load, ringed at that window's measured speedup (below 1 where no window pays).
    title
        Figure title.
    """
    require(scaling, ["method", "n", "concurrency", "speedup"], what="plot_speedup_by_load")
    title = title or "Speedup as the load grows: which n at which concurrency"
    if scaling.empty:
        return empty_figure("no runs in this selection", title=title, name="speedup_by_load")
    panels = levels(scaling, "dataset")
    fig = panel_row([str(p) for p in panels], show_titles=len(panels) > 1, shared_y=True)
    for line, color, name in method_window_lines(
        scaling, sort_by="concurrency", default_method="method"
    ):
        c = panels.index(line["dataset"].iloc[0]) + 1 if "dataset" in line else 1
        fig.add_trace(
            go.Scatter(
                x=line["concurrency"],
                y=line["speedup"],
                mode="lines+markers",
                name=name,
                legendgroup=name,
                showlegend=c == 1,
                line=dict(color=color),
                error_y=_error_bars(line, "speedup"),
                hovertemplate=f"{name}<br>concurrency=%{{x}}<br>speedup=%{{y:.3f}}<extra></extra>",
            ),
            row=1,
            col=c,
        )
    if schedule is not None and not schedule.empty:
        # each dataset's schedule rings its own panel
        by_panel = schedule.groupby("dataset", sort=False) if "dataset" in schedule else None
        for rings in [schedule] if by_panel is None else [part for _, part in by_panel]:
            panel = rings["dataset"].iloc[0] if by_panel is not None else None
            c = panels.index(panel) + 1 if panel in panels else 1
            fig.add_trace(
                go.Scatter(
                    x=rings["concurrency"],
                    y=rings["speedup"],
                    mode="markers",
                    name="the schedule's n",
                    legendgroup="schedule",
                    showlegend=c == 1,
                    marker=dict(size=16, symbol="circle-open", color="#212529", line=dict(width=2)),
                    text=[f"n = {n}" for n in rings["n"]],
                    hovertemplate="schedule at concurrency %{x}: %{text}<extra></extra>",
                ),
                row=1,
                col=c,
            )
    fig.add_hline(y=1.0, line=dict(color="#868e96", dash="dot", width=1))
    fig.update_xaxes(title_text="requests in flight (concurrency)")
    fig.update_yaxes(title_text="speedup vs target-only at the same load", col=1)
    return finish(fig, title=title, name="speedup_by_load")
