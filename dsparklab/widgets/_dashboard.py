"""What the explorer and the live view share: a widget made on first use, and a static
fallback that shows the same figures when there is no front end (papermill, reports)."""

from __future__ import annotations

import gc
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import plotly.graph_objects as go


class Dashboard(ABC):
    """Base of the widget dashboards; subclasses build ``figures()`` and ``_build()``.

    ``figure_prefix`` names the static figures (``<prefix>_<figure>``) that
    :func:`dsparklab.lab.display.show` records.
    """

    figure_prefix = "dashboard"

    def __init__(self) -> None:
        self._widget: Any = None
        self.figure_widgets: dict[str, go.FigureWidget] = {}

    @abstractmethod
    def figures(self) -> dict[str, go.Figure]:
        """The dashboard's figures by name, as the static builders draw them."""

    @abstractmethod
    def _build(self) -> Any:
        """The ipywidgets box (controls and ``FigureWidget``s)."""

    def _on_displayed(self) -> None:  # noqa: B027 (an optional hook, empty by default)
        """Called once the interactive widget is on screen (the live view starts polling)."""

    @property
    def widget(self) -> Any:
        """The ipywidgets box, made on first use (headless runs never import ipywidgets)."""
        if self._widget is None:
            self._widget = self._build()
        return self._widget

    def display(self, *, interactive: bool, out_dir: str | Path = "") -> None:
        """Show the widget, or (``interactive=False``) its figures statically.

        Shown interactively, everything alive at that moment (the imported modules, the
        loaded runs, the widgets) is moved out of the garbage collector's reach
        (``gc.freeze``): a kernel holds some 450,000 such objects, and a full collection
        over them, which Python starts on its own every few redraws, stalled the redraw it
        landed in by 100-200 ms. Objects still free themselves when their last reference
        goes; only cycles among the frozen ones are never reclaimed.
        """
        from IPython.display import display

        if interactive:
            display(self.widget)
            self._on_displayed()
            gc.collect()  # what is already garbage is not kept for good
            gc.freeze()
            return
        from dsparklab.lab.display import show

        for name, fig in self.figures().items():
            show(fig, f"{self.figure_prefix}_{name}", out_dir=out_dir)
