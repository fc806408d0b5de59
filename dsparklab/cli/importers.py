"""`dsparklab import` and `dsparklab watch`: other tools' acceptance data as runs."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from dsparklab.cli.common import Overwrite, fail


def _formats() -> str:
    from dsparklab.importers import FORMATS

    return ", ".join(FORMATS)


def import_command(
    fmt: Annotated[
        str,
        typer.Argument(
            metavar="FORMAT",
            help="vllm-metrics, vllm-bench, vllm-request, sglang, specdec-bench or deepspec.",
        ),
    ],
    paths: Annotated[list[Path], typer.Argument(metavar="PATH...", help="Input files.")],
    out: Annotated[
        str,
        typer.Option(help="Directory (or s3://bucket/prefix) the runs are written below."),
    ] = "runs/imported",
    dataset: Annotated[
        str | None, typer.Option(help="Dataset label (default: from the file, else imported).")
    ] = None,
    method: Annotated[
        str | None,
        typer.Option(help="Drafting method label, e.g. eagle3 or dspark (default: from the file)."),
    ] = None,
    n: Annotated[
        int | None,
        typer.Option(help="The window n (checked against the file; inferred if absent)."),
    ] = None,
    overwrite: Overwrite = False,
) -> None:
    """Import what an engine or benchmark harness exported; one line per run written.

    vllm-metrics: Prometheus text from /metrics (one scrape: since start; two: the delta;
    more: intervals). vllm-bench: `vllm bench serve --save-result` JSON. vllm-request:
    responses with metrics.speculative_decoding (JSON, JSONL or an SSE stream).
    sglang: /generate responses' meta_info or OpenAI responses' sglext.spec_tokens_details.
    specdec-bench: acceptance_rate.json and/or speculation_profile.json. deepspec: DSpark
    eval metrics.json. Bad input: one line naming the file and field, exit 2, nothing
    written.
    """
    from dsparklab.errors import DSparkLabError
    from dsparklab.importers import FORMATS, import_files
    from dsparklab.store.layout import run_location

    if fmt not in FORMATS:
        fail(f"unknown format {fmt!r}; expected one of {_formats()}")
    try:
        runs, result = import_files(
            fmt, paths, out, dataset=dataset, method=method, n=n, overwrite=overwrite
        )
    except DSparkLabError as err:  # bad input: one line, exit 2, nothing written
        fail(str(err))
    written = {str(p) for p in result.written}
    for run in runs:
        path = run_location(out, run.run_json())
        state = "written" if str(path) in written else "already imported (use --overwrite)"
        bad = run.failed_checks
        verdict = (
            f"{len(run.checks)} reported numbers match the counts"
            if not bad
            else f"{len(bad)} of {len(run.checks)} reported numbers DIFFER: "
            + "; ".join(f"{c.quantity}: {c.reported} vs {c.computed}" for c in bad[:3])
        )
        typer.echo(f"{path}: {state}; {run.granularity}, n={run.n}, {run.method}; {verdict}")
    typer.echo(f"{len(result.written)} runs written, {len(result.skipped)} already there")


def watch(
    metrics_url: Annotated[
        str,
        typer.Option(help="The server's Prometheus endpoint, e.g. http://127.0.0.1:8000/metrics."),
    ],
    out: Annotated[Path, typer.Option(help="Directory the live run is written below.")] = Path(
        "runs/live"
    ),
    interval: Annotated[float, typer.Option(help="Seconds between scrapes.")] = 10.0,
    dataset: Annotated[str | None, typer.Option(help="Dataset label.")] = None,
    method: Annotated[str | None, typer.Option(help="Drafting method label.")] = None,
    n: Annotated[int | None, typer.Option(help="The window n (checked).")] = None,
    max_intervals: Annotated[
        int | None, typer.Option(help="Stop after this many intervals (default: until Ctrl-C).")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for one scrape.")] = 5.0,
) -> None:
    """Scrape a running vLLM server into a run of per-interval deltas until Ctrl-C.

    Every finished interval is kept; Ctrl-C, a lost server or a restart ends the run
    cleanly and run.json's stop_reason says which.
    """
    from dsparklab.analysis.definitions import pooled_accept_len
    from dsparklab.importers.watch import watch as run_watch

    def progress(index: int, delta: object) -> None:
        drafts = getattr(delta, "num_drafts", 0)
        al = pooled_accept_len(drafts, getattr(delta, "num_accepted_tokens", 0))
        typer.echo(f"interval {index}: {drafts} drafts, AL {al:.3f}")

    result = run_watch(
        metrics_url,
        out,
        interval_s=interval,
        dataset=dataset,
        method=method,
        n=n,
        max_intervals=max_intervals,
        timeout_s=timeout,
        on_interval=progress,
    )
    typer.echo(f"{result.run_dir}: {result.intervals} intervals; {result.stop_reason}")
