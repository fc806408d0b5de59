"""The one place colours live: methods, draft positions, deltas, accept states, the template.

Figures look colours up by name, so a method keeps its colour in every figure and every
notebook. A method this module does not know gets a stable colour from a hash of its name
(never from list order, which would change with the runs loaded).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import hex_to_rgb, sample_colorscale

TEMPLATE_NAME = "dsparklab"

# method name -> colour; "none" is the target-only baseline.
METHOD_COLORS: dict[str, str] = {
    "dspark": "#e8590c",
    "eagle3": "#1c7ed6",
    "none": "#868e96",
}
# Fallback palette for methods not in METHOD_COLORS (none of them close to the above).
FALLBACK_COLORS: tuple[str, ...] = (
    "#2b8a3e",
    "#862e9c",
    "#c2255c",
    "#0b7285",
    "#5c940d",
    "#a61e4d",
    "#364fc7",
    "#d6336c",
)
# How a drafted position ended up in a step (greedy verification is prefix-closed).
ACCEPT_STATES: tuple[str, ...] = ("not reached", "rejected", "accepted")
ACCEPT_COLORS: dict[str, str] = {
    "accepted": "#37b24d",
    "rejected": "#e03131",
    "not reached": "#e9ecef",
}
# Sequential scale for rates in [0, 1] (acceptance, survival) and for draft positions.
SEQUENTIAL_SCALE = "Viridis"
POSITION_SCALE = "Plasma"
# Diverging scale for deltas, centred on 0 by the figures (zmid=0): red = worse, blue = better.
DIVERGING_SCALE: list[list[float | str]] = [
    [0.0, "#b2182b"],
    [0.25, "#ef8a62"],
    [0.5, "#f7f7f7"],
    [0.75, "#67a9cf"],
    [1.0, "#2166ac"],
]
# Line dashes for a second categorical dimension (datasets, sources), looked up by order of
# a sorted list so that a given set of names always gets the same dashes.
DASHES: tuple[str, ...] = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
# The published reference numbers are drawn with open markers and this dash.
PUBLISHED_DASH = "dash"
PUBLISHED_COLOR = "#868e96"  # published curves beside measured ones are grey


def method_color(method: str) -> str:
    """The colour of ``method``; unknown names get a stable colour hashed from the name.

    Examples
    --------
    >>> method_color("dspark")
    '#e8590c'
    >>> method_color("medusa") == method_color("medusa")
    True
    """
    key = str(method).lower()
    if key in METHOD_COLORS:
        return METHOD_COLORS[key]
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return FALLBACK_COLORS[int.from_bytes(digest[:4], "big") % len(FALLBACK_COLORS)]


def method_shade(method: str, i: int, k: int) -> str:
    """Shade ``i`` of ``k`` of the method's colour, light (i = 0) to the full colour.

    Used for one line per window n of the same method.
    """
    r, g, b = hex_to_rgb(method_color(method))
    t = 1.0 if k <= 1 else 0.35 + 0.65 * (i / (k - 1))
    mix = [round(255 - (255 - c) * t) for c in (r, g, b)]
    return "#{:02x}{:02x}{:02x}".format(*mix)


def position_color(i: int, k: int) -> str:
    """Sequential colour of draft position ``i`` among ``k`` positions (0 = first)."""
    t = 0.0 if k <= 1 else min(max(i, 0), k - 1) / (k - 1)
    return sample_colorscale(POSITION_SCALE, [0.05 + 0.8 * t], colortype="rgb")[0]


def dash_for(name: str, names: Sequence[str]) -> str:
    """The dash of ``name`` among ``names`` (sorted first, so the mapping is stable)."""
    ordered = sorted(set(map(str, names)))
    return DASHES[ordered.index(str(name)) % len(DASHES)] if str(name) in ordered else "solid"


def accept_colorscale() -> list[list[float | str]]:
    """A discrete colour scale for z in {0, 1, 2} = not reached, rejected, accepted."""
    scale: list[list[float | str]] = []
    n = len(ACCEPT_STATES)
    for j, state in enumerate(ACCEPT_STATES):
        scale.append([j / n, ACCEPT_COLORS[state]])
        scale.append([(j + 1) / n, ACCEPT_COLORS[state]])
    return scale


def _template() -> go.layout.Template:
    template = go.layout.Template(pio.templates["plotly_white"])
    template.layout.update(
        font=dict(family="DejaVu Sans, Arial, sans-serif", size=12, color="#212529"),
        colorway=[*METHOD_COLORS.values(), *FALLBACK_COLORS],
        margin=dict(l=60, r=20, t=60, b=50),
        title=dict(x=0.01, xanchor="left", font=dict(size=15)),
        legend=dict(bgcolor="rgba(255,255,255,0.6)"),
        hoverlabel=dict(namelength=-1),
    )
    return template


def register_template() -> str:
    """Register the ``dsparklab`` plotly template (idempotent); returns its name."""
    if TEMPLATE_NAME not in pio.templates:
        pio.templates[TEMPLATE_NAME] = _template()
    return TEMPLATE_NAME


register_template()
