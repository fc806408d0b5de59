"""The live view: a ``dsparklab watch`` run's acceptance over time, refreshed as it grows.

:class:`LiveView` reads the run's ``counters`` and ``totals`` (each interval is flushed as
it finishes), computes acceptance per interval
(:func:`dsparklab.analysis.compute_acceptance_over_time`) and over the whole run
(:func:`dsparklab.analysis.compute_acceptance_by_position`), and draws them with the
``dsparklab.plots`` builders. With a front end, :meth:`LiveView.start` polls the run
directory every ``refresh_s`` seconds from a background thread, updates the figure widgets
in place and refreshes an :class:`~dsparklab.widgets.explorer.Explorer` over the run; it
stops by itself once the run is no longer ``running`` (the watch ended: Ctrl-C, a lost
server), after a last refresh. Headless it shows the figures once.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from dsparklab.analysis import compute_acceptance_by_position, compute_acceptance_over_time
from dsparklab.errors import TraceSchemaError
from dsparklab.plots import plot_accept_len_over_time, plot_acceptance_over_time
from dsparklab.store import read_run_json, read_trace
from dsparklab.store.location import Location
from dsparklab.widgets._dashboard import Dashboard
from dsparklab.widgets.explorer import Explorer, sync_figure, widget_json
from dsparklab.widgets.figure_widget import LabFigureWidget

logger = logging.getLogger(__name__)

LIVE_CLASS = "dsparklab-live"


class LiveView(Dashboard):
    """A live (or finished) ``interval`` run's figures, refreshed from its directory."""

    figure_prefix = "live"

    def __init__(
        self,
        run_dir: Location | Path | str | None,
        *,
        refresh_s: float = 5.0,
        value: str = "survival",
    ) -> None:
        super().__init__()
        # a Location, not a Path: ``s3://`` stays a URI (Path would make it ``s3:/``)
        self.run_dir = Location.of(run_dir) if run_dir else None
        self.refresh_s = refresh_s
        self.value = value
        self.over_time = pd.DataFrame()
        self.by_position = pd.DataFrame()
        self.meta: dict[str, Any] = {}
        self.intervals = -1
        self.refreshes = 0
        self.explorer: Explorer | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.load()

    # -- data ----------------------------------------------------------------------------
    def load(self) -> bool:
        """Read the run again; True when it has new intervals (or a new status)."""
        if self.run_dir is None:
            return False
        meta = read_run_json(self.run_dir)
        counters = read_trace(self.run_dir, "counters")
        totals = read_trace(self.run_dir, "totals")
        intervals = int(totals["interval"].nunique()) if len(totals) else 0
        changed = intervals != self.intervals or meta.get("status") != self.meta.get("status")
        self.meta, self.intervals = meta, intervals
        if not changed:
            return False
        run_cols = ["run_id", "method", "n", "dataset"]
        over_time = compute_acceptance_over_time(counters, totals, by=("run_id",))
        if len(counters):
            labels = counters[run_cols].drop_duplicates("run_id")
            over_time = over_time.merge(labels, on="run_id", how="left")
        self.over_time = over_time
        self.by_position = (
            compute_acceptance_by_position(
                counters=counters, by=("method", "n", "dataset"), n_boot=0
            )
            if len(counters)
            else pd.DataFrame()
        )
        return True

    @property
    def running(self) -> bool:
        return self.meta.get("status") == "running"

    def status_text(self) -> str:
        if self.run_dir is None:
            return "no live run: start one with <code>dsparklab watch --metrics-url URL</code>"
        stop = self.meta.get("stop_reason")
        state = (
            "recording"
            if self.running
            else f"stopped ({stop})"
            if stop
            else self.meta.get("status")
        )
        return f"<b>{self.run_dir.name}</b> · {self.intervals} intervals · {state}"

    # -- figures -------------------------------------------------------------------------
    def figures(self) -> dict[str, go.Figure]:
        frame = self.over_time
        if frame.empty:
            frame = pd.DataFrame(
                {
                    c: pd.Series(dtype=float)
                    for c in (
                        "interval",
                        "position",
                        "t_mid_s",
                        "accept_len",
                        "num_drafts",
                        "survival",
                        "accept_rate",
                    )
                }
            )
        return {
            "acceptance_over_time": plot_acceptance_over_time(frame, value=self.value),
            "accept_len_over_time": plot_accept_len_over_time(frame),
        }

    def _on_displayed(self) -> None:
        self.start()

    # -- the live widget -----------------------------------------------------------------
    def _build(self) -> Any:
        import ipywidgets as W

        self.status = W.HTML(self.status_text())
        for name, fig in self.figures().items():
            widget = LabFigureWidget(widget_json(fig))
            widget.add_class(f"{LIVE_CLASS}-{name}")
            self.figure_widgets[name] = widget
        children: list[Any] = [self.status, *self.figure_widgets.values()]
        if not self.by_position.empty:
            self.explorer = Explorer(self.by_position, None)
            children.append(self.explorer.widget)
        box = W.VBox(children)
        box.add_class(LIVE_CLASS)
        return box

    def refresh(self) -> bool:
        """Reload the run and update every widget in place; True when something changed."""
        try:
            changed = self.load()
        except TraceSchemaError as err:  # a run directory mid-rename, a removed run
            logger.info("live view: %s", err)
            return False
        if not changed or self._widget is None:
            return changed
        for name, fig in self.figures().items():
            sync_figure(self.figure_widgets[name], fig)
        if self.explorer is not None:
            self.explorer.refresh(self.by_position)
        elif not self.by_position.empty:
            self.explorer = Explorer(self.by_position, None)
            self._widget.children = (*self._widget.children, self.explorer.widget)
        self.status.value = self.status_text()
        self.refreshes += 1
        return True

    def start(self) -> None:
        """Poll the run every ``refresh_s`` seconds in a background thread until it stops."""
        if self._thread is not None or self.run_dir is None or not self.running:
            return
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(self.refresh_s):
                self.refresh()
                if not self.running:
                    break

        self._thread = threading.Thread(target=loop, name="dsparklab-live", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None


def latest_live_run(root: Location | Path | str) -> Location | None:
    """The newest ``interval`` run below ``root`` (by creation time), or None."""
    from dsparklab.store import list_runs

    try:
        runs = list_runs(root)
    except TraceSchemaError:
        return None
    live = runs[runs["granularity"] == "interval"] if len(runs) else runs
    if live.empty:
        return None
    return Location.of(live.sort_values("created_at")["path"].iloc[-1])
