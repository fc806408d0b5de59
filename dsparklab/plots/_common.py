"""Reshaping helpers shared by the builders: column checks, selection, facets, layout."""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsparklab.errors import TraceSchemaError, UnknownMethodError
from dsparklab.plots.settings import settings
from dsparklab.plots.style import method_shade


def require(frame: pd.DataFrame, columns: Iterable[str], *, what: str) -> None:
    """Raise TraceSchemaError naming the first missing column and the source to use."""
    for name in columns:
        if name not in frame.columns:
            raise TraceSchemaError(
                f"{what} needs column {name!r}, which the frame lacks; it has "
                f"{sorted(map(str, frame.columns))} (build it with the dsparklab.analysis "
                "function named in the builder's docstring)",
                field=name,
            )


def choose(name: str, value: str, options: Mapping[str, Any]) -> Any:
    """Dispatch ``value`` through ``options``; an unknown value lists the valid ones."""
    if value not in options:
        raise UnknownMethodError(
            f"unknown {name} {value!r}; expected one of {', '.join(sorted(options))}"
        )
    return options[value]


def select(frame: pd.DataFrame, **wanted: Any) -> pd.DataFrame:
    """Rows whose columns match ``wanted`` (a value or a list); None or absent columns skip."""
    mask = pd.Series(True, index=frame.index)
    for column, value in wanted.items():
        if value is None or column not in frame.columns:
            continue
        values = list(value) if isinstance(value, (list, tuple, set, frozenset)) else [value]
        mask &= frame[column].isin(values)
    return frame.loc[mask]


def levels(frame: pd.DataFrame, column: str | None) -> list[Any]:
    """Sorted distinct values of ``column`` ([None] when there is no such column)."""
    if column is None or column not in frame.columns:
        return [None]
    return sorted(frame[column].dropna().unique().tolist(), key=_sort_key)


def _sort_key(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, (int, float)) else (1, str(value))


def label(parts: Mapping[str, Any]) -> str:
    """``"dspark · n=5 · humaneval"`` from the non-null parts."""
    out = []
    for key, value in parts.items():
        if value is None:
            continue
        out.append(f"n={value}" if key == "n" else str(value))
    return " · ".join(out)


def method_window_lines(
    data: pd.DataFrame, *, sort_by: str, default_method: str
) -> Iterator[tuple[pd.DataFrame, str, str]]:
    """``(line, color, name)`` per method, window n and dataset, each line sorted by ``sort_by``.

    The color shades the method by the window; the name adds the dataset only when the
    data holds several.
    """
    windows = levels(data, "n")
    all_datasets = levels(data, "dataset")
    for method in levels(data, "method"):
        for k, window in enumerate(windows):
            for dataset in all_datasets:
                line = select(data, method=method, n=window, dataset=dataset).sort_values(sort_by)
                if line.empty:
                    continue
                color = method_shade(method or default_method, k, len(windows))
                name = label(
                    {
                        "method": method,
                        "n": window,
                        "dataset": dataset if len(all_datasets) > 1 else None,
                    }
                )
                yield line, color, name


def facet_grid(
    rows: Sequence[Any],
    cols: Sequence[Any],
    *,
    row_name: str | None,
    col_name: str | None,
    shared_x: bool = True,
    shared_y: bool = True,
    **kwargs: Any,
) -> go.Figure:
    """A subplot grid with one titled panel per (row value, col value)."""
    n_panels = len(rows) * len(cols)
    if n_panels > settings["figure.max_facets"]:
        raise TraceSchemaError(
            f"{n_panels} panels ({len(rows)} {row_name} x {len(cols)} {col_name}) exceed "
            f"figure.max_facets={settings['figure.max_facets']}; select fewer values "
            "(e.g. methods=[...] or datasets=[...]) or raise the setting"
        )
    titles = [label({row_name or "": r, col_name or "": c}) for r in rows for c in cols]
    return make_subplots(
        rows=len(rows),
        cols=len(cols),
        shared_xaxes=shared_x,
        shared_yaxes=shared_y,
        subplot_titles=titles if n_panels > 1 else None,
        horizontal_spacing=min(0.08, 0.9 / max(len(cols), 1)),
        vertical_spacing=min(0.12, 0.9 / max(len(rows), 1)),
        **kwargs,
    )


def finish(
    fig: go.Figure,
    *,
    title: str,
    height: int | None = None,
    n_rows: int = 1,
    name: str | None = None,
) -> go.Figure:
    """Template, title and size from the settings; ``name`` goes to ``layout.meta``."""
    if height is None:
        height = max(settings["figure.height"], settings["figure.panel_height"] * n_rows)
    fig.update_layout(
        template=settings["figure.template"],
        title=dict(text=title),
        height=height,
        width=settings["figure.width"],
    )
    fig.update_annotations(font_size=13)  # subplot titles
    if name:
        fig.update_layout(meta={"dsparklab_figure": name})
    return fig


def empty_figure(message: str, *, title: str, name: str | None = None) -> go.Figure:
    """A figure that says why it is empty, instead of an error or a blank panel."""
    fig = go.Figure()
    fig.add_annotation(
        text=message,
        showarrow=False,
        x=0.5,
        y=0.5,
        xref="paper",
        yref="paper",
        font=dict(size=14, color="#868e96"),
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return finish(fig, title=title, height=260, name=name)


def fmt(value: float) -> str:
    """A cell label: the value in the settings' format, blank for NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return format(value, settings["figure.value_format"])


def rgba(color: str, alpha: float) -> str:
    """``#rrggbb`` or ``rgb(r, g, b)`` -> ``rgba(r, g, b, alpha)``."""
    if color.startswith("#"):
        r, g, b = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    else:
        r, g, b = (int(float(v)) for v in color[color.index("(") + 1 : -1].split(",")[:3])
    return f"rgba({r}, {g}, {b}, {alpha})"


def band(
    x: Sequence[Any],
    lo: Sequence[float],
    hi: Sequence[float],
    *,
    color: str,
    legendgroup: str,
) -> list[go.Scatter]:
    """Two traces drawing a shaded interval between ``lo`` and ``hi``."""
    fill = rgba(color, settings["figure.ci_opacity"])
    return [
        go.Scatter(
            x=list(x),
            y=list(hi),
            mode="lines",
            line=dict(width=0),
            showlegend=False,
            hoverinfo="skip",
            legendgroup=legendgroup,
        ),
        go.Scatter(
            x=list(x),
            y=list(lo),
            mode="lines",
            line=dict(width=0),
            fill="tonexty",
            fillcolor=fill,
            showlegend=False,
            hoverinfo="skip",
            legendgroup=legendgroup,
        ),
    ]
