"""ipywidgets controls bound to the plot builders, with static fallbacks for headless runs."""

from dsparklab.widgets.explorer import (
    Explorer,
    ExplorerState,
    sync_figure,
)
from dsparklab.widgets.live import LiveView, latest_live_run

__all__ = [
    "Explorer",
    "ExplorerState",
    "LiveView",
    "latest_live_run",
    "sync_figure",
]
