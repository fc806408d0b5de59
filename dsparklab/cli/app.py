"""`dsparklab`: each command parses options, calls one library function, prints a summary.

Sub-command groups live in their own modules and are added here with ``app.add_typer``.
Errors of dsparklab's own (bad input) print one line and exit 2, never a traceback.
"""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from dsparklab.errors import DSparkLabError

app = typer.Typer(
    name="dsparklab",
    help="Per-position traces of DSpark and Eagle3 speculative decoding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _group() -> None:
    """Per-position traces of DSpark and Eagle3 speculative decoding."""


def fail(message: str) -> None:
    """Print one line to stderr and exit 2 (bad input)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


@app.command()
def validate(
    path: Path = typer.Argument(..., help="A run directory or a directory of runs."),
) -> None:
    """Check runs against the trace contract; exit 2 on any violation."""
    from dsparklab.store import validate_trace

    reports = validate_trace(path)
    for report in reports:
        typer.echo(report.summary())
        for violation in report.violations:
            typer.echo(f"  {violation}")
    bad = sum(not r.ok for r in reports)
    typer.echo(f"{len(reports)} runs: {len(reports) - bad} valid, {bad} invalid")
    if bad:
        raise typer.Exit(code=2)


import dsparklab.cli.collect  # noqa: E402, F401  (registers `collect` on app)
import dsparklab.cli.demo  # noqa: E402, F401  (registers `demo` on app)
import dsparklab.cli.importers  # noqa: E402, F401  (registers `import` and `watch` on app)
import dsparklab.cli.lab  # noqa: E402, F401  (registers `lab` on app)
import dsparklab.cli.report  # noqa: E402, F401  (registers `report` on app)
from dsparklab.cli.zoo import zoo_app  # noqa: E402

app.add_typer(zoo_app, name="zoo")


def main() -> None:
    try:
        app()
    except DSparkLabError as err:
        typer.echo(f"error: {err}", err=True)
        sys.exit(2)


if __name__ == "__main__":
    main()
