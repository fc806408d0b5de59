"""Reshaping helpers shared by the builders: column checks, selection, facets, layout."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsparklab.errors import TraceSchemaError, UnknownMethodError, require_columns
from dsparklab.plots.settings import settings
from dsparklab.plots.style import method_shade


def require(frame: pd.DataFrame, columns: Iterable[str], *, what: str) -> None:
    """Raise TraceSchemaError naming the first missing column and the source to use."""
    hint = "build it with the dsparklab.analysis function named in the builder's docstring"
    require_columns(frame, columns, what=what, hint=hint)


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


def each_line(
    data: pd.DataFrame, by: Sequence[str], *, sort_by: str
) -> Iterator[tuple[tuple[Any, ...], pd.DataFrame]]:
    """``(values, rows)`` per combination of the ``by`` columns' levels that has rows.

    The combinations nest in the order of ``by`` (the first varies slowest), so traces
    and legend entries come out in the same order in every figure; ``rows`` are sorted by
    ``sort_by``. A column the frame lacks contributes one ``None`` level.
    """
    for values in itertools.product(*(levels(data, column) for column in by)):
        rows = select(data, **dict(zip(by, values, strict=True))).sort_values(sort_by)
        if not rows.empty:
            yield values, rows


def method_window_lines(
    data: pd.DataFrame, *, sort_by: str, default_method: str
) -> Iterator[tuple[pd.DataFrame, str, str]]:
    """``(line, color, name)`` per method, window n and dataset, each line sorted by ``sort_by``.

    The color shades the method by the window; the name adds the dataset only when the
    data holds several.
    """
    windows = levels(data, "n")
    several_datasets = len(levels(data, "dataset")) > 1
    for (method, window, dataset), line in each_line(
        data, ("method", "n", "dataset"), sort_by=sort_by
    ):
        color = method_shade(method or default_method, windows.index(window), len(windows))
        name = label(
            {"method": method, "n": window, "dataset": dataset if several_datasets else None}
        )
        yield line, color, name


def cell_grid(
    frame: pd.DataFrame,
    values: pd.Series | np.ndarray,
    *,
    rows: str,
    row_levels: Sequence[Any],
    cols: str,
    col_levels: Sequence[Any],
) -> np.ndarray:
    """``values`` (aligned with ``frame``'s rows) laid out as a float array ``[row level,
    col level]`` by ``frame[rows]`` and ``frame[cols]``: each cell the first non-null value
    of its rows, NaN where there is none or the level is not listed. What
    ``pivot_table(aggfunc="first").reindex(...)`` gives, at a tenth of its cost (a redraw
    lays out several grids)."""
    r = pd.Index(row_levels).get_indexer(frame[rows])
    c = pd.Index(col_levels).get_indexer(frame[cols])
    v = np.asarray(values, dtype=float)
    keep = (r >= 0) & (c >= 0) & ~np.isnan(v)
    cell = r[keep] * len(col_levels) + c[keep]
    _, first = np.unique(cell, return_index=True)  # the first row of each cell
    out = np.full((len(row_levels), len(col_levels)), np.nan)
    out.flat[cell[first]] = v[keep][first]
    return out


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


def panel_row(
    titles: Sequence[str], *, show_titles: bool = True, shared_y: bool = False
) -> go.Figure:
    """One row of panels, one per title; the titles are drawn only when ``show_titles``."""
    return make_subplots(
        rows=1,
        cols=len(titles),
        shared_yaxes=shared_y,
        subplot_titles=list(titles) if show_titles else None,
    )


def panel_column(titles: Sequence[str], *, show_titles: bool = True) -> go.Figure:
    """One column of panels, one per title, closer together as they get more numerous."""
    return make_subplots(
        rows=len(titles),
        cols=1,
        subplot_titles=list(titles) if show_titles else None,
        vertical_spacing=min(0.12, 0.6 / len(titles)),
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


def error_bars(center: pd.Series, lo: pd.Series, hi: pd.Series, **style: Any) -> dict[str, Any]:
    """Plotly ``error_x`` / ``error_y`` spanning ``lo`` to ``hi`` around ``center``.

    ``style`` (color, thickness, width) is the caller's: each figure sizes its own bars.
    """
    return dict(
        type="data",
        symmetric=False,
        array=(hi - center).tolist(),
        arrayminus=(center - lo).tolist(),
        **style,
    )


def interval(frame: pd.DataFrame, column: str) -> tuple[pd.Series, pd.Series] | None:
    """The ``<column>_lo`` / ``<column>_hi`` bounds, or None where the frame holds none."""
    lo, hi = f"{column}_lo", f"{column}_hi"
    if lo not in frame or hi not in frame or frame[lo].isna().all():
        return None
    return frame[lo], frame[hi]


def interval_bars(frame: pd.DataFrame, column: str, **style: Any) -> dict[str, Any] | None:
    """:func:`error_bars` of ``column`` from its interval; None (no bars) where it has none."""
    bounds = interval(frame, column)
    return None if bounds is None else error_bars(frame[column], *bounds, **style)


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
