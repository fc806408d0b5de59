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
from dsparklab.store.catalog import Catalog

logger = logging.getLogger(__name__)

FINDINGS_FIGURES = "findings"


@dataclass
class Findings:
    """Tables (as records) and notes for the index; empty when no run allows them."""

    run_sets: list[str] = field(default_factory=list)
    acceptance: list[dict[str, Any]] = field(default_factory=list)
    window_table: list[dict[str, Any]] = field(default_factory=list)
    window_columns: list[str] = field(default_factory=list)
    answer: list[dict[str, Any]] = field(default_factory=list)
    model_error: dict[str, float] = field(default_factory=dict)
    curve: list[dict[str, Any]] = field(default_factory=list)
    calibration: list[dict[str, Any]] = field(default_factory=list)
    best_n: list[dict[str, Any]] = field(default_factory=list)
    attribution: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # at most five {"title", "text", "figure"}: what the index opens with (report.headlines)
    headlines: list[dict[str, Any]] = field(default_factory=list)
    # the numbers the headlines are written from
    best_frame: pd.DataFrame = field(default_factory=pd.DataFrame)
    attribution_frame: pd.DataFrame = field(default_factory=pd.DataFrame)
    # AL per output-depth and context-length bin (bin column -> frame)
    binned_lengths: dict[str, pd.DataFrame] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The findings as ``report.json`` keeps them: each headline with the facts it is
        written from, the notes, and the tables the index folds under them (as shown)."""
        from dsparklab.plain_json import plain_json

        return plain_json(
            {
                "run_sets": self.run_sets,
                "headlines": self.headlines,
                "notes": self.notes,
                "tables": {
                    "acceptance": self.acceptance,
                    "windows": self.window_table,
                    "best_n": self.best_n,
                    "attribution": self.attribution,
                    "calibration": self.calibration,
                    "learning_curve": self.curve,
                    "seeds_answer": self.answer,
                },
                "model_error": self.model_error,
            }
        )


def _interval(value: float, lo: float, hi: float, suffix: str = "") -> str:
    """A table cell a reader scans: ``0.84x (0.79–0.90)``."""
    if pd.isna(value):
        return ""
    from dsparklab.report.headlines import with_interval

    return with_interval(value, lo, hi, suffix)


def _cards(runs: pd.DataFrame, zoo_dir: Path) -> dict[str, dict[str, Any]]:
    """The cards of the drafters named by the runs, where the zoo has them."""
    cards = {}
    for name in sorted({d for d in runs["drafter"].dropna() if d}):
        path = zoo_dir / str(name) / "card.json"
        if path.is_file():
            cards[str(name)] = json.loads(path.read_text(encoding="utf-8"))
    return cards


def run_set_labels(runs: pd.DataFrame) -> pd.Series:
    """run_id -> ``<tier>/<engine>`` (``tiny/vllm``, ``smol/reference``,
    ``imported/deepspec``): findings are given per run set, whatever the runs are."""
    label = runs["tier"].fillna("").astype(str) + "/" + runs["engine"].fillna("").astype(str)
    return pd.Series(label.to_numpy(), index=runs["run_id"].astype(str))


def _label(frame: pd.DataFrame, labels: pd.Series) -> pd.DataFrame:
    if "run_id" not in frame.columns:
        return frame.assign(run_set=pd.Series(dtype=str))
    return frame.assign(run_set=frame["run_id"].astype(str).map(labels))


def sampled_notes(runs: pd.DataFrame, labels: pd.Series) -> list[str]:
    """One note per run set holding runs read as a sample of their requests: recorded so
    (``DSPARKLAB_SAMPLE``) or read so (past the row budget, ``DSPARKLAB_MAX_ROWS``)."""
    if "sample" not in runs.columns:
        return []
    sampled = runs[runs["sample"] < 1.0]
    notes = []
    for run_set, group in sampled.groupby(sampled["run_id"].astype(str).map(labels)):
        fractions = ", ".join(f"{f:g}" for f in sorted(set(group["sample"])))
        notes.append(
            f"{run_set}: {len(group)} runs hold a sample of their requests (fraction "
            f"{fractions}, by id hash: recorded so, or read within DSPARKLAB_MAX_ROWS): "
            "intervals are over the sampled requests"
        )
    return notes


def compute_findings(
    catalog: Catalog, figures_dir: Path, *, n_boot: int = 400, zoo_dir: Path | None = None
) -> Findings:
    """Everything the index's findings section shows; figures saved to ``figures_dir``.

    Computed on the runs of ``catalog``, per run set (:func:`run_set_labels`), dataset,
    method and n, whatever granularity each run has: acceptance by position and AL for
    every run; AL(n) where a run set holds two windows of one method; speedup where it
    also holds target-only baselines and step timings. A part the runs cannot give
    leaves its table empty and adds one note saying why.

    Acceptance and step times are counted by DuckDB over every request the runs hold
    (:func:`dsparklab.lab.runs.count_runs`); only the small tables of imported and
    live runs (counters, totals) are read into memory.
    """
    from dsparklab.analysis import compute_acceptance_by_position, compute_acceptance_length
    from dsparklab.analysis.sql.queries import BIN_EDGES
    from dsparklab.lab.display import save_figure
    from dsparklab.lab.published import load_published_curves
    from dsparklab.lab.runs import count_runs, left_out_text, load_any_runs
    from dsparklab.plots import plot_survival_curves
    from dsparklab.plots.training import plot_learning_curve
    from dsparklab.zoo import ZOO_DIR

    findings = Findings()
    tables = []
    for root in catalog.roots:
        try:
            tables.append(load_any_runs(catalog.only(root), tables=("counters", "totals")))
        except DSparkLabError as err:
            findings.notes.append(f"{root}: {err}")
            continue
        if len(tables[-1].left_out):
            left_out = left_out_text(tables[-1].left_out)
            findings.notes.append(f"{root}: {left_out}; no finding counts them")
    if not tables:
        return findings
    runs = pd.concat([t.runs for t in tables], ignore_index=True)
    labels = run_set_labels(runs)
    frames = {
        name: _label(pd.concat([getattr(t, name) for t in tables], ignore_index=True), labels)
        for name in ("counters", "totals")
    }
    counts = _label(count_runs(catalog, runs, "acceptance"), labels)
    findings.run_sets = sorted(set(labels))
    findings.notes += sampled_notes(runs, labels)
    by = ("run_set", "dataset", "method", "n")
    lengths = compute_acceptance_length(
        counters=frames["counters"],
        totals=frames["totals"],
        counts=counts,
        by=by,
        n_boot=n_boot,
    )
    by_position = compute_acceptance_by_position(  # intervals: the headlines cite them
        counters=frames["counters"], counts=counts, by=by, n_boot=n_boot
    )
    for column in BIN_EDGES:
        binned = _label(count_runs(catalog, runs, "acceptance", by=(column,)), labels)
        binned = binned.dropna(subset=[column])  # steps without a context length
        if len(binned):
            findings.binned_lengths[column] = compute_acceptance_length(
                binned, by=(*by, column), n_boot=n_boot
            )
    findings.acceptance = _acceptance_rows(lengths, by_position)
    _window_findings(findings, lengths, catalog, n_boot, figures_dir)

    if len(by_position):
        top = int(by_position["n"].max())
        curves = by_position[by_position["n"] == top]
        if curves["run_set"].nunique() > 1:
            curves = curves.assign(dataset=curves["run_set"] + ": " + curves["dataset"])
        fig = plot_survival_curves(
            curves,
            n=top,
            published=load_published_curves(),
            title=f"Survival by position at n = {top} beside published curves",
        )
        save_figure(fig, "survival_vs_published", out_dir=figures_dir)
    findings.headlines = _headlines(findings, by_position)

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
                        "position": i,
                        "reached": rows,
                        "accept rate": conf["acceptance_given_reached"][i],
                        "ECE raw": conf["ece_raw"][i],
                        "ECE calibrated": conf.get("ece_calibrated", [None] * len(conf["rows"]))[i],
                    }
                )
    return findings


def _headlines(findings: Findings, by_position: pd.DataFrame) -> list[dict[str, Any]]:
    """The index's headlines (:mod:`dsparklab.report.headlines`), each with its figure."""
    from dsparklab.report.headlines import headlines

    def one_label(frame: pd.DataFrame) -> pd.DataFrame:  # several run sets: name them
        if len(frame) and frame["run_set"].nunique() > 1:
            return frame.assign(dataset=frame["run_set"] + ": " + frame["dataset"])
        return frame

    made = headlines(
        best=findings.best_frame,
        attribution=findings.attribution_frame,
        by_position=one_label(by_position),
        answer=findings.answer,
        notes=findings.notes,
        binned={k: one_label(v) for k, v in findings.binned_lengths.items()},
    )
    figure = {
        "Did speculation pay, and where did the time go?": "speedup_by_window",
        "Which n?": "speedup_by_window",
        "Where does the drafter lose its tokens?": "survival_vs_published",
        "The seeds' question": "speedup_by_window",
    }
    return [{**h, "figure": figure.get(h["title"])} for h in made]


def _acceptance_rows(lengths: pd.DataFrame, by_position: pd.DataFrame) -> list[dict[str, Any]]:
    """One row per (run set, dataset, method, n): AL with its interval and definition, and
    the survival s_i by position."""
    keys = ["run_set", "dataset", "method", "n"]
    survival = (
        by_position.sort_values([*keys, "position"])
        .groupby(keys, sort=True)["survival"]
        .agg(lambda s: " ".join(f"{v:.2f}" for v in s))
    )
    rows = []
    for row in lengths.sort_values(keys).to_dict("records"):
        key = tuple(row[k] for k in keys)
        rows.append(
            {
                "run set": row["run_set"],
                "dataset": row["dataset"],
                "method": row["method"],
                "n": int(row["n"]),
                "AL": _interval(row["accept_len"], row["accept_len_lo"], row["accept_len_hi"]),
                "AL definition": row.get("definition", ""),
                "survival by position": survival.get(key, ""),
            }
        )
    return rows


def _window_findings(
    findings: Findings,
    lengths: pd.DataFrame,
    catalog: Catalog,
    n_boot: int,
    figures_dir: Path,
) -> None:
    """AL(n) per (run set, dataset, method) with two windows or more; speedup(n), the
    seeds' answer and the model's error where baselines and step timings exist."""
    from dsparklab.analysis import compute_best_n, compute_speedup_model, compute_window_scaling
    from dsparklab.analysis.findings import seeds_answer, speedup_trend
    from dsparklab.errors import MissingInputError
    from dsparklab.lab.runs import count_runs, token_runs

    keys = ["run_set", "dataset", "method"]
    windows = lengths.groupby(keys)["n"].transform("nunique")
    several = lengths[windows > 1]
    if several.empty:
        findings.notes.append(
            "window scaling: every (run set, dataset, method) holds one window only; "
            "collect a second n to see AL(n)"
        )
    wide: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in several.sort_values([*keys, "n"]).to_dict("records"):
        cell = wide.setdefault(
            (row["run_set"], row["dataset"], row["method"]),
            {"run set": row["run_set"], "dataset": row["dataset"], "method": row["method"]},
        )
        cell[f"AL({int(row['n'])})"] = _interval(
            row["accept_len"], row["accept_len_lo"], row["accept_len_hi"]
        )
    scalings, load_scalings, models = [], [], []
    for root in catalog.roots:
        try:
            token = token_runs(catalog.only(root))
        except MissingInputError:
            continue
        # per prompt: the attribution pairs prompts
        steps = count_runs(catalog, token, "step_times", by=("prompt_id",))
        steps = _label(steps, run_set_labels(token))
        for run_set, part in steps.groupby("run_set", sort=True):
            if (part["method"] != "none").sum() == 0:
                continue
            try:
                models.append(
                    compute_speedup_model(part, by=("run_set", "method", "dataset"), n_boot=0)
                )
            except MissingInputError as err:
                findings.notes.append(f"{run_set}: speedup not measured: {err}")
                continue
            # per load (each run against the baseline at its own load); pooled over loads
            # for the window table only where the run set holds several
            by_load = compute_window_scaling(
                part, by=("run_set", "method", "dataset", "concurrency"), n_boot=n_boot
            )
            load_scalings.append(by_load)
            scalings.append(
                compute_window_scaling(part, by=("run_set", "method", "dataset"), n_boot=n_boot)
                if by_load["concurrency"].nunique() > 1
                else by_load.drop(columns="concurrency")
            )
            rows, parts = _window_attribution(part, n_boot)
            findings.attribution += rows
            findings.attribution_frame = pd.concat(
                [findings.attribution_frame, parts], ignore_index=True
            )
    ns = sorted({int(n) for n in several["n"]})
    if scalings:
        scaling = pd.concat(scalings, ignore_index=True)
        scaling = scaling[scaling["method"] != "none"]
        for row in scaling.sort_values([*keys, "n"]).to_dict("records"):
            cell = wide.setdefault(
                (row["run_set"], row["dataset"], row["method"]),
                {"run set": row["run_set"], "dataset": row["dataset"], "method": row["method"]},
            )
            cell[f"speedup({int(row['n'])})"] = _interval(
                row["speedup"], row["speedup_lo"], row["speedup_hi"], "x"
            )
        ns = sorted({*ns, *(int(n) for n in scaling["n"])})
        # the best n at each load: where the runs hold one load, its column says nothing
        by_load = pd.concat(load_scalings, ignore_index=True)
        by_load = by_load[by_load["method"] != "none"]
        best = compute_best_n(by_load, by=("run_set", "dataset", "method", "concurrency"))
        if best["concurrency"].nunique() == 1:
            best = best.drop(columns="concurrency")
        findings.best_frame = best
        findings.best_n = [
            {
                "run set": r["run_set"],
                "dataset": r["dataset"],
                "method": r["method"],
                **({"concurrency": r["concurrency"]} if "concurrency" in r else {}),
                "best n": r["best_n"],
                "speedup": _interval(r["speedup"], r["speedup_lo"], r["speedup_hi"], "x"),
                "cannot be told apart": r["indistinguishable"],
            }
            for r in findings.best_frame.to_dict("records")
        ]
        labelled = scaling.assign(dataset=scaling["run_set"] + ": " + scaling["dataset"])
        from dsparklab.lab.display import save_figure
        from dsparklab.plots import plot_window_scaling

        figure = plot_window_scaling(
            labelled, title="Measured speedup over target-only decoding as n grows"
        )
        save_figure(figure, "speedup_by_window", out_dir=figures_dir)
        findings.answer = seeds_answer(speedup_trend(labelled)).to_dict("records")
        model = pd.concat(models, ignore_index=True)
        gap = (model["speedup_model"] - model["speedup"]).abs()
        findings.model_error = {
            "max_abs_gap": float(gap.max()),
            "max_relative_error": float(model["model_error"].abs().max()),
        }
    if not findings.answer:
        findings.notes.append(
            "the seeds' question (does DSpark's speedup rise from the smallest to the largest "
            "window while Eagle3's does not?) needs both methods' speedups at two windows "
            "on one dataset; these runs do not hold them"
        )
    findings.window_table = list(wide.values())
    columns = {c for row in wide.values() for c in row}
    findings.window_columns = [
        "run set",
        "dataset",
        "method",
        *[f"AL({n})" for n in ns if f"AL({n})" in columns],
        *[f"speedup({n})" for n in ns if f"speedup({n})" in columns],
    ]


def _window_attribution(
    steps: pd.DataFrame, n_boot: int
) -> tuple[list[dict[str, Any]], pd.DataFrame]:
    """Per method and dataset of one run set: where the speedup went from the smallest to
    the largest window (:func:`dsparklab.analysis.compute_window_attribution`): the table's
    rows and the attribution itself."""
    from dsparklab.analysis import compute_window_attribution
    from dsparklab.errors import MissingInputError

    try:
        parts = compute_window_attribution(steps, n_boot=n_boot)
    except MissingInputError:
        return [], pd.DataFrame()
    # the frame is joined over run sets: each row says its own
    parts = parts.assign(run_set=str(steps["run_set"].iloc[0]))
    rows = []
    for (method, dataset), part in parts.groupby(["method", "dataset"], sort=True):
        by_part = part.set_index("component")
        first = part.iloc[0]
        row = {
            "run set": str(steps["run_set"].iloc[0]),
            "dataset": dataset,
            "method": method,
            "windows": f"{first['low_n']} → {first['high_n']}",
            "speedup": f"{first['base_speedup']:.2f}x → {first['new_speedup']:.2f}x",
            "Δ log S": f"{first['total']:+.3f}",
        }
        for component, values in by_part.iterrows():
            row[str(component)] = _interval(values["delta_log_speedup"], values["lo"], values["hi"])
        rows.append(row)
    return rows, parts
