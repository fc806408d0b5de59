"""What every command shares: one-line errors."""

from __future__ import annotations

from typing import NoReturn

import typer


def fail(message: str) -> NoReturn:
    """Print one line to stderr and exit 2 (bad input)."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code=2)
