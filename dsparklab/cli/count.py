"""`dsparklab count`: the counting stage over a store, on DuckDB or Spark, from the shell.

The SQL of :func:`dsparklab.analysis.aggregate_store` (one query text per counter), run by
the embedded DuckDB or by Spark (``--engine spark``: master and settings from Spark's own
configuration, e.g. under ``spark-submit``), then the usual numpy finishing: acceptance
and calibration print their metric per group and position, step times their counters.
"""

from __future__ import annotations

from pathlib import Path

import typer

from dsparklab.errors import ConfigError

FORMATS = (".csv", ".parquet")


def count(
    path: str = typer.Argument(..., help="A store: a directory or s3://bucket/prefix."),
    metric: str = typer.Option(
        "acceptance", "--metric", help="acceptance, calibration or step_times."
    ),
    by: str = typer.Option("method,n", "--by", help="Grouping columns, comma-separated."),
    engine: str = typer.Option("duckdb", "--engine", help="duckdb (embedded) or spark."),
    source: str = typer.Option(
        "steps", "--source", help="Acceptance: count from steps or positions."
    ),
    n_boot: int = typer.Option(
        0, "--n-boot", min=0, help="Bootstrap resamples over requests (0: none)."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="Write the table to this .csv or .parquet file too."
    ),
) -> None:
    """Count a store in SQL and print the finished table (counters for step_times)."""
    from dsparklab.analysis import (
        aggregate_store,
        compute_acceptance_by_position,
        compute_calibration,
    )

    if out is not None and out.suffix not in FORMATS:
        raise ConfigError(f"--out {out}: expected a file ending in one of {list(FORMATS)}")
    keys = tuple(k.strip() for k in by.split(",") if k.strip())
    counts = aggregate_store(
        path,
        metric=metric,
        by=keys,
        per_request=n_boot > 0,
        source=source,
        engine=engine,
    )
    if metric == "acceptance":
        table = compute_acceptance_by_position(counts, by=keys, n_boot=n_boot)
    elif metric == "calibration":
        table = compute_calibration(counts, by=keys)
    else:
        table = counts
    typer.echo(table.to_string(index=False))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix == ".csv":
            table.to_csv(out, index=False)
        else:
            table.to_parquet(out, index=False)
        typer.echo(f"wrote {out}")
