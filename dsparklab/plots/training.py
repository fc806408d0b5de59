"""Training figures: the drafters' learning curve (offline acceptance by data seen).

The numbers come from the drafters' cards (``evaluation.learning_curve``, written by
:mod:`dsparklab.zoo.smol.evaluate`); the builder only selects and reshapes.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
import plotly.graph_objects as go

from dsparklab.plots._common import each_line, empty_figure, finish, label, levels, require, select
from dsparklab.plots.style import dash_for, method_color


def plot_learning_curve(
    curve: pd.DataFrame,
    *,
    value: str | None = None,
    methods: Sequence[str] | None = None,
    datasets: Sequence[str] | None = None,
    title: str | None = None,
) -> go.Figure:
    """Offline acceptance length against answer tokens seen, one line per (method, dataset).

    Parameters
    ----------
    curve
        Rows ``method``, ``dataset``, ``answer_tokens`` and an ``offline_al_<n>`` column
        (the cards' ``learning_curve``, one table for both drafters).
    value
        The column drawn; default the first ``offline_al_*`` column.
    methods, datasets
        Keep only these.
    title
        Figure title.
    """
    require(curve, ["method", "dataset", "answer_tokens"], what="plot_learning_curve")
    value = value or next((c for c in curve.columns if c.startswith("offline_al_")), "")
    title = title or "Learning curve: held-out offline acceptance length by data seen"
    data = select(curve, method=methods, dataset=datasets)
    if data.empty or value not in data:
        return empty_figure("no learning curve in this selection", title=title, name="curve")
    fig = go.Figure()
    all_datasets = levels(data, "dataset")
    for (method, dataset), line in each_line(data, ("method", "dataset"), sort_by="answer_tokens"):
        fig.add_trace(
            go.Scatter(
                x=line["answer_tokens"],
                y=line[value],
                mode="lines+markers",
                name=label({"method": method, "dataset": dataset}),
                line=dict(color=method_color(method), dash=dash_for(dataset, all_datasets)),
                hovertemplate=f"{method} {dataset}<br>answer tokens=%{{x:,}}"
                f"<br>{value}=%{{y:.2f}}<extra></extra>",
            )
        )
    n = value.removeprefix("offline_al_")
    fig.update_xaxes(title_text="distinct answer tokens seen (log)", type="log")
    fig.update_yaxes(title_text=f"offline AL({n})")
    return finish(fig, title=title, name="learning_curve")
