"""The findings the report's index opens with, computed from the runs it shows.

Per dataset and method: AL(n) and speedup(n) with 95 % intervals over requests
(:func:`dsparklab.analysis.compute_window_scaling`); the seeds' question (does DSpark's
speedup rise from the smallest to the largest window while Eagle3's stays flat or falls?
:func:`dsparklab.analysis.findings.speedup_trend`); how far the speedup model is from the
measurement; and, from the cards of the drafters that made the runs, the learning curve and
the confidence head's calibration before and after temperature scaling. Two figures go
beside the tables: survival by position at the largest window with published curves
(labelled "published"), and the learning curve.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dsparklab.errors import DSparkLabError

logger = logging.getLogger(__name__)

FINDINGS_FIGURES = "findings"


@dataclass
class Findings:
    """Tables (as records) and notes for the index; empty when no run allows them."""

    tier: str | None = None
    window_table: list[dict[str, Any]] = field(default_factory=list)
    window_columns: list[str] = field(default_factory=list)
    answer: list[dict[str, Any]] = field(default_factory=list)
    model_error: dict[str, float] = field(default_factory=dict)
    curve: list[dict[str, Any]] = field(default_factory=list)
    calibration: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _interval(value: float, lo: float, hi: float, suffix: str = "") -> str:
    if pd.isna(value):
        return ""
    if pd.isna(lo) or pd.isna(hi):
        return f"{value:.2f}{suffix}"
    return f"{value:.2f}{suffix} [{lo:.2f}, {hi:.2f}]"


def _cards(runs: pd.DataFrame, zoo_dir: Path) -> dict[str, dict[str, Any]]:
    """The cards of the drafters named by the runs, where the zoo has them."""
    cards = {}
    for name in sorted({d for d in runs["drafter"].dropna() if d}):
        path = zoo_dir / str(name) / "card.json"
        if path.is_file():
            cards[str(name)] = json.loads(path.read_text(encoding="utf-8"))
    return cards


def compute_findings(
    roots: list[Path], figures_dir: Path, *, n_boot: int = 400, zoo_dir: Path | None = None
) -> Findings:
    """Everything the index's findings section shows; figures saved to ``figures_dir``.

    The most realistic tier present is used (smol before tiny). A missing part (no
    baseline, no cards, no DSpark runs) leaves its table empty with a note saying why.
    """
    from dsparklab.analysis import compute_speedup_model, compute_window_scaling
    from dsparklab.analysis.findings import seeds_answer, speedup_trend
    from dsparklab.lab.notebook import TIER_ORDER, load_published_curves, load_runs, save_figure
    from dsparklab.plots import plot_survival_curves
    from dsparklab.plots.training import plot_learning_curve
    from dsparklab.zoo import ZOO_DIR

    findings = Findings()
    tables = []
    for root in roots:
        try:
            tables.append(load_runs(root))
        except DSparkLabError as err:
            findings.notes.append(f"{root}: {err}")
    if not tables:
        return findings
    positions = pd.concat([t.positions for t in tables], ignore_index=True)
    steps = pd.concat([t.steps for t in tables], ignore_index=True)
    runs = pd.concat([t.runs for t in tables], ignore_index=True)
    tier = min(runs["tier"].astype(str).unique(), key=lambda t: TIER_ORDER.get(t, 99))
    findings.tier = tier
    positions = positions[positions["tier"] == tier]
    steps = steps[steps["tier"] == tier]
    runs = runs[runs["tier"] == tier]
    for frame in (positions, steps):
        frame["dataset"] = frame["raw_dataset"]

    scaling = compute_window_scaling(
        steps, positions=positions, by=("method", "dataset"), n_boot=n_boot
    )
    scaling = scaling[scaling["method"] != "none"]
    if scaling["speedup"].isna().all():
        findings.notes.append("no target-only baseline runs: speedups cannot be measured")
    wide: dict[tuple[str, str], dict[str, Any]] = {}
    for row in scaling.sort_values(["dataset", "method", "n"]).to_dict("records"):
        cell = wide.setdefault(
            (row["dataset"], row["method"]), {"dataset": row["dataset"], "method": row["method"]}
        )
        n = int(row["n"])
        cell[f"AL({n})"] = _interval(row["accept_len"], row["accept_len_lo"], row["accept_len_hi"])
        cell[f"speedup({n})"] = _interval(row["speedup"], row["speedup_lo"], row["speedup_hi"], "x")
    findings.window_table = list(wide.values())
    ns = sorted({int(n) for n in scaling["n"]})
    findings.window_columns = [
        "dataset",
        "method",
        *[f"AL({n})" for n in ns],
        *[f"speedup({n})" for n in ns],
    ]
    trend = speedup_trend(scaling)
    findings.answer = seeds_answer(trend).to_dict("records")

    if not scaling["speedup"].isna().all():
        model = compute_speedup_model(steps, by=("method", "dataset"), n_boot=0)
        gap = (model["speedup_model"] - model["speedup"]).abs()
        findings.model_error = {
            "max_abs_gap": float(gap.max()),
            "max_relative_error": float(model["model_error"].abs().max()),
        }

    top = max(ns) if ns else None
    if top is not None:
        from dsparklab.analysis import compute_acceptance_by_position

        by_position = compute_acceptance_by_position(
            positions[positions["n"] == top], by=("method", "n", "dataset"), n_boot=n_boot
        )
        fig = plot_survival_curves(
            by_position,
            n=top,
            published=load_published_curves(),
            title=f"Survival by position at n = {top} ({tier} tier) beside published curves",
        )
        save_figure(fig, "survival_vs_published", out_dir=figures_dir)

    cards = _cards(runs, zoo_dir or ZOO_DIR)
    curve = [
        row
        for card in cards.values()
        for row in card.get("evaluation", {}).get("learning_curve", [])
    ]
    findings.curve = [
        {
            "method": r["method"],
            "dataset": r["dataset"],
            "answer_tokens": int(r["answer_tokens"]),
            "offline_al": next(v for k, v in r.items() if k.startswith("offline_al_")),
        }
        for r in curve
    ]
    if curve:
        save_figure(plot_learning_curve(pd.DataFrame(curve)), "learning_curve", out_dir=figures_dir)
    else:
        findings.notes.append("the drafters' cards hold no learning curve")
    for name, card in cards.items():
        for dataset, entry in card.get("evaluation", {}).get("sets", {}).items():
            conf = entry.get("confidence")
            if not conf:
                continue
            for i, rows in enumerate(conf["rows"]):
                findings.calibration.append(
                    {
                        "drafter": name,
                        "dataset": dataset,
                        "position": i + 1,
                        "reached": rows,
                        "accept rate": conf["acceptance_given_reached"][i],
                        "ECE raw": conf["ece_raw"][i],
                        "ECE calibrated": conf.get("ece_calibrated", [None] * len(conf["rows"]))[i],
                    }
                )
    return findings
