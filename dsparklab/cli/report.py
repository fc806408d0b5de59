"""`dsparklab report`: execute every notebook on a runs directory and write the report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from dsparklab.cli.common import NotebooksDir, Png, ShippedDir, fail


def parse_params(items: list[str]) -> dict[str, Any]:
    """``["N_BOOT=200", 'DATASETS=["prose"]']`` -> ``{"N_BOOT": 200, "DATASETS": ["prose"]}``.

    Values are JSON when they parse as JSON, else strings.
    """
    params: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.isidentifier():
            fail(f"--param {item!r}: expected NAME=VALUE, e.g. --param N_BOOT=200")
        try:
            params[name] = json.loads(text)
        except json.JSONDecodeError:
            params[name] = text
    return params


def report(
    runs: Annotated[
        Path, typer.Option(help="A directory of run directories (e.g. runs/demo).")
    ] = Path("runs/demo"),
    out: Annotated[Path, typer.Option(help="Report directory.")] = Path("reports"),
    notebook: Annotated[
        list[str] | None,
        typer.Option(help="Only this notebook (stem, e.g. 02_window_scaling); repeatable."),
    ] = None,
    param: Annotated[
        list[str] | None,
        typer.Option(help="NAME=VALUE papermill parameter for every notebook; repeatable."),
    ] = None,
    png: Png = True,
    show_code: Annotated[
        bool, typer.Option(help="Keep the code cells in the notebook pages.")
    ] = False,
    notebooks: NotebooksDir = None,
    shipped: ShippedDir = None,
    zoo: Annotated[
        Path | None,
        typer.Option(help="The zoo whose cards the findings read (default: data/zoo)."),
    ] = None,
) -> None:
    """Execute the notebooks with papermill, export offline HTML, figures and an index.

    Figures are written inside the report, OUT/figures/<notebook>/<figure>.{json,html,png},
    so the report directory is self-contained (relative links, one shared plotly.min.js).
    ``--param SHIPPED=false`` leaves the shipped traces out.
    """
    from dsparklab.report import build_report

    result = build_report(
        runs,
        out,
        notebooks_dir=notebooks,
        names=notebook or None,
        shipped=shipped,
        zoo_dir=zoo,
        parameters=parse_params(param or []),
        png=png,
        show_code=show_code,
    )
    typer.echo(
        f"report: {result.index} ({len(result.notebooks)} notebooks, "
        f"{len(result.figures.html)} figures, {len(result.figures.png)} PNG, "
        f"{result.seconds:.0f} s)\nfigures: {result.out / 'figures'}"
    )
    if result.figures.png_message:
        typer.echo(result.figures.png_message)
