"""plotly's ``FigureWidget`` with its front end imported once per page.

plotly ships its widget's front end as one ES module of some 5 MB, which anywidget imports
anew for every figure (about 1.2 s each in chromium on this project's CI machine). anywidget
gives a model 2 s to load its module; past that it refuses every message the kernel sends
the model, for good, and the view draws the figure as it stood when the widget was made:
empty, since plotly sends the traces, the layout and the CSS classes just after. Once, on a
loaded CI machine, the explorer's heatmap stayed blank that way and never followed a control.

:class:`LabFigureWidget` gives anywidget a small module instead (``figure_widget.js``): it
imports plotly's once per page, outside that limit, and hands each figure to it. The
messages plotly's model side would have applied meanwhile are held and replayed through
plotly's own handlers, in order. Everything on the Python side is plotly's.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import plotly
import plotly.graph_objects as go
import traitlets
from plotly.basewidget import BaseFigureWidget


@functools.cache
def plotly_widget_module() -> tuple[str, str]:
    """plotly's widget front end (the module anywidget would import for each figure) and
    a key naming it: plotly's version and the module's digest."""
    source = str(BaseFigureWidget._esm)  # anywidget read the file in when plotly's class was made
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    return source, f"plotly-{plotly.__version__}-{digest}"


class LabFigureWidget(go.FigureWidget):
    """A ``go.FigureWidget`` whose front end loads plotly's module once per page."""

    _esm = Path(__file__).with_name("figure_widget.js")
    _bundle = traitlets.Unicode().tag(sync=True)
    _bundle_key = traitlets.Unicode().tag(sync=True)
    # the traits plotly's model side applies as messages (plotly/basewidget.py's _py2js_*)
    _held_traits = traitlets.List(traitlets.Unicode()).tag(sync=True)

    @traitlets.default("_bundle")
    def _default_bundle(self) -> str:
        return plotly_widget_module()[0]

    @traitlets.default("_bundle_key")
    def _default_bundle_key(self) -> str:
        return plotly_widget_module()[1]

    @traitlets.default("_held_traits")
    def _default_held_traits(self) -> list[str]:
        return sorted(n for n in BaseFigureWidget.class_trait_names() if n.startswith("_py2js_"))
