"""Executed notebook -> one self-contained HTML page that opens offline (file://).

nbconvert's ``lab`` template, less the scripts it would load from a CDN (see
``templates/dsparklab_offline``); plotly.js is already embedded in the notebook by
:func:`dsparklab.lab.display.setup`, and images are inlined.
"""

from __future__ import annotations

import logging
import re
from importlib.resources import files
from pathlib import Path

import nbformat

from dsparklab.errors import DSparkLabError

logger = logging.getLogger(__name__)

TEMPLATES_DIR = Path(str(files("dsparklab.report").joinpath("templates")))
TEMPLATE_NAME = "dsparklab_offline"
_SCRIPT_SRC = re.compile(r"<script\b[^>]*\bsrc\s*=\s*[\"']?\s*(?P<src>[^\"'\s>]+)", re.I)
_LINK_HREF = re.compile(r"<link\b[^>]*\bhref\s*=\s*[\"']?\s*(?P<src>[^\"'\s>]+)", re.I)
_CSS_IMPORT = re.compile(r"@import\s+(?:url\()?[\"']?(?P<src>[^\"')\s;]+)", re.I)


class OfflineHTMLError(DSparkLabError):
    """An exported page would load something from the network."""


def remote_resources(html: str) -> list[str]:
    """Every ``http(s)://`` or protocol-relative script src, link href or CSS @import."""
    found = []
    for pattern in (_SCRIPT_SRC, _LINK_HREF, _CSS_IMPORT):
        for match in pattern.finditer(html):
            src = match.group("src")
            if src.lower().startswith(("http://", "https://", "//")):
                found.append(src)
    return found


def export_html(notebook: Path | str, target: Path | str, *, show_code: bool = False) -> Path:
    """Write ``notebook`` as an offline HTML page at ``target``; returns ``target``.

    The page shows the notebook's text and outputs; its code cells only with ``show_code``
    (the report is for reading results; the executed ``.ipynb`` beside it has the code).

    Raises
    ------
    OfflineHTMLError
        When the page would still fetch a script or stylesheet from the network.
    """
    from nbconvert import HTMLExporter

    exporter = HTMLExporter(
        template_name=TEMPLATE_NAME,
        extra_template_basedirs=[str(TEMPLATES_DIR)],
        embed_images=True,
        exclude_input=not show_code,
        exclude_input_prompt=True,
        exclude_output_prompt=True,
    )
    nb = nbformat.read(Path(notebook), as_version=4)
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": Path(notebook).stem}})
    remote = remote_resources(body)
    if remote:
        raise OfflineHTMLError(
            f"file {notebook}: the exported page would load {remote[:3]} from the network; "
            "the offline template must drop them (dsparklab/report/templates)"
        )
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(body, encoding="utf-8")
    return target
