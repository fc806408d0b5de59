"""Figures saved by the notebooks (``OUT_DIR/<name>.json``) -> interactive HTML and PNG.

Interactive pages share one ``plotly.min.js`` next to them (relative script src: they open
offline from file://). PNGs go through kaleido, which drives a Chrome/Chromium it finds;
on Debian that is ``/usr/bin/chromium``, passed to it through ``BROWSER_PATH``. Without a
usable browser the PNGs are skipped with a message saying why, never an error.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

PLOTLYJS_NAME = "plotly.min.js"
# Where Debian and Ubuntu put chromium; kaleido looks for Chrome by other names first.
CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
PNG_SCALE = 2


@dataclass
class FigureSet:
    """What was written: interactive pages, PNGs, and why PNGs are missing if they are."""

    html: list[Path] = field(default_factory=list)
    png: list[Path] = field(default_factory=list)
    png_message: str = ""


def find_chromium() -> str | None:
    """A Chromium/Chrome executable kaleido can drive: ``$BROWSER_PATH`` or Debian's."""
    env = os.environ.get("BROWSER_PATH")
    if env and Path(env).is_file():
        return env
    for candidate in CHROMIUM_CANDIDATES:
        if Path(candidate).is_file():
            return candidate
    for name in ("chromium", "chromium-browser", "google-chrome", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def write_plotlyjs(directory: Path) -> Path:
    """Copy plotly.js (the installed plotly's bundle) to ``directory``; returns its path."""
    from plotly.offline import get_plotlyjs

    path = directory / PLOTLYJS_NAME
    if not path.is_file():
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(get_plotlyjs(), encoding="utf-8")
    return path


def render_figures(figures_dir: Path, *, png: bool = True) -> FigureSet:
    """Write ``<name>.html`` (and ``.png``) beside every ``<name>.json`` below ``figures_dir``.

    Parameters
    ----------
    figures_dir
        The report's figures directory: ``<notebook>/<figure>.json`` files.
    png
        Also write static PNGs (kaleido + Chromium).
    """
    import plotly.io as pio

    result = FigureSet()
    sources = sorted(figures_dir.glob("*/*.json"))
    if not sources:
        return result
    plotlyjs = write_plotlyjs(figures_dir)
    figures = []
    for source in sources:
        fig = json.loads(source.read_text(encoding="utf-8"))  # a dict: rendered as saved
        relative = os.path.relpath(plotlyjs, source.parent)
        page = source.with_suffix(".html")
        pio.write_html(
            fig,
            page,
            include_plotlyjs=relative,
            include_mathjax=False,
            full_html=True,
            config={"displaylogo": False},
            validate=False,
        )
        result.html.append(page)
        figures.append((fig, source.with_suffix(".png")))
    if png:
        result.png, result.png_message = _write_pngs(figures)
    else:
        result.png_message = "static PNGs not requested (--no-png)"
    return result


def _size(fig: dict[str, Any], key: str, default: int) -> int:
    return int(fig.get("layout", {}).get(key) or default)


def _write_pngs(figures: list[tuple[dict[str, Any], Path]]) -> tuple[list[Path], str]:
    import plotly.io as pio

    browser = find_chromium()
    if browser is None:
        message = (
            "static PNGs skipped: no Chrome/Chromium found for kaleido (install Debian's "
            "`chromium`, or set BROWSER_PATH); the interactive HTML figures are complete"
        )
        logger.warning(message)
        return [], message
    previous = os.environ.get("BROWSER_PATH")
    os.environ["BROWSER_PATH"] = browser
    try:
        pio.write_images(
            [fig for fig, _ in figures],
            [path for _, path in figures],
            format="png",
            scale=PNG_SCALE,
            width=[_size(fig, "width", 1100) for fig, _ in figures],
            height=[_size(fig, "height", 450) for fig, _ in figures],
            validate=False,
        )
    except Exception as err:  # kaleido raises many kinds; a PNG is never worth failing for
        message = (
            f"static PNGs skipped: kaleido could not render with {browser} "
            f"({type(err).__name__}: {err}); the interactive HTML figures are complete"
        )
        logger.warning(message)
        return [], message
    finally:
        if previous is None:
            os.environ.pop("BROWSER_PATH", None)
        else:
            os.environ["BROWSER_PATH"] = previous
    return [path for _, path in figures], ""
