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
    statuses: str = typer.Option(
        "",
        "--statuses",
        help="Run statuses to count, comma-separated (default: complete, or "
        "$DSPARKLAB_STATUSES). Runs of other statuses are named, not counted.",
    ),
) -> None:
    """Count a store in SQL and print the finished table (counters for step_times)."""
    from dsparklab.analysis import (
        aggregate_store,
        compute_acceptance_by_position,
        compute_calibration,
    )
    from dsparklab.analysis.sql import select_runs
    from dsparklab.lab.runs import left_out_text, open_catalog, read_statuses

    if out is not None and out.suffix not in FORMATS:
        raise ConfigError(f"--out {out}: expected a file ending in one of {list(FORMATS)}")
    wanted = read_statuses(statuses)
    keys = tuple(k.strip() for k in by.split(",") if k.strip())
    catalog = open_catalog(path)
    counts = aggregate_store(
        catalog,
        metric=metric,
        by=keys,
        statuses=wanted,
        per_request=n_boot > 0,
        source=source,
        engine=engine,
    )
    every, _ = select_runs(catalog)
    left_out = every[~every["status"].isin(list(wanted))] if len(every) else every
    if len(left_out):  # named, never counted silently
        typer.echo(left_out_text(left_out), err=True)
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


def replay_config(
    runs: str = typer.Argument(..., help="The runs: a directory or s3://bucket/prefix."),
    method: str = typer.Option(..., "--method", help="The drafter whose curve to replay."),
    n: int = typer.Option(..., "--n", min=1, help="Its window (num_speculative_tokens)."),
    dataset: list[str] = typer.Option(
        [], "--dataset", help="Only these datasets (repeatable; default: all, pooled)."
    ),
    speculative_method: str | None = typer.Option(
        None, "--speculative-method", help="vLLM's method in the config (default: --method)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Write the JSON config here too."),
    output_format: str = typer.Option(
        "vllm",
        "--format",
        help="vllm: the speculative config (synthetic rejection sampling); "
        "speculation-profile: NVIDIA specdec_bench's speculation_profile.json.",
    ),
) -> None:
    """A measured acceptance curve to replay elsewhere: vLLM's speculative config for
    synthetic rejection sampling (serve it on other hardware to measure what that
    acceptance costs and pays there), or specdec_bench's speculation profile. Counted
    over every request of the complete runs selected."""
    import json

    from dsparklab.analysis import compute_acceptance_by_position
    from dsparklab.analysis.replay import speculation_profile, synthetic_acceptance_config
    from dsparklab.errors import ConfigError, MissingInputError
    from dsparklab.lab.runs import by_status, count_runs, open_catalog, read_statuses, token_runs

    if output_format not in ("vllm", "speculation-profile"):
        raise ConfigError(f"--format {output_format!r}: expected vllm or speculation-profile")
    catalog = open_catalog(runs)
    table, _ = by_status(token_runs(catalog, datasets=dataset), read_statuses())
    chosen = table[(table["method"] == method) & (table["n"] == n)]
    if chosen.empty:
        have = sorted({(str(m), int(k)) for m, k in zip(table["method"], table["n"], strict=True)})
        raise MissingInputError(f"no complete {method} run at n = {n} in {runs}; runs: {have}")
    counts = count_runs(catalog, chosen, "acceptance")
    if output_format == "vllm":
        curve = compute_acceptance_by_position(counts, by=("method", "n"), n_boot=0)
        config = synthetic_acceptance_config(
            curve, method=method, n=n, speculative_method=speculative_method
        )
    else:
        first = catalog.run_json(str(chosen["path"].iloc[0]))
        config = speculation_profile(
            counts,
            method=method,
            n=n,
            draft_checkpoint=_model_id(first.get("drafter")),
            target_model=_model_id(first.get("target")),
            measurement_conditions={
                "datasets": sorted(chosen["dataset"].unique()),
                "concurrency": sorted(int(c) for c in chosen["concurrency"].unique()),
                "engine": sorted(chosen["engine"].unique()),
                "hardware": first.get("hardware"),
                "runs": sorted(chosen["run_id"]),
                "source": "dsparklab replay-config",
            },
        )
    text = json.dumps(config)
    typer.echo(text)
    drafted = int(counts.loc[counts["position"] == 0, "n_drafted"].sum())
    typer.echo(
        f"# from {len(chosen)} run(s), {drafted} drafted steps: "
        f"{', '.join(sorted(chosen['run_id']))}",
        err=True,
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n", encoding="utf-8")
        typer.echo(f"wrote {out}", err=True)


def schedule(
    runs: str = typer.Argument(..., help="The runs: a directory or s3://bucket/prefix."),
    method: str = typer.Option(..., "--method", help="The drafter to schedule."),
    dataset: list[str] = typer.Option(
        [], "--dataset", help="Only these datasets (repeatable; default: all, pooled)."
    ),
    n_boot: int = typer.Option(1000, "--n-boot", min=1, help="Bootstrap resamples."),
    max_batch: int | None = typer.Option(
        None, "--max-batch", min=1, help="Where the last range ends (default: its start)."
    ),
    out: Path | None = typer.Option(None, "--out", help="Write the schedule JSON here too."),
) -> None:
    """The n to serve at each batch size, from speedup measured at several concurrencies
    (collect --concurrency): vLLM's num_speculative_tokens_per_batch_size, each choice with
    its interval and the rule. Counted over every request of the complete runs of the
    method and their target-only baselines at the same loads."""
    import json

    import pandas as pd

    from dsparklab.analysis import (
        compute_speculation_schedule,
        compute_window_scaling,
        schedule_config,
    )
    from dsparklab.analysis.schedule import SCHEDULE_RULE
    from dsparklab.errors import MissingInputError
    from dsparklab.lab.runs import by_status, count_runs, open_catalog, read_statuses, token_runs

    catalog = open_catalog(runs)
    table, _ = by_status(token_runs(catalog, datasets=dataset), read_statuses())
    chosen = table[table["method"].isin([method, "none"])]
    if not (chosen["method"] == method).any():
        raise MissingInputError(f"no complete {method} run in {runs}")
    counts = count_runs(catalog, chosen, "step_times")
    scaling = compute_window_scaling(counts, by=("method", "concurrency"), n_boot=n_boot)
    plan = compute_speculation_schedule(scaling, by=("method",))
    for row in plan.itertuples():  # each load's choice, also where none pays
        end = "on" if pd.isna(row.range_end) else int(row.range_end)
        typer.echo(
            f"# batch {row.range_start}-{end} (measured at concurrency {row.concurrency}): "
            f"n = {row.n}, speedup {row.speedup:.2f} ({row.speedup_lo:.2f}-"
            f"{row.speedup_hi:.2f}); best n {row.best_n} at {row.best_speedup:.2f}, "
            f"indistinguishable: {row.candidates}"
            + (
                ""
                if row.pays
                else "; pays at no window: target-only is faster here, and n = 0 would "
                "still run the drafter"
            ),
            err=True,
        )
    config = schedule_config(plan, max_batch=max_batch)
    typer.echo(json.dumps(config))
    if out is not None:
        document = {
            "speculative_config": config,
            "method": method,
            "rule": SCHEDULE_RULE,
            "choices": json.loads(plan.to_json(orient="records")),
            "runs": sorted(chosen["run_id"]),
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        typer.echo(f"wrote {out}", err=True)


def _model_id(model: dict | None) -> dict | None:
    """A run.json model as a published profile names it: its name and content hash, never
    a local path."""
    if not model:
        return None
    return {"name": model.get("name"), "content_hash": model.get("content_hash")}
