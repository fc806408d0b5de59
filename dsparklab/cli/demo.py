"""`dsparklab demo`: collect the demo runs on the zoo, build the report, say where it is."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

from dsparklab.cli.common import (
    DSparkModel,
    Eagle3Model,
    Png,
    TargetModel,
    Tier,
)


def demo(
    runs: Annotated[
        Path | None, typer.Option(help="Where the demo runs go (default: runs/demo).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Where the report goes (default: reports/demo).")
    ] = None,
    limit: Annotated[
        int | None, typer.Option(help="Prompts per set (default: DEMO_LIMIT).")
    ] = None,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(help="Tokens generated per prompt (default: DEMO_MAX_NEW_TOKENS)."),
    ] = None,
    tier: Tier = "smol",
    target: TargetModel = None,
    dspark: DSparkModel = None,
    eagle3: Eagle3Model = None,
    png: Png = True,
) -> None:
    """Decode a live GSM8K/HumanEval subset on the tier's models, report with shipped traces.

    The smol target is prepared first when it is the one run.

    The limits' defaults are in dsparklab/report/demo.py (DEMO_LIMIT, DEMO_MAX_NEW_TOKENS).
    """
    from dsparklab.engines.plan import tier_models
    from dsparklab.lab.runs import DEFAULT_RUNS
    from dsparklab.report.demo import (
        DEMO_LIMIT,
        DEMO_MAX_NEW_TOKENS,
        DEMO_REPORT,
        run_demo,
    )

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    logging.getLogger("dsparklab").setLevel(logging.INFO)  # what the demo is doing
    result = run_demo(
        runs=runs or DEFAULT_RUNS,
        out=out or DEMO_REPORT,
        limit=DEMO_LIMIT if limit is None else limit,
        max_new_tokens=DEMO_MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens,
        models=tier_models(tier, target, dspark, eagle3),
        png=png,
    )
    report = result.report
    typer.echo(
        f"runs: {result.runs} ({'collected' if result.collected else 'kept'} in "
        f"{result.collect_seconds:.0f} s)\n"
        f"report: {report.index} ({len(report.notebooks)} notebooks, "
        f"{len(report.figures.html)} figures, {len(report.figures.png)} PNG, "
        f"{result.report_seconds:.0f} s)\n"
        f"figures: {report.out / 'figures'}\n"
        f"total: {result.seconds:.0f} s; open {report.index.as_uri()}"
    )
    if report.figures.png_message:
        typer.echo(report.figures.png_message)
