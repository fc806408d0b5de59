"""`dsparklab report`: execute every notebook on a runs directory and write the report."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from dsparklab.cli.common import NotebooksDir, Png, ShippedDir, fail

_NOT_A_LITERAL = object()
COMPARISON_NOTEBOOK = "05_regression_diagnosis"


def _literal(text: str) -> Any:
    """``text`` as JSON (``true``, ``null``, ``[1, 2]``) or as a Python literal (``True``,
    ``None``, ``{'n': 3}``), as papermill users write either; else :data:`_NOT_A_LITERAL`."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return _NOT_A_LITERAL


def _same_kind(value: Any, default: Any) -> bool:
    if default is None:
        return True
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(value, bool) and isinstance(default, bool)
    if isinstance(default, float):
        return isinstance(value, int | float)
    if isinstance(default, list | tuple):
        return isinstance(value, list | tuple)
    return isinstance(value, type(default))


def parse_params(items: list[str], declared: dict[str, Any]) -> dict[str, Any]:
    """``["N_BOOT=200", "SHIPPED=False", 'DATASETS=["prose"]']`` -> typed values.

    ``declared`` holds the notebooks' parameters with their defaults
    (:func:`dsparklab.report.build.notebook_parameters`). A value is read as JSON or as a
    Python literal and must be of its default's type; a string parameter also takes the
    bare text (``RUNS=runs/mine``). An unknown name, or a value of the wrong type (such as
    ``SHIPPED=no``), is refused with one line: never a silently truthy string.
    """
    params: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or not name.isidentifier():
            fail(f"--param {item!r}: expected NAME=VALUE, e.g. --param N_BOOT=200")
        if name not in declared:
            fail(f"--param {item!r}: no notebook takes {name}; they take {sorted(declared)}")
        default = declared[name]
        value = _literal(text)
        if isinstance(default, str) and not isinstance(value, str):
            value = text
        if value is _NOT_A_LITERAL or not _same_kind(value, default):
            fail(
                f"--param {item!r}: {name} takes a {type(default).__name__} like its default "
                f"{default!r}; write it as a JSON or Python literal, e.g. {name}={default!r}"
            )
        params[name] = value
    return params


def report(
    runs: Annotated[
        str,
        typer.Option(
            help="A directory of run directories (e.g. runs/demo), or s3://bucket/prefix."
        ),
    ] = "runs/demo",
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
    statuses: Annotated[
        str,
        typer.Option(
            help="Run statuses to read, comma-separated (default: complete; a live fleet's "
            "runs read as running). Runs of other statuses are named, not counted."
        ),
    ] = "",
) -> None:
    """Execute the notebooks with papermill, export offline HTML, figures and an index.

    Figures are written inside the report, OUT/figures/<notebook>/<figure>.{json,html,png},
    so the report directory is self-contained (relative links, one shared plotly.min.js).
    Only --runs is read: --shipped DIR (or --param SHIPPED=True, for data/traces) adds the
    traces shipped with the lab. --param values are JSON or Python literals (True, None,
    ["humaneval"]) of the parameter's type; anything else is refused.
    """
    from dsparklab.lab.runs import STATUSES_ENV, read_statuses
    from dsparklab.report import build_report
    from dsparklab.report.build import discover_notebooks, notebook_parameters

    if statuses:  # the notebooks' kernels and the findings read it
        os.environ[STATUSES_ENV] = statuses
        read_statuses()  # an unknown status: one line, before any notebook runs
    declared = notebook_parameters(discover_notebooks(notebooks, notebook or None))
    result = build_report(
        runs,
        out,
        notebooks_dir=notebooks,
        names=notebook or None,
        shipped=shipped,
        zoo_dir=zoo,
        parameters=parse_params(param or [], declared),
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


def parse_selection(text: str, *, option: str) -> dict[str, Any]:
    """``"method=eagle3,n=3"`` -> ``{"method": "eagle3", "n": 3}``: run.json fields (run
    columns or dotted paths) and values read as literals where they are one, else text."""
    selection: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"{option} {text!r}: expected KEY=VALUE[,KEY=VALUE...], e.g. method=eagle3,n=3")
        literal = _literal(value)
        selection[key.strip()] = value if literal is _NOT_A_LITERAL else literal
    if not selection:
        fail(f"{option} is empty; e.g. {option} method=eagle3,n=3")
    return selection


def compare(
    base: Annotated[
        str,
        typer.Option(
            help="The base run set, KEY=VALUE[,...] over run.json fields: method=eagle3,n=3; "
            "drafter.content_hash=3f2a (a prefix); engine.version=0.32.0; tier=tiny; "
            "run_id=...; tags=nightly."
        ),
    ],
    new: Annotated[str, typer.Option(help="The new run set, as --base.")],
    runs: Annotated[
        str,
        typer.Option(help="A directory of runs holding both sets, or s3://bucket/prefix."),
    ] = "runs",
    out: Annotated[Path, typer.Option(help="Report directory.")] = Path("reports/compare"),
    dataset: Annotated[
        list[str] | None, typer.Option(help="Only this dataset; repeatable (default: all).")
    ] = None,
    png: Png = True,
    notebooks: NotebooksDir = None,
    shipped: ShippedDir = None,
) -> None:
    """Compare two run sets as a standalone report: where the speedup went (tokens per
    step, draft, verify and other cost), then acceptance per dataset, prompt, position and
    token class (notebook 05_regression_diagnosis)."""
    from dsparklab.report import build_report

    parameters: dict[str, Any] = {
        "BASE": parse_selection(base, option="--base"),
        "NEW": parse_selection(new, option="--new"),
        "DATASETS": list(dataset or []),
    }
    result = build_report(
        runs,
        out,
        notebooks_dir=notebooks,
        names=[COMPARISON_NOTEBOOK],
        shipped=shipped,
        parameters=parameters,
        png=png,
    )
    typer.echo(f"comparison: {result.out / (COMPARISON_NOTEBOOK + '.html')}")
    for note in result.notebooks[0].not_computed if result.notebooks else []:
        typer.echo(f"  not computed: {note['section']}: {note['reason']}")
