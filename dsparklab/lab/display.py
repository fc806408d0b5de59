"""What a notebook shows and records: setup, figures, recorded values.

- :func:`record` emits a value under a custom mimetype (the way recommenders'
  ``store_metadata`` does) and :func:`read_records` collects them from an executed
  notebook, so tests compare a notebook's numbers with the analysis functions'.
- :func:`setup` sets the theme and tells whether a front end is attached: widgets need
  one; papermill / nbclient runs get static figures instead (they drop widget state).
- :func:`show` displays a figure so that it renders in JupyterLab (plotly mimetype) and in
  an exported HTML page opened offline (plotly.js embedded once by :func:`setup`), and
  saves its JSON under the notebook's ``OUT_DIR`` for the report.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path
from typing import Any

import nbformat
import pandas as pd

from dsparklab.errors import (
    DSparkLabError,
)
from dsparklab.lab.sections import RECORD_NAME as SECTIONS_RECORD
from dsparklab.lab.sections import SectionLog, run_section
from dsparklab.plain_json import plain_json

logger = logging.getLogger(__name__)

MIMETYPE = "application/vnd.dsparklab.record+json"
PLOTLY_MIMETYPE = "application/vnd.plotly.v1+json"
HEADLESS_ENV = "DSPARKLAB_HEADLESS"
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


# -- recorded values ------------------------------------------------------------------
def record(name: str, value: Any) -> None:
    """Emit ``value`` under ``name`` as a display output that :func:`read_records` reads
    (shown as nothing on the page: the notebook's outputs and report.json keep it).

    Parameters
    ----------
    name
        An identifier-like key (letters, digits, ``_ . -``).
    value
        A number, string, bool, None, list, dict, numpy value or DataFrame (stored as
        records); NaN is stored as None.
    """
    from IPython.display import display

    if not isinstance(name, str) or not _NAME.match(name):
        raise DSparkLabError(f"record name {name!r} is not an identifier-like string")
    # an empty text form: the value is for read_records and report.json, and a page shows
    # no raw record under its figures
    display({MIMETYPE: {"name": name, "value": plain_json(value)}, "text/plain": ""}, raw=True)


def note(*texts: str) -> None:
    """Show each distinct non-empty text as an italic line, e.g. :attr:`Runs.rows_note`
    (of each run set a view compares) above a view that reads rows rather than counts."""
    from IPython.display import display

    for text in dict.fromkeys(t for t in texts if t):
        display({"text/markdown": f"*{text}*", "text/plain": text}, raw=True)


def read_records(notebook: Path | str) -> dict[str, Any]:
    """Every value :func:`record` emitted in an executed notebook, by name (last one wins)."""
    path = Path(notebook)
    if not path.is_file():
        raise DSparkLabError(f"file {path}: no such notebook; execute it first")
    nb = nbformat.read(path, as_version=4)
    records: dict[str, Any] = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if MIMETYPE in data:
                payload = data[MIMETYPE]
                if isinstance(payload, str):  # some writers keep JSON mimetypes as text
                    payload = json.loads(payload)
                records[payload["name"]] = payload["value"]
    return records


# -- environment --------------------------------------------------------------------
def front_end_attached() -> bool:
    """True when a front end that renders widgets runs this kernel (JupyterLab, VS Code).

    Headless executors (papermill, nbclient, ``nbconvert --execute``) send execute
    requests with ``allow_stdin=False`` (they cannot answer ``input()``); interactive front
    ends allow stdin. ``DSPARKLAB_HEADLESS=1`` forces headless; outside a kernel: False.
    """
    if os.environ.get(HEADLESS_ENV, "") not in ("", "0"):
        return False
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    return bool(getattr(kernel, "_allow_stdin", False))


# the sections of this kernel's notebook (one notebook per kernel)
_SECTIONS = SectionLog()


def section_magic(line: str, cell: str) -> None:
    """``%%section <title>``: run the cell; if the runs lack what it needs, one line says
    so and the page goes on (see :mod:`dsparklab.lab.sections`)."""
    from IPython import get_ipython
    from IPython.display import display

    before = list(_SECTIONS.not_computed)
    message = run_section(line, cell, get_ipython().user_ns, _SECTIONS, show=display)
    if message:
        display({"text/markdown": f"*{message}*", "text/plain": message}, raw=True)
    if _SECTIONS.not_computed != before:
        record(SECTIONS_RECORD, _SECTIONS.not_computed)


def setup(*, log_level: int = logging.WARNING) -> bool:
    """Theme, table display and figure rendering for a notebook; returns :func:`front_end_attached`.

    Headless, it embeds plotly.js once (so the exported HTML renders offline). With a
    front end, figures render through JupyterLab's plotly mimetype renderer. It registers
    the ``%%section`` cell magic (:func:`section_magic`).
    """
    import plotly.io as pio
    from IPython.display import display

    from dsparklab.plots.style import register_template

    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s: %(message)s")
    from IPython import get_ipython

    shell = get_ipython()
    if shell is not None:
        shell.register_magic_function(section_magic, magic_kind="cell", magic_name="section")
    pio.templates.default = register_template()
    pio.renderers.default = "plotly_mimetype"
    pd.set_option("display.precision", 3)
    pd.set_option("display.max_columns", 30)
    pd.set_option("display.width", 160)
    attached = front_end_attached()
    if not attached:
        from plotly.offline import get_plotlyjs

        display(
            {
                "text/html": f"<script type='text/javascript'>{get_plotlyjs()}</script>",
                "text/plain": "(plotly.js embedded for offline viewing)",
            },
            raw=True,
        )
    return attached


def figure_json(fig: Any) -> dict[str, Any]:
    """The figure as plain JSON (plotly's encoder: arrays as lists, NaN as null).

    ``fig.to_plotly_json()`` keeps NaN floats, which the Jupyter message protocol rejects.
    """
    import plotly.io as pio

    return dict(json.loads(pio.to_json(fig, validate=False)))


def show(fig: Any, name: str, *, out_dir: str | Path = "") -> None:
    """Display ``fig`` (JupyterLab and offline HTML) and save it as ``<out_dir>/<name>.json``.

    Parameters
    ----------
    fig
        A plotly figure from a ``dsparklab.plots`` builder.
    name
        The figure's file name in the report (identifier-like, unique in the notebook).
    out_dir
        Where the report collects figures; empty: nothing is written.
    """
    import plotly.io as pio
    from IPython.display import display

    _name_figure(fig, name)
    html = pio.to_html(
        fig,
        full_html=False,
        include_plotlyjs=False,
        include_mathjax=False,
        div_id=f"dsparklab-{name}",
        config={"displaylogo": False},
    )
    display(
        {PLOTLY_MIMETYPE: figure_json(fig), "text/html": html, "text/plain": f"<figure {name}>"},
        raw=True,
    )
    if out_dir:
        _write_figure(fig, name, out_dir)


def save_figure(fig: Any, name: str, *, out_dir: str | Path) -> Path:
    """Write ``fig`` as ``<out_dir>/<name>.json``, where the report collects figures."""
    _name_figure(fig, name)
    return _write_figure(fig, name, out_dir)


def _name_figure(fig: Any, name: str) -> None:
    """Check the figure name and stamp it into the layout (the report finds it there)."""
    if not _NAME.match(name):
        raise DSparkLabError(f"figure name {name!r} is not an identifier-like string")
    fig.update_layout(meta={"dsparklab_figure": name})


def _write_figure(fig: Any, name: str, out_dir: str | Path) -> Path:
    import plotly.io as pio

    path = Path(out_dir) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    pio.write_json(fig, path)
    return path
