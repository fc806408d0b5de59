"""What every command shares: one-line errors, and the options several commands take.

An option that means the same in two commands is declared once here, so its flag, type
and help text cannot drift apart; each command keeps its own default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NoReturn

import typer


def fail(message: str) -> NoReturn:
    """Print one line to stderr and exit 2 (bad input)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)


Tier = Annotated[str, typer.Option(help="Zoo tier whose models are the defaults (tiny, smol).")]
TargetModel = Annotated[
    str | None, typer.Option(help="Target: zoo name or directory (default: TIER-target).")
]
DSparkModel = Annotated[
    str | None, typer.Option(help="DSpark drafter: zoo name or directory (default: TIER-dspark).")
]
Eagle3Model = Annotated[
    str | None, typer.Option(help="Eagle3 drafter: zoo name or directory (default: TIER-eagle3).")
]
Overwrite = Annotated[bool, typer.Option(help="Redo runs that are already complete.")]
NotebooksDir = Annotated[
    Path | None,
    typer.Option(help="The notebooks directory (default: the notebooks dsparklab ships)."),
]
ShippedDir = Annotated[
    Path | None,
    typer.Option(
        help="Demo traces read beside the runs (e.g. data/traces, the smol tier's shipped "
        "runs); default: the runs alone."
    ),
]
Png = Annotated[bool, typer.Option(help="Static PNGs through kaleido + Chromium.")]
