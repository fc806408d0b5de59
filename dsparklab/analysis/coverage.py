"""What each run can show: every analysis the lab draws, and for each run whether its
tables allow it, or the one line saying what it lacks (:func:`compute_coverage`)."""

from __future__ import annotations

import pandas as pd

from dsparklab.analysis._frames import require_columns
from dsparklab.errors import DSparkLabError

ANALYSES: dict[str, str] = {
    "acceptance_by_position": "a_i and s_i per position (heatmaps, survival curves)",
    "acceptance_intervals": "bootstrap intervals over requests",
    "acceptance_length": "AL (window-scaling curve)",
    "acceptance_over_time": "acceptance per scrape interval",
    "speedup": "measured speedup vs the target-only run (needs step timings)",
    "calibration": "confidence-head ECE / Brier / AUROC / reliability",
    "markov_attribution": "Markov bias attribution (DSpark drafted tokens)",
    "token_classes": "acceptance by token class, request strips, worst prompts",
}


def compute_coverage(
    runs: pd.DataFrame,
    *,
    counters: pd.DataFrame | None = None,
    calibration: pd.DataFrame | None = None,
    steps: pd.DataFrame | None = None,
    positions: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """What each run can and cannot show, and why.

    Parameters
    ----------
    runs
        ``dsparklab.store.list_runs`` (``run_id``, ``method``, ``granularity``).
    counters, calibration
        The runs' counters and calibration tables, when loaded (to tell counts from rates
        and reported calibration from none).
    steps, positions
        The runs' steps and positions, when loaded: then speedup, calibration and Markov
        attribution are judged by which columns the run filled (a step without a verify
        time, a run without confidence scores), not by its method or granularity.

    Returns
    -------
    pandas.DataFrame
        One row per run and analysis (:data:`ANALYSES`): ``run_id``, ``granularity``,
        ``analysis``, ``available`` (bool) and ``reason`` (plain words; empty when
        available).
    """
    require_columns(runs, ("run_id", "method", "granularity"), what="compute_coverage")
    rates_only: set[str] = set()
    per_request: set[str] = set()
    if counters is not None and len(counters) and "run_id" in counters:
        by_run = counters.groupby("run_id")["n_accepted"].agg(lambda s: s.isna().all())
        rates_only = set(by_run[by_run].index)
        counted = counters[(counters["scope"] == "request") & counters["n_accepted"].notna()]
        per_request = set(counted["run_id"])
    reported_cal: set[str] = set()
    if calibration is not None and len(calibration) and "run_id" in calibration:
        reported_cal = set(calibration["run_id"])
    filled = _filled_columns(steps, positions)
    given = {
        name for name, frame in (("steps", steps), ("positions", positions)) if frame is not None
    }
    rows = []
    for run in runs.itertuples(index=False):
        run_id, method, granularity = str(run.run_id), str(run.method), str(run.granularity)
        for analysis in ANALYSES:
            available, reason = _available(
                analysis,
                method,
                granularity,
                rates_only=run_id in rates_only,
                reported_cal=run_id in reported_cal,
                per_request=granularity in ("token", "step") or run_id in per_request,
            )
            missing = _missing_column(analysis, filled.get(run_id), given)
            if available and missing:
                available, reason = False, missing
            rows.append(
                {
                    "run_id": run_id,
                    "method": method,
                    "granularity": granularity,
                    "analysis": analysis,
                    "available": available,
                    "reason": reason,
                }
            )
    return pd.DataFrame(
        rows, columns=["run_id", "method", "granularity", "analysis", "available", "reason"]
    )


# analysis -> the (table, column)s a run must fill for it, when its rows are loaded; a
# speedup divides tokens (``emitted``: a server's taps leave it null, the collector fills
# it from the responses) by time
NEEDED_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "speedup": (("steps", "verify_time_s"), ("steps", "emitted")),
    "calibration": (("positions", "confidence"),),
    "markov_attribution": (("positions", "markov_flip"),),
}


def _filled_columns(
    steps: pd.DataFrame | None, positions: pd.DataFrame | None
) -> dict[str, set[tuple[str, str]]]:
    """run_id -> the (table, column) of :data:`NEEDED_COLUMNS` that hold a value."""
    filled: dict[str, set[tuple[str, str]]] = {}
    for table, frame in (("steps", steps), ("positions", positions)):
        if frame is None or frame.empty or "run_id" not in frame:
            continue
        for name, column in (need for needs in NEEDED_COLUMNS.values() for need in needs):
            if name != table or column not in frame:
                continue
            for run_id in frame.loc[frame[column].notna(), "run_id"].unique():
                filled.setdefault(str(run_id), set()).add((table, column))
            for run_id in frame["run_id"].unique():
                filled.setdefault(str(run_id), set())
    return filled


def _missing_column(analysis: str, filled: set[tuple[str, str]] | None, given: set[str]) -> str:
    """Why a loaded run cannot give ``analysis``: the first column it left empty ('' if
    none, or if the table was not passed)."""
    if filled is None:
        return ""
    for need in NEEDED_COLUMNS.get(analysis, ()):
        if need not in filled and need[0] in given:
            return f"its {need[0]} carry no {need[1]}"
    return ""


def _available(
    analysis: str,
    method: str,
    granularity: str,
    *,
    rates_only: bool,
    reported_cal: bool,
    per_request: bool,
) -> tuple[bool, str]:
    token = granularity == "token"
    if method == "none":
        if analysis == "speedup":
            return True, ""
        return False, "target-only baseline: nothing drafted"
    if analysis == "acceptance_by_position":
        return True, "" if not rates_only else "reported rates only (no counts)"
    if analysis == "acceptance_length":
        return True, ""
    if analysis == "acceptance_intervals":
        if per_request and not rates_only:
            return True, ""
        return False, f"{granularity} run: no per-request counts to resample"
    if analysis == "acceptance_over_time":
        if granularity == "interval":
            return True, ""
        return False, "not a live (interval) run"
    if analysis == "speedup":
        if token:
            return True, ""
        return False, f"{granularity} run: no per-step draft / verify timings"
    if analysis == "calibration":
        if token and method == "dspark":
            return True, ""
        if reported_cal:
            return True, "as reported by the source (per position; no rows to recompute)"
        if token:
            return False, f"{method} has no confidence head"
        return False, f"{granularity} run: no confidence scores"
    if analysis == "markov_attribution":
        if token and method == "dspark":
            return True, ""
        return False, (
            f"{granularity} run: no drafted tokens" if not token else f"{method} has no Markov head"
        )
    if analysis == "token_classes":
        if token:
            return True, ""
        return False, f"{granularity} run: no drafted or target tokens"
    raise DSparkLabError(f"unknown analysis {analysis!r}; expected one of {list(ANALYSES)}")


__all__ = ["ANALYSES", "compute_coverage"]
