"""ipywidgets controls bound to the plot builders, with static fallbacks for headless runs."""

from dsparklab.widgets.explorer import (
    Explorer,
    ExplorerState,
    make_explorer_widget,
    sync_figure,
)

__all__ = ["Explorer", "ExplorerState", "make_explorer_widget", "sync_figure"]
