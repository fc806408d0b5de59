"""Where the speedup went: a waterfall of the change of log speedup per dataset.

Numbers come from :func:`dsparklab.analysis.compute_speedup_attribution` (level
``"dataset"``): tokens per step, then draft, verify and other cost, summing to the change
of log speedup between two run sets; bars carry their bootstrap intervals.
"""

from __future__ import annotations

import math

import pandas as pd
import plotly.graph_objects as go

from dsparklab.plots._common import empty_figure, finish, levels, panel_row, require

ATTRIBUTION_COLUMNS = (
    "component",
    "delta_log_speedup",
    "lo",
    "hi",
    "total",
    "base_speedup",
    "new_speedup",
)


def plot_speedup_attribution(
    attribution: pd.DataFrame,
    *,
    labels: tuple[str, str] = ("base", "new"),
    title: str | None = None,
) -> go.Figure:
    """One waterfall per dataset: Δ log S from ``labels[0]`` to ``labels[1]``, split into
    tokens per step, draft, verify and other cost; the last bar is the total.

    Parameters
    ----------
    attribution
        ``compute_speedup_attribution(...)`` at level ``"dataset"``.
    labels
        Names of the two run sets.
    title
        Figure title.
    """
    require(attribution, ["dataset", *ATTRIBUTION_COLUMNS], what="plot_speedup_attribution")
    title = title or f"Where the speedup went: {labels[0]} → {labels[1]} (Δ log speedup)"
    datasets = [d for d in levels(attribution, "dataset") if d is not None]
    if not datasets:
        return empty_figure("no dataset in both run sets", title=title, name="attribution")
    panel_titles = []
    for dataset in datasets:
        first = attribution[attribution["dataset"] == dataset].iloc[0]
        panel_titles.append(
            f"{dataset}: {first['base_speedup']:.2f}x → {first['new_speedup']:.2f}x"
        )
    fig = panel_row(panel_titles, shared_y=True)
    for col, dataset in enumerate(datasets, start=1):
        rows = attribution[attribution["dataset"] == dataset]
        names = [*rows["component"].astype(str), "total"]
        values = [*rows["delta_log_speedup"].astype(float), float(rows["total"].iloc[0])]
        spread = [
            "" if math.isnan(lo) or math.isnan(hi) else f"<br>95% interval [{lo:+.3f}, {hi:+.3f}]"
            for lo, hi in zip(rows["lo"].astype(float), rows["hi"].astype(float), strict=True)
        ]
        fig.add_trace(
            go.Waterfall(
                x=names,
                y=values,
                measure=["relative"] * len(rows) + ["total"],
                text=[f"{v:+.3f}" for v in values],
                customdata=[*spread, ""],
                hovertemplate="%{x}: %{y:+.4f}%{customdata}<extra>" + str(dataset) + "</extra>",
                increasing=dict(marker=dict(color="#2b8a3e")),
                decreasing=dict(marker=dict(color="#c92a2a")),
                totals=dict(marker=dict(color="#495057")),
                connector=dict(line=dict(color="#adb5bd", width=1)),
                showlegend=False,
                name=str(dataset),
            ),
            row=1,
            col=col,
        )
    fig.update_yaxes(title_text="Δ log speedup", row=1, col=1)
    return finish(fig, title=title, name="attribution")
