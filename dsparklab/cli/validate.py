"""`dsparklab validate`: check runs against the trace contract."""

from __future__ import annotations

from pathlib import Path

import typer


def validate(
    path: str = typer.Argument(
        ..., help="A run directory, a directory of runs, or s3://bucket/prefix."
    ),
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


def migrate(
    path: Path = typer.Argument(..., help="A run directory or a directory of runs."),
) -> None:
    """Upgrade runs written under an older trace contract in place (schema 1 -> 2: the
    steps' emitted tokens, derived exactly from the recorded output lengths)."""
    from dsparklab.store.migrate import migrate_store

    outcomes = migrate_store(path)
    migrated = sum(o == "migrated" for o in outcomes.values())
    typer.echo(f"{len(outcomes)} runs: {migrated} migrated, {len(outcomes) - migrated} current")
