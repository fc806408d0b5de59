"""Acceptance figures: position x n heatmaps, survival curves, per-request token strips.

Numbers come from :func:`dsparklab.analysis.acceptance.compute_acceptance_by_position`
(heatmaps, curves) and :func:`dsparklab.analysis.prepare.annotate_positions` (strips);
the builders only select and reshape.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dsparklab.analysis import with_run_ids
from dsparklab.plots._common import (
    band,
    cell_grid,
    choose,
    each_line,
    empty_figure,
    facet_grid,
    finish,
    fmt,
    interval,
    interval_bars,
    label,
    levels,
    method_window_lines,
    panel_column,
    require,
    select,
)
from dsparklab.plots.settings import settings
from dsparklab.plots.style import (
    ACCEPT_COLORS,
    ACCEPT_STATES,
    PUBLISHED_COLOR,
    PUBLISHED_DASH,
    SEQUENTIAL_SCALE,
    accept_colorscale,
    dash_for,
    method_color,
    method_shade,
)

TokenLabels = Mapping[int, str] | Callable[[int], str]
STRIP_COLUMNS = ("request_id", "step", "position", "accepted", "reached", "draft_token")
# value column -> axis / colour-bar label
ACCEPTANCE_VALUES: dict[str, str] = {
    "accept_rate": "conditional acceptance a_i = P(accepted_i | reached_i)",
    "survival": "survival s_i = P(accepted_i)",
}
# what a colour bar or an axis says for each value (short)
ACCEPTANCE_SHORT: dict[str, str] = {
    "accept_rate": "a_i (conditional)",
    "survival": "s_i (survival)",
}
# what a heatmap's rows can be, as its y axis says
HEATMAP_ROWS: dict[str, str] = {
    "n": "window n",
    "context_bin": "context (tokens, from)",
    "depth_bin": "output depth (tokens, from)",
}
# a heatmap cell resting on fewer reached drafts than this is faded
MIN_REACHED = 10


def plot_acceptance_heatmap(
    by_position: pd.DataFrame,
    *,
    value: str = "accept_rate",
    methods: Sequence[str] | None = None,
    datasets: Sequence[str] | None = None,
    highlight_n: int | None = None,
    title: str | None = None,
    min_reached: int = MIN_REACHED,
    rows: str = "n",
) -> go.Figure:
    """Heatmap of acceptance by draft position (x) and window n (y), one panel per group.

    ``rows`` puts another column on y instead of n: a bin of the step's context
    (``context_bin``) or output depth (``depth_bin``), each named by its lower edge.

    Each cell's hover gives its evidence: the drafts that reached the position and those
    accepted, and the 95 % interval where the frame has one; a cell resting on fewer than
    ``min_reached`` reached drafts is faded (a white veil), so 1.00 from one draft does not
    read like 1.00 from a thousand.

    Parameters
    ----------
    by_position
        From ``compute_acceptance_by_position(..., by=("method", "n", "dataset"))``.
    value
        ``"accept_rate"`` (conditional, :math:`a_i`) or ``"survival"`` (:math:`s_i`).
    methods, datasets
        Keep only these (panels: datasets in rows, methods in columns).
    highlight_n
        Outline the row of this window in every panel (the explorer's n slider).
    title
        Figure title; a default names the value.
    min_reached
        Cells with fewer reached drafts (``n_reached``) are faded.

    Returns
    -------
    plotly.graph_objects.Figure
    """
    axis_label = choose("acceptance value", value, ACCEPTANCE_VALUES)
    row_label = choose("heatmap rows", rows, HEATMAP_ROWS)
    require(by_position, [rows, "position", value], what="plot_acceptance_heatmap")
    data = select(by_position, method=methods, dataset=datasets)
    title = title or f"Acceptance by position and window — {axis_label}"
    if data.empty:
        return empty_figure(
            "no drafted positions in this selection", title=title, name="acceptance_heatmap"
        )
    datasets_shown, cols = levels(data, "dataset"), levels(data, "method")
    fig = facet_grid(datasets_shown, cols, row_name="dataset", col_name="method")
    ns = levels(data.dropna(subset=[rows]), rows)
    n_pos = int(data["position"].max()) + 1
    veils = []
    for r, dataset in enumerate(datasets_shown, start=1):
        for c, method in enumerate(cols, start=1):
            panel = select(data, dataset=dataset, method=method)

            def grid(column: str, panel: pd.DataFrame = panel) -> np.ndarray:
                if column not in panel:
                    return np.full((len(ns), n_pos), np.nan)
                return cell_grid(
                    panel,
                    panel[column],
                    rows=rows,
                    row_levels=ns,
                    cols="position",
                    col_levels=range(n_pos),
                )

            z = grid(value)  # [n, position]
            reached, accepted = grid("n_reached"), grid("n_accepted")
            lo, hi = grid(f"{value}_lo"), grid(f"{value}_hi")
            hover = [
                [
                    _cell_evidence(reached[k, p], accepted[k, p], lo[k, p], hi[k, p])
                    for p in range(n_pos)
                ]
                for k in range(len(ns))
            ]
            fig.add_trace(
                go.Heatmap(
                    z=z,
                    x=list(range(n_pos)),
                    y=[str(n) for n in ns],
                    coloraxis="coloraxis",
                    text=[[fmt(v) for v in row] for row in z],
                    texttemplate="%{text}",
                    customdata=hover,
                    hovertemplate=(
                        f"{label({'method': method, 'dataset': dataset})}<br>"
                        f"{rows}=%{{y}} position=%{{x}}<br>"
                        + ACCEPTANCE_SHORT[value]
                        + " = %{z:.3f}%{customdata}<extra></extra>"
                    ),
                    name=label({"method": method, "dataset": dataset}),
                ),
                row=r,
                col=c,
            )
            few = (np.nan_to_num(reached, nan=0.0) < min_reached) & ~np.isnan(z)
            veils += [(r, c, int(k), int(p)) for k, p in np.argwhere(few)]
            if rows == "n" and highlight_n is not None and highlight_n in ns:
                k = ns.index(highlight_n)
                fig.add_shape(
                    type="rect",
                    x0=-0.5,
                    x1=n_pos - 0.5,
                    y0=k - 0.5,
                    y1=k + 0.5,
                    line=dict(color="#212529", width=3),
                    row=r,
                    col=c,
                )
    for r, c, k, p in veils:  # after the outlines: shapes[0] is the outline when drawn
        fig.add_shape(
            type="rect",
            x0=p - 0.5,
            x1=p + 0.5,
            y0=k - 0.5,
            y1=k + 0.5,
            fillcolor="rgba(255, 255, 255, 0.6)",
            line=dict(width=0),
            layer="above",
            row=r,
            col=c,
        )
    fig.update_layout(
        coloraxis=dict(
            colorscale=SEQUENTIAL_SCALE,
            cmin=0.0,
            cmax=1.0,
            colorbar=dict(title=dict(text=ACCEPTANCE_SHORT[value], side="right")),
        ),
    )
    fig.update_xaxes(title_text="draft position", dtick=1, row=len(datasets_shown))
    fig.update_yaxes(title_text=row_label, type="category", col=1)
    if highlight_n is not None:
        title = f"{title} (n = {highlight_n} outlined)"
    if veils:
        title = f"{title}<br><sup>faded: fewer than {min_reached} drafts reached the cell</sup>"
    return finish(fig, title=title, n_rows=len(datasets_shown), name="acceptance_heatmap")


def _cell_evidence(reached: float, accepted: float, lo: float, hi: float) -> str:
    """A heatmap cell's hover lines after its value: its counts and interval."""
    if np.isnan(reached):
        return ""
    text = f"<br>reached {int(reached)} · accepted {int(accepted)}"
    if not (np.isnan(lo) or np.isnan(hi)):
        text += f"<br>95 % interval {lo:.2f}–{hi:.2f}"
    return text


def plot_survival_curves(
    by_position: pd.DataFrame,
    *,
    value: str = "survival",
    n: int | None = None,
    methods: Sequence[str] | None = None,
    datasets: Sequence[str] | None = None,
    ci: bool = True,
    title: str | None = None,
    published: pd.DataFrame | None = None,
) -> go.Figure:
    """Survival (or conditional acceptance) against draft position, one line per group.

    Parameters
    ----------
    by_position
        From ``compute_acceptance_by_position(..., by=("method", "n", "dataset"))``;
        the ``<value>_lo`` / ``<value>_hi`` columns, when present, draw the interval.
    value
        ``"survival"`` or ``"accept_rate"``.
    n
        One window: one line per (method, dataset), coloured by method, dashed by
        dataset. ``None``: one line per (method, n, dataset), shaded by n.
    methods, datasets
        Keep only these.
    ci
        Shade the bootstrap interval.
    title
        Figure title.
    published
        From :func:`dsparklab.lab.published.load_published_curves`: the published curves of the
        comparable kind (``marginal`` beside survival, ``teacher-forced accuracy`` beside
        the conditional rate) are drawn in grey, dotted, named "published: ...".
    """
    axis_label = choose("acceptance value", value, ACCEPTANCE_VALUES)
    short = ACCEPTANCE_SHORT[value]
    require(by_position, ["position", value], what="plot_survival_curves")
    data = select(by_position, method=methods, dataset=datasets, n=n)
    title = title or (f"{axis_label}" + (f" at n = {n}" if n is not None else " for every window"))
    if data.empty:
        return empty_figure(
            "no drafted positions in this selection", title=title, name="survival_curves"
        )
    fig = go.Figure()
    all_datasets = levels(data, "dataset")
    ns = levels(data, "n")
    for (method, window, dataset), line in each_line(
        data, ("method", "n", "dataset"), sort_by="position"
    ):
        color = (
            method_color(method or "")
            if n is not None or len(ns) == 1
            else method_shade(method or "", ns.index(window), len(ns))
        )
        name = label(
            {
                "method": method,
                "n": None if n is not None else window,
                "dataset": dataset if len(all_datasets) > 1 else None,
            }
        )
        group = label({"method": method, "n": window, "dataset": dataset})
        bounds = interval(line, value) if ci else None
        if bounds is not None:
            fig.add_traces(band(line["position"], *bounds, color=color, legendgroup=group))
        fig.add_trace(
            go.Scatter(
                x=line["position"],
                y=line[value],
                mode="lines+markers",
                name=name,
                legendgroup=group,
                line=dict(color=color, dash=dash_for(dataset, all_datasets)),
                hovertemplate=f"{group}<br>position=%{{x}}<br>{short}=%{{y:.3f}}<extra></extra>",
            )
        )
    if published is not None and not published.empty:
        kind = "marginal" if value == "survival" else "teacher-forced accuracy"
        shown = select(published, method=methods, kind=kind)
        for curve in levels(shown, "curve"):
            line = select(shown, curve=curve).sort_values("position")
            fig.add_trace(
                go.Scatter(
                    x=line["position"],
                    y=line["rate"],
                    mode="lines",
                    name=f"published: {curve}",
                    legendgroup="published",
                    line=dict(color=PUBLISHED_COLOR, dash=PUBLISHED_DASH, width=1.5),
                    hovertemplate=f"published ({kind}): {curve}<br>position=%{{x}}"
                    f"<br>{short}=%{{y:.3f}}<br>{line['source'].iloc[0]}<extra></extra>",
                )
            )
    fig.update_xaxes(title_text="draft position", dtick=1)
    fig.update_yaxes(title_text=short, range=[0, 1.02])
    return finish(fig, title=title, name="survival_curves")


def _strip_state(frame: pd.DataFrame) -> np.ndarray:
    """0 = not reached, 1 = rejected (reached, not accepted), 2 = accepted."""
    reached = frame["reached"].to_numpy(dtype=bool)
    accepted = frame["accepted"].to_numpy(dtype=bool)
    return np.where(accepted & reached, 2, np.where(reached, 1, 0))


def _add_strip(
    fig: go.Figure,
    rows: pd.DataFrame,
    *,
    row: int,
    col: int,
    n_pos: int,
    token_labels: TokenLabels | None,
    width_px: float,
    name: str,
) -> None:
    """One strip panel: z[position, step] in {0, 1, 2}; where a cell is wide enough to read
    (``width_px`` over the steps, at least :data:`MIN_TEXT_PX`), labelled with the draft,
    and a rejected cell with draft → target; else the tokens are in the hover only."""
    rows = rows.sort_values(["step", "position"])
    steps = sorted(rows["step"].unique().tolist())

    def grid(values: pd.Series | np.ndarray) -> np.ndarray:  # [position, step]
        return cell_grid(
            rows, values, rows="position", row_levels=range(n_pos), cols="step", col_levels=steps
        )

    def text_of(token: Any) -> str:
        if pd.isna(token):
            return ""
        token = int(token)
        if token_labels is None:
            return str(token)
        if isinstance(token_labels, Mapping):
            return visible_token(token_labels.get(token, str(token)))
        return visible_token(token_labels(token))

    z = grid(_strip_state(rows))
    draft = grid(rows["draft_token"].to_numpy(dtype=float))
    has_target = "target_token" in rows and rows["target_token"].notna().any()
    target = (
        grid(rows["target_token"].to_numpy(dtype=float, na_value=np.nan)) if has_target else None
    )
    text = [[text_of(t) for t in line] for line in draft]
    labels = [
        [
            f"{text[p][j]}→{text_of(target[p, j])}"
            if target is not None and z[p, j] == 1 and not np.isnan(target[p, j])
            else text[p][j]
            for j in range(len(steps))
        ]
        for p in range(n_pos)
    ]
    hover = [
        [
            f"step {s} position {p}<br>draft {text[p][j]!r}"
            + (f" · target {text_of(target[p, j])!r}" if target is not None else "")
            + ("" if np.isnan(z[p, j]) else f"<br>{ACCEPT_STATES[int(z[p, j])]}")
            for j, s in enumerate(steps)
        ]
        for p in range(n_pos)
    ]
    labelled = width_px / max(len(steps), 1) >= MIN_TEXT_PX
    fig.add_trace(
        go.Heatmap(
            z=z,
            x=steps,
            y=list(range(n_pos)),
            zmin=-0.5,
            zmax=2.5,
            colorscale=accept_colorscale(),
            xgap=1,
            ygap=1,
            text=labels if labelled else None,
            texttemplate="%{text}" if labelled else None,
            textfont=dict(size=TEXT_PT),
            customdata=hover,
            hovertemplate="%{customdata}<extra></extra>",
            hoverongaps=False,  # a cell no draft filled (rows past the window) says nothing
            showscale=False,  # the key is the line under the title
            name=name,
        ),
        row=row,
        col=col,
    )
    fig.update_yaxes(title_text="position", dtick=1, autorange="reversed", row=row, col=col)


# whitespace and markup made visible in a cell label (plotly text is pseudo-HTML)
_VISIBLE = str.maketrans({" ": "·", "\n": "↵", "\t": "→", "\r": "␍"})


def visible_token(text: str) -> str:
    """A token's text as a cell label: whitespace shown, ``<``/``>``/``&`` escaped."""
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return text.translate(_VISIBLE) or "∅"


# a strip cell's label: this many points, drawn only where a cell has MIN_TEXT_PX of width
TEXT_PT = 10
MIN_TEXT_PX = 30
# the width a responsive figure (settings' figure.width None) is assumed to get on a page
RESPONSIVE_PX = 900


def _plot_width(width: int | None) -> float:
    """The pixels of a figure's plot area (its width less the margins)."""
    return 0.8 * (width or settings["figure.width"] or RESPONSIVE_PX)


def _finish_strips(
    fig: go.Figure, title: str, *, n_rows: int, n_pos: int, min_height: int, name: str
) -> go.Figure:
    """The step axis, a legend line under the title, and a height that fits every strip."""
    fig.update_xaxes(title_text="step", row=n_rows)
    legend = " · ".join(
        f"<span style='color:{ACCEPT_COLORS[s]}'>■</span> {s}" for s in reversed(ACCEPT_STATES)
    )
    fig.update_layout(margin=dict(t=110))  # room for the title's second line, the legend
    # a strip row needs its frame (50 px) and a readable cell (26 px) per draft position
    height = max(min_height, 90 + n_rows * (50 + 26 * n_pos))
    return finish(fig, title=f"{title}<br><sup>{legend}</sup>", height=height, name=name)


def plot_request_strip(
    annotated: pd.DataFrame,
    *,
    request_ids: str | Sequence[str] | None = None,
    max_requests: int = 2,
    run_id: str | None = None,
    methods: Sequence[str] | None = None,
    n: int | None = None,
    datasets: Sequence[str] | None = None,
    token_labels: TokenLabels | None = None,
    width: int | None = None,
    highlight_position: int | None = None,
    positions: int | None = None,
    title: str | None = None,
) -> go.Figure:
    """Token strips: step (x) x draft position (y), one panel per (run, request).

    Each cell is one drafted token, coloured accepted / rejected (the first mismatch) /
    not reached (after the first mismatch), labelled with the drafted token.

    Parameters
    ----------
    annotated
        Positions rows with ``reached`` (``dsparklab.analysis.annotate_positions``).
    request_ids
        Requests to draw; ``None``: the first ``max_requests`` of each selected run.
    max_requests
        Requests per run when ``request_ids`` is None.
    run_id, methods, n, datasets
        Select runs (request ids are unique only within a run).
    token_labels
        ``token id -> text`` (a mapping or a callable, e.g.
        ``dsparklab.lab.tokens.load_token_text``) for the cell labels; default: the ids.
    width
        The figure's width in pixels (default: the settings'); cell labels are drawn only
        where a cell is wide enough to read them, else the tokens are in the hover.
    highlight_position
        Outline this draft position's row in every panel (the explorer's heatmap click).
    positions
        Draw at least this many position rows (the rows past the drafts stay empty), so
        that strips of every window have one height (what sits below a strip stays put
        when the window changes).
    title
        Figure title.
    """
    require(annotated, STRIP_COLUMNS, what="plot_request_strip")
    ids = [request_ids] if isinstance(request_ids, str) else request_ids
    data = select(annotated, run_id=run_id, method=methods, n=n, dataset=datasets, request_id=ids)
    own_title = title is not None
    title = title or "Drafted tokens per step: accepted / rejected / not reached"
    if data.empty:
        return empty_figure(
            "no drafted positions for this selection", title=title, name="request_strip"
        )
    (data,) = with_run_ids(data)  # a frame built by hand may lack run_id
    pairs = data[["run_id", "request_id"]].drop_duplicates()
    if ids is None:
        pairs = pairs.sort_values(["run_id", "request_id"]).groupby("run_id").head(max_requests)
    pairs = list(pairs.itertuples(index=False, name=None))
    run_names = {
        rid: label(
            {
                k: data.loc[data["run_id"] == rid, k].iloc[0] if k in data else None
                for k in ("method", "n", "dataset")
            }
        )
        for rid in {p[0] for p in pairs}
    }
    titles = [" · ".join(x for x in (run_names[r], str(q)) if x) for r, q in pairs]
    # one strip under its own title: a panel title would say the same again
    fig = panel_column(["" for _ in titles] if len(pairs) == 1 and own_title else titles)
    n_pos = max(int(data["position"].max()) + 1, positions or 0)
    for r, (run, request_id) in enumerate(pairs, start=1):
        rows = data.loc[(data["run_id"] == run) & (data["request_id"] == request_id)]
        _add_strip(
            fig,
            rows,
            row=r,
            col=1,
            n_pos=n_pos,
            token_labels=token_labels,
            width_px=_plot_width(width),
            name=titles[r - 1],
        )
        if highlight_position is not None and 0 <= highlight_position < n_pos:
            fig.add_hrect(
                y0=highlight_position - 0.5,
                y1=highlight_position + 0.5,
                line=dict(color="#212529", width=2),
                row=r,
                col=1,
            )
    fig = _finish_strips(
        fig,
        title,
        n_rows=len(pairs),
        n_pos=n_pos,
        min_height=settings["figure.panel_height"],
        name="request_strip",
    )
    return fig if width is None else fig.update_layout(width=width)


def plot_prompt_strips(
    sides: Mapping[str, pd.DataFrame],
    *,
    prompt_ids: Sequence[str],
    token_labels: TokenLabels | None = None,
    title: str | None = None,
) -> go.Figure:
    """Token strips of the same prompts in several run sets, side by side (one row each).

    Parameters
    ----------
    sides
        ``{"base": annotated, "new": annotated}``: positions annotated *with steps* (so
        they carry ``prompt_id``), one frame per run set; a prompt's first request in each
        is drawn.
    prompt_ids
        The prompts, e.g. ``compute_worst_prompts(...)["prompt_id"]``.
    token_labels
        As in :func:`plot_request_strip`.
    title
        Figure title.
    """
    for frame in sides.values():
        require(frame, [*STRIP_COLUMNS, "prompt_id"], what="plot_prompt_strips")
    title = title or "Worst prompts, token by token"
    ids = list(prompt_ids)
    if not ids:
        return empty_figure("no prompts selected", title=title, name="prompt_strips")
    names = list(sides)
    fig = make_subplots(
        rows=len(ids),
        cols=len(names),
        subplot_titles=[f"{p} · {name}" for p in ids for name in names],
        vertical_spacing=min(0.1, 0.6 / len(ids)),
        horizontal_spacing=0.06,
    )
    n_pos = max(int(f["position"].max()) + 1 for f in sides.values() if len(f))
    for r, prompt_id in enumerate(ids, start=1):
        for c, name in enumerate(names, start=1):
            rows = sides[name].loc[sides[name]["prompt_id"] == prompt_id]
            if rows.empty:
                continue
            first = rows[["run_id", "request_id"]].iloc[0]
            rows = rows.loc[
                (rows["run_id"] == first["run_id"]) & (rows["request_id"] == first["request_id"])
            ]
            _add_strip(
                fig,
                rows,
                row=r,
                col=c,
                n_pos=n_pos,
                token_labels=token_labels,
                width_px=_plot_width(None) / len(names),
                name=f"{prompt_id} {name}",
            )
    return _finish_strips(
        fig, title, n_rows=len(ids), n_pos=n_pos, min_height=300, name="prompt_strips"
    )


def plot_acceptance_by_bin(
    lengths: pd.DataFrame, *, bin_column: str = "depth_bin", title: str | None = None
) -> go.Figure:
    """Acceptance length against a bin of the step's context or output depth: one panel
    per dataset, one line per method and window n, the 95 % interval as error bars.

    Parameters
    ----------
    lengths
        ``compute_acceptance_length(counts, by=("method", "n", "dataset", bin_column))``.
    bin_column
        ``context_bin`` or ``depth_bin`` (each bin named by its lower edge, in tokens).
    title
        Figure title.
    """
    axis = choose("bin", bin_column, {k: v for k, v in HEATMAP_ROWS.items() if k != "n"})
    require(lengths, [bin_column, "accept_len"], what="plot_acceptance_by_bin")
    data = lengths.dropna(subset=[bin_column])
    title = title or f"Acceptance length by {axis.split(' (')[0]}"
    if data.empty:
        return empty_figure(
            f"no step of these runs has a {bin_column}", title=title, name="acceptance_by_bin"
        )
    datasets = levels(data, "dataset")
    fig = panel_column([str(d) for d in datasets], show_titles=len(datasets) > 1)
    edges = [str(int(b)) for b in levels(data, bin_column)]
    for r, dataset in enumerate(datasets, start=1):
        panel = select(data, dataset=dataset)
        for line, color, name in method_window_lines(
            panel, sort_by=bin_column, default_method="dspark"
        ):
            fig.add_trace(
                go.Scatter(
                    x=[str(int(b)) for b in line[bin_column]],
                    y=line["accept_len"],
                    mode="lines+markers",
                    name=name,
                    legendgroup=name,
                    showlegend=r == 1,
                    line=dict(color=color),
                    error_y=interval_bars(line, "accept_len", color=color),
                ),
                row=r,
                col=1,
            )
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=edges, row=r)
        fig.update_yaxes(title_text="AL", row=r, col=1)
    fig.update_xaxes(title_text=axis, row=len(datasets))
    return finish(fig, title=title, n_rows=len(datasets), name="acceptance_by_bin")
