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


def compact(
    path: str = typer.Argument(..., help="A store (a directory of runs, or s3://bucket/prefix)."),
    out: str = typer.Option(
        "", "--out", help="Write the compacted store here instead of in place."
    ),
    file_rows: int = typer.Option(32_000_000, "--file-rows", min=1, help="Rows per file at most."),
    stale_after: float | None = typer.Option(
        None,
        "--stale-after",
        min=0,
        help="Also compact a run written as running whose lease lapsed more than this many "
        "seconds ago (its writer taken for dead); default: never.",
    ),
) -> None:
    """Rewrite every finished run into the table layout, as large files sorted by (request,
    step, position); a run in the old layout is moved into it. Readers see each run's old
    files or its new ones, never both."""
    from dsparklab.store.compact import compact_store

    results = compact_store(path, out=out or None, file_rows=file_rows, stale_after_s=stale_after)
    for result in results:
        if result.skipped:
            typer.echo(f"{result.source}: skipped ({result.skipped})")
        else:
            typer.echo(
                f"{result.run}: generation {result.generation}, "
                + ", ".join(
                    f"{t} {result.rows[t]} rows in {result.files[t]} files" for t in result.rows
                )
            )
    done = sum(not r.skipped for r in results)
    typer.echo(f"{len(results)} runs: {done} compacted, {len(results) - done} skipped")
