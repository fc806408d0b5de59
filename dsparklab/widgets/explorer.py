"""The explorer dashboard: dataset / method dropdowns, an n slider, a conditional / survival
toggle, a heatmap-rows toggle and a request picker, bound to three linked plotly
``FigureWidget``s (position x n heatmap, survival curves, the request's position x step token
strip). The heatmap's rows are the windows n, or (given ``binned`` acceptance) the output
depth or context length of the steps at the slider's n.

Every control writes one :class:`ExplorerState`; each change rebuilds the figures it
touches with the ``dsparklab.plots`` builders (numbers come from the precomputed
:mod:`dsparklab.analysis` frames) and copies them into the live ``FigureWidget``s in place
(one batched restyle / relayout each), so the front end redraws without re-creating the
plots. The status line says the state, or the error a control's handler raised. Clicking a
heatmap cell selects its window n (the slider follows) and its draft position (outlined in
the strip), and lists the draft -> target pairs rejected there
(:func:`dsparklab.analysis.rejected_pairs` on the selected run's rows).

Without a front end (papermill drops widget state) :meth:`Explorer.display` shows the same
three figures statically, and no widget is ever created.

Runs without token-level rows (imported, or a live ``dsparklab watch`` run) have no
drafted tokens to strip: pass ``annotated=None`` and the strip says so. A live view calls
:meth:`Explorer.refresh` with new acceptance each time its run grows.
"""

from __future__ import annotations

import functools
import html
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, get_args

import pandas as pd
import plotly.graph_objects as go

from dsparklab.analysis import rejected_pairs
from dsparklab.errors import TraceSchemaError, UnknownMethodError
from dsparklab.plain_json import plain_json
from dsparklab.plots import (
    plot_acceptance_heatmap,
    plot_request_strip,
    plot_survival_curves,
    settings,
)
from dsparklab.plots._common import empty_figure
from dsparklab.plots.acceptance import ACCEPTANCE_SHORT, visible_token
from dsparklab.widgets._dashboard import Dashboard
from dsparklab.widgets.figure_widget import LabFigureWidget

logger = logging.getLogger(__name__)

View = Literal["conditional", "survival"]
FigureName = Literal["heatmap", "survival", "strip"]
# toggle label -> the acceptance value it shows
VIEWS: dict[str, str] = {"conditional": "accept_rate", "survival": "survival"}
# heatmap-rows toggle label -> the column on the heatmap's y axis
ROWS: dict[str, str] = {
    "window n": "n",
    "output depth": "depth_bin",
    "context length": "context_bin",
}
FIGURES: tuple[FigureName, ...] = get_args(FigureName)
# the CSS class of each figure's widget (the browser tests find the figures by it)
FIGURE_CLASSES: dict[str, str] = {name: f"dsparklab-explorer-{name}" for name in FIGURES}
# pixel widths of the figure widgets (plotly.js would otherwise fall back to 700 px): the
# heatmap and the strip side by side (a clicked cell beside its outline in the strip, in a
# notebook column of ~1,000 px: a 1,400 px window with JupyterLab's file browser open),
# the curves below them
WIDGET_WIDTHS: dict[str, int] = {"heatmap": 440, "survival": 640, "strip": 440}
# rejected draft -> target pairs listed for a clicked cell
LOSSES_SHOWN = 8
RUN_KEY = ("dataset", "method", "n")  # what selects one run's token rows
# layout keys a figure never drops between updates (plotly fills them in itself)
_KEEP_LAYOUT = frozenset({"template"})
# trace keys that identify a trace and cannot change in place
_KEEP_TRACE = frozenset({"type", "uid"})

TokenLabels = Mapping[int, str] | Callable[[int], str]


@dataclass
class ExplorerState:
    """What the controls select; the figures are a function of it."""

    dataset: str
    method: str
    n: int
    view: View = "conditional"
    request: str | None = None
    position: int | None = None  # the draft position picked on the heatmap
    rows: str = "window n"  # the heatmap's y axis (a ROWS label)

    @property
    def value(self) -> str:
        """The acceptance column the view shows (``accept_rate`` or ``survival``)."""
        return VIEWS[self.view]


def widget_json(value: Any) -> Any:
    """A figure (or part of one) as plain JSON for the widget protocol.

    Arrays become lists and NaN / inf become null: the Jupyter message protocol rejects
    NaN, and plotly's own encoder would pack arrays into base64 blobs that Python-side
    readers of the widget (tests, callbacks) cannot index.
    """
    if isinstance(value, go.Figure):  # its to_dict() would pack arrays as base64
        value = {
            "data": [trace.to_plotly_json() for trace in value.data],
            "layout": value.layout.to_plotly_json(),
        }
    return plain_json(value, strict=False)


def sync_figure(widget: go.FigureWidget, fig: go.Figure) -> bool:
    """Make ``widget`` show ``fig``, in place where the traces line up.

    The figure goes over as plain JSON (:func:`widget_json`). When it has as many traces of
    the same types as ``widget``, every trace and the layout are updated inside one
    ``batch_update`` (one update message to the front end; keys the new figure lacks are
    removed). Otherwise the traces are replaced, then the layout updated.

    Returns
    -------
    bool
        True when the update was in place (no trace added or removed).
    """
    spec = widget_json(fig)
    new_traces: list[dict[str, Any]] = spec.get("data", [])
    new_layout: dict[str, Any] = spec.get("layout", {})
    if widget.layout.template is not None:
        # the template never changes between redraws, and re-validating it is the costliest
        # part of an update (plotly deep-copies it)
        new_layout.pop("template", None)
    in_place = len(new_traces) == len(widget.data) and all(
        old.type == new.get("type", "scatter")
        for old, new in zip(widget.data, new_traces, strict=True)
    )
    if not in_place:
        widget.data = ()
        widget.add_traces(new_traces)
    with widget.batch_update():
        if in_place:
            for trace, new in zip(widget.data, new_traces, strict=True):
                for key in trace.to_plotly_json().keys() - new.keys() - _KEEP_TRACE:
                    trace[key] = None
                trace.update({k: v for k, v in new.items() if k not in _KEEP_TRACE}, overwrite=True)
        for key in widget.layout.to_plotly_json().keys() - new_layout.keys() - _KEEP_LAYOUT:
            widget.layout[key] = None
        widget.layout.update(new_layout, overwrite=True)
    return in_place


def _sized(name: str, fig: go.Figure) -> go.Figure:
    """A figure as its widget shows it: its width, and plotly's toolbar standing at the
    right edge (lying along the top it covers the title)."""
    return fig.update_layout(width=WIDGET_WIDTHS[name], modebar=dict(orientation="v"))


def _shows_errors(callback: Callable[..., None]) -> Callable[..., None]:
    """A control's handler whose error goes to the status line (and the log), never only
    to JupyterLab's hidden log console."""

    @functools.wraps(callback)
    def handler(self: Any, *args: Any) -> None:
        self.error = None
        try:
            callback(self, *args)
        except Exception as err:
            logger.exception("dsparklab explorer: %s failed", callback.__name__)
            self.error = f"{callback.__name__}: {type(err).__name__}: {err}"
            self.status.value = self.status_text()

    return handler


class Explorer(Dashboard):
    """The explorer dashboard over one run set: controls + linked figures.

    The ipywidgets controls and the ``FigureWidget``s are made on first use of
    :attr:`widget` (the box with the three ``FigureWidget``s, ``.figure_widgets``) or of
    :meth:`display` with ``interactive=True``; headless, only the static builders run.

    Parameters
    ----------
    by_position
        ``compute_acceptance_by_position(positions, steps=steps,
        by=("method", "n", "dataset"))``.
    annotated
        ``annotate_positions(positions, steps=steps)`` (for the request strips); None for
        runs without token-level rows (the strip says there are none).
    token_labels
        Token id -> text for the strips (``dsparklab.lab.tokens.load_token_text``).
    dataset, method, n, view
        Initial control values (default: the first of each; ``view`` is
        ``"conditional"`` or ``"survival"``).
    binned
        Bin column (``depth_bin``, ``context_bin``) -> ``compute_acceptance_by_position(...,
        by=("method", "n", "dataset", column))``: the heatmap's other rows (none: windows
        only).
    """

    figure_prefix = "explorer"

    def __init__(
        self,
        by_position: pd.DataFrame,
        annotated: pd.DataFrame | None,
        *,
        token_labels: TokenLabels | None = None,
        dataset: str | None = None,
        method: str | None = None,
        n: int | None = None,
        view: View = "conditional",
        binned: Mapping[str, pd.DataFrame] | None = None,
    ) -> None:
        super().__init__()
        for name in ("method", "n", "dataset", "position"):
            if name not in by_position.columns:
                raise TraceSchemaError(
                    f"the explorer needs acceptance by ('method', 'n', 'dataset'); column "
                    f"{name!r} is missing (compute_acceptance_by_position(..., "
                    "by=('method', 'n', 'dataset')))",
                    field=name,
                )
        if by_position.empty:
            raise TraceSchemaError("no drafted positions to explore (empty selection)")
        if view not in VIEWS:
            raise UnknownMethodError(
                f"unknown explorer view {view!r}; expected one of {', '.join(VIEWS)}"
            )
        self.by_position = by_position
        self._set_rows(annotated)
        self.token_labels = token_labels
        self.binned = {
            label: binned[column]
            for label, column in ROWS.items()
            if column != "n" and binned is not None and len(binned.get(column, ()))
        }
        self._set_options(by_position)
        self.state = ExplorerState(
            dataset=self._pick("dataset", dataset, self.datasets),
            method=self._pick("method", method, self.methods),
            n=int(self._pick("n", n, self.ns)),
            view=view,
        )
        self.state.n = self._nearest_window(self.state.n)
        self.state.request = self._default_request()
        self.updates: dict[str, int] = dict.fromkeys(FIGURES, 0)
        self.error: str | None = None  # the last control handler's error, shown in status

    def _set_rows(self, annotated: pd.DataFrame | None) -> None:
        """The token rows, and where each run's rows are: every redraw asks for the
        selected run's rows several times, and masking every row each time cost more than
        the figures (a tenth of a click's redraw on the shipped traces)."""
        self.annotated = annotated
        self._run_index: dict[tuple[Any, ...], Any] = (
            {}
            if annotated is None or annotated.empty
            else annotated.groupby(list(RUN_KEY), sort=False, observed=True).indices
        )
        # the selected run's rows and request ids, kept until the selection moves
        self._selected: tuple[tuple[Any, ...], pd.DataFrame, list[str]] | None = None

    def _set_options(self, by_position: pd.DataFrame) -> None:
        self.datasets = sorted(by_position["dataset"].unique().tolist())
        self.methods = sorted(by_position["method"].unique().tolist())
        self.ns = sorted(int(v) for v in by_position["n"].unique())

    def windows(self) -> list[int]:
        """The windows n the selected dataset and method have runs for (the n control's
        options: a window no run has would show an empty panel)."""
        a, s = self.by_position, self.state
        rows = a.loc[(a["dataset"] == s.dataset) & (a["method"] == s.method), "n"]
        return sorted(int(v) for v in rows.unique()) or self.ns

    def _nearest_window(self, n: int) -> int:
        return min(self.windows(), key=lambda w: (abs(w - n), w))

    @staticmethod
    def _pick(name: str, value: Any, options: Sequence[Any]) -> Any:
        if value is None:
            return options[0]
        if value not in options:
            raise UnknownMethodError(
                f"unknown explorer {name} {value!r}; the runs have {list(options)}"
            )
        return value

    # -- state -> figures -----------------------------------------------------------
    def _select_run(self) -> tuple[pd.DataFrame, list[str]]:
        """The selected run's token rows and its sorted request ids."""
        a, s = self.annotated, self.state
        key = (s.dataset, s.method, s.n)
        if self._selected is None or self._selected[0] != key:
            if a is None or a.empty:
                rows = pd.DataFrame({"request_id": pd.Series(dtype=str)})
            else:
                where = self._run_index.get(key)
                rows = a.iloc[where] if where is not None else a.iloc[:0]
            self._selected = (key, rows, sorted(rows["request_id"].unique().tolist()))
        return self._selected[1], self._selected[2]

    def _run_rows(self) -> pd.DataFrame:
        return self._select_run()[0]

    def requests(self) -> list[str]:
        """The request ids of the selected run."""
        return list(self._select_run()[1])

    def _default_request(self) -> str | None:
        ids = self.requests()
        return self.state.request if self.state.request in ids else (ids[0] if ids else None)

    def row_choices(self) -> list[str]:
        """The heatmap's possible rows (the rows toggle's options)."""
        return ["window n", *self.binned]

    def heatmap(self) -> go.Figure:
        s = self.state
        if s.rows != "window n":
            frame = self.binned[s.rows]
            return plot_acceptance_heatmap(
                frame[frame["n"] == s.n],
                value=s.value,
                methods=[s.method],
                datasets=[s.dataset],
                rows=ROWS[s.rows],
                title=f"{ACCEPTANCE_SHORT[s.value]} by position and {s.rows} · n = {s.n}",
            )
        return plot_acceptance_heatmap(
            self.by_position,
            value=s.value,
            methods=[s.method],
            datasets=[s.dataset],
            highlight_n=s.n,
            title=f"{ACCEPTANCE_SHORT[s.value]} by position and window",
        )

    def survival(self) -> go.Figure:
        s = self.state
        return plot_survival_curves(self.by_position, value=s.value, n=s.n, datasets=[s.dataset])

    def strip(self) -> go.Figure:
        s = self.state
        rows = self._run_rows()
        if rows.empty:
            why = (
                "the run holds counters only (imported or live); token strips need a "
                "token-level trace"
                if s.n in self.windows()
                else f"no {s.method} run at n = {s.n} on {s.dataset}"
            )
            return empty_figure(
                f"no drafted tokens for this selection: {why}",
                title=f"{s.method} · n={s.n} · token strip",
                name="request_strip",
            )
        return plot_request_strip(
            rows,
            request_ids=s.request or "",
            run_id=rows["run_id"].iloc[0] if len(rows) and "run_id" in rows else None,
            token_labels=self.token_labels,
            width=WIDGET_WIDTHS["strip"],
            highlight_position=s.position,
            positions=max(self.ns),  # one height for every window: nothing below it jumps
            title=f"{s.method} · n={s.n} · {s.request}",
        )

    def figures(self) -> dict[str, go.Figure]:
        """The three figures for the current state."""
        return {"heatmap": self.heatmap(), "survival": self.survival(), "strip": self.strip()}

    def losses(self) -> pd.DataFrame:
        """The rejected draft -> target pairs at the clicked position of the selected run
        (:func:`dsparklab.analysis.rejected_pairs`); empty before a click."""
        s = self.state
        rows = self._run_rows()
        if s.position is None or rows.empty or "reached" not in rows:
            return pd.DataFrame()
        return rejected_pairs(rows, position=s.position, top=LOSSES_SHOWN)

    def losses_html(self) -> str:
        """:meth:`losses` as the table under the figures (token text where known)."""
        s = self.state
        if s.position is None:
            return "<i>click a heatmap cell to list the tokens the drafter loses there</i>"
        table = self.losses()
        where = f"{s.method} · n = {s.n} · {s.dataset} · position {s.position}"
        if table.empty:
            return f"<b>{html.escape(where)}</b>: no draft was rejected at this position"
        head = (
            f"<b>Rejected at {html.escape(where)}</b>, most frequent first "
            "(context: the accepted drafts before it in the step)"
        )
        rows = "".join(
            "<tr><td><code>{}</code></td><td><code>{}</code> → <code>{}</code></td><td>{}</td>"
            "<td>{:.0%}</td></tr>".format(
                " ".join(self._token(t) for t in r.context) or "—",
                self._token(r.draft_token),
                self._token(r.target_token),
                r.count,
                r.share,
            )
            for r in table.itertuples()
        )
        return (
            f"{head}<table><tr><th>context</th><th>draft → target</th><th>count</th>"
            f"<th>share</th></tr>{rows}</table>"
        )

    def _token(self, token: Any) -> str:
        """A token as HTML: its text with whitespace made visible, else its id."""
        if token is None or pd.isna(token):
            return "?"
        labels = self.token_labels
        text = None
        if labels is not None:
            text = labels.get(int(token)) if isinstance(labels, Mapping) else labels(int(token))
        return str(int(token)) if text is None else visible_token(text)

    def status_text(self) -> str:
        s = self.state
        text = f"<b>{s.method}</b> · n = {s.n} · {s.dataset} · {s.view} · request {s.request}"
        text += f" · position {s.position}" if s.position is not None else ""
        text += f" · rows by {s.rows}" if s.rows != "window n" else ""
        if self.error:
            text += f"<br><span style='color:#b00020'>{html.escape(self.error)}</span>"
        return text

    def refresh(self, by_position: pd.DataFrame, annotated: pd.DataFrame | None = None) -> None:
        """New acceptance (and token rows) for the same dashboard: options, then figures.

        The selection is kept where it still exists; the widgets (when built) get the new
        options and every figure is redrawn in place.
        """
        if by_position.empty:
            return
        self.by_position = by_position
        if annotated is not None:
            self._set_rows(annotated)
        self._set_options(by_position)
        s = self.state
        s.dataset = s.dataset if s.dataset in self.datasets else self.datasets[0]
        s.method = s.method if s.method in self.methods else self.methods[0]
        s.n = self._nearest_window(s.n)
        s.request = self._default_request()
        if self._widget is None:
            return
        self._sync_controls()
        self.redraw()

    # -- the interactive dashboard -------------------------------------------------
    def _build(self) -> Any:
        import ipywidgets as W

        s = self.state
        self.dataset = W.Dropdown(options=self.datasets, value=s.dataset, description="dataset")
        self.method = W.Dropdown(options=self.methods, value=s.method, description="method")
        self.n = W.SelectionSlider(
            options=self.windows(), value=s.n, description="n", continuous_update=False
        )
        self.view = W.ToggleButtons(options=list(VIEWS), value=s.view, description="show")
        self.rows = W.ToggleButtons(options=self.row_choices(), value=s.rows, description="rows")
        self.request = W.Dropdown(options=self.requests(), value=s.request, description="request")
        self.status = W.HTML(self.status_text())
        self.losses_view = W.HTML(self.losses_html())
        self.losses_view.add_class("dsparklab-explorer-losses")
        for name, fig in self.figures().items():
            widget = LabFigureWidget(widget_json(_sized(name, fig)))
            widget.add_class(FIGURE_CLASSES[name])
            self.figure_widgets[name] = widget
        self._bind_clicks()
        for control in (self.dataset, self.method, self.n):
            control.observe(self._on_run_change, names="value")
        self.view.observe(self._on_view_change, names="value")
        self.rows.observe(self._on_rows_change, names="value")
        self.request.observe(self._on_request_change, names="value")
        box = W.VBox(
            [
                W.HBox([self.dataset, self.method, self.n]),
                W.HBox([self.view, self.request]),
                self.rows,
                self.status,
                W.HBox(
                    [self.figure_widgets["heatmap"], self.figure_widgets["strip"]],
                    layout=W.Layout(width="100%", flex_flow="row wrap"),
                ),
                self.losses_view,
                self.figure_widgets["survival"],
            ]
        )
        box.add_class("dsparklab-explorer")
        return box

    def _bind_clicks(self) -> None:
        for trace in self.figure_widgets["heatmap"].data:
            trace.on_click(self._on_heatmap_click)

    def redraw(self, names: Sequence[str] = FIGURES) -> None:
        """Rebuild the named figures for the current state and update their widgets."""
        if self._widget is None:
            return
        builders = {"heatmap": self.heatmap, "survival": self.survival, "strip": self.strip}
        for name in names:
            # the widget keeps the template it was shown with and sync_figure leaves it
            # alone: applying the lab's to each rebuilt figure (plotly deep-copies it,
            # ~8 ms a figure) would only be thrown away
            with settings.overridden({"figure.template": "none"}):
                fig = _sized(name, builders[name]())
            if not sync_figure(self.figure_widgets[name], fig) and name == "heatmap":
                self._bind_clicks()  # new traces: their click handlers are new too
            self.updates[name] += 1
        self.status.value = self.status_text()
        self.losses_view.value = self.losses_html()

    def _sync_controls(self) -> None:
        """Put the state into the controls without calling their handlers back.

        Each control's options are replaced before its value (a value outside the old
        options would be refused), with its handler detached: the state is already
        settled and one redraw follows.
        """
        s = self.state
        settings = (
            (self.dataset, self._on_run_change, self.datasets, s.dataset),
            (self.method, self._on_run_change, self.methods, s.method),
            (self.n, self._on_run_change, self.windows(), s.n),
            (self.request, self._on_request_change, self.requests(), s.request),
        )
        for control, handler, options, value in settings:
            control.unobserve(handler, names="value")
            try:
                if tuple(control.options) != tuple(options):
                    control.options = options
                if value is not None and control.value != value:
                    control.value = value
            finally:
                control.observe(handler, names="value")

    @_shows_errors
    def _on_run_change(self, change: Mapping[str, Any]) -> None:
        s = self.state
        s.dataset, s.method = self.dataset.value, self.method.value
        if change["owner"] is self.n:  # traitlets names the control that changed
            s.n = int(self.n.value)
        s.n = self._nearest_window(s.n)  # the new dataset or method may lack the window
        s.request = self._default_request()
        self._sync_controls()
        self.redraw()

    @_shows_errors
    def _on_view_change(self, change: Mapping[str, Any]) -> None:
        self.state.view = self.view.value
        self.redraw(("heatmap", "survival"))

    @_shows_errors
    def _on_rows_change(self, change: Mapping[str, Any]) -> None:
        self.state.rows = self.rows.value
        self.redraw(("heatmap",))

    @_shows_errors
    def _on_request_change(self, change: Mapping[str, Any]) -> None:
        self.state.request = self.request.value
        self.redraw(("strip",))

    @_shows_errors
    def _on_heatmap_click(self, trace: Any, points: Any, selector: Any) -> None:
        """A heatmap cell: its position goes to the strip and the losses; with windows for
        rows, its row's n goes to the slider."""
        if not points.point_inds:
            return
        position = int(points.xs[0])
        self.state.position = position
        n = int(points.ys[0]) if self.state.rows == "window n" else self.n.value
        if n != self.n.value and n in self.windows():
            self.n.value = n  # -> _on_run_change redraws everything
        else:
            self.redraw(("strip",))
