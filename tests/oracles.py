"""The in-memory counters, kept as test oracles for the SQL counters.

The library counts with one set of SQL texts (``dsparklab.analysis.sql``), over a store or
over frames in memory. These numpy counters compute the same tables by a different route
(per-row ``reached`` from ``annotate_positions``, key codes and ``bincount``), so a test
that finds both equal checks the SQL against an independent implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import (
    NO_CONFIDENCE,
    UNIT_COLUMNS,
    as_columns,
    factorize,
    require_columns,
    require_values,
    tidy,
)
from dsparklab.analysis._kernels import group_sums, score_bins, score_levels
from dsparklab.analysis.layouts import (
    ACCEPTANCE_COUNTERS,
    DEFAULT_LEVELS,
    MATCH_COLUMNS,
    match_columns,
)
from dsparklab.analysis.prepare import annotate_positions
from dsparklab.errors import DSparkLabError, UnknownMethodError


def count_acceptance(
    positions: pd.DataFrame,
    *,
    steps: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("run_id",),
    per_request: bool = True,
) -> pd.DataFrame:
    """Acceptance counters per group, (request,) and position.

    Parameters
    ----------
    positions
        Rows of the positions table (see :func:`annotate_positions`).
    steps
        The steps table, for ``prompt_id`` grouping and adaptive verification.
    by
        Grouping columns: any run column (run_id, method, n, dataset, ...), ``prompt_id``
        (needs ``steps``) or ``request_id``.
    per_request
        Keep one row per request (``run_id``, ``request_id``) so that bootstrap intervals
        over requests can be drawn from the counts.

    Returns
    -------
    pandas.DataFrame
        ``by`` [+ run_id, request_id] + ``position`` and the counters ``n_drafted`` (rows),
        ``n_reached`` (rows whose earlier positions were all accepted) and ``n_accepted``.
        Counts of disjoint row sets add up: concatenate and sum to merge runs.
    """
    by = as_columns(by)
    frame = annotate_positions(positions, steps=steps)
    keys = [*by]
    if per_request:
        keys += [c for c in UNIT_COLUMNS if c not in keys]
    keys.append("position")
    require_columns(frame, keys, what="count_acceptance")
    codes, sizes, uniques = factorize(frame, keys)
    cells, columns = acceptance_cells(
        codes, sizes, frame["reached"].to_numpy(dtype=bool), frame["accepted"].to_numpy(bool)
    )
    return tidy(keys, cells, uniques, columns)


def acceptance_cells(
    codes: list[np.ndarray], sizes: list[int], reached: np.ndarray, accepted: np.ndarray
) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Acceptance counters per key cell from per-row ``reached``/``accepted`` ``[N]``."""
    cells, count, sums = group_sums(
        codes, sizes, {"n_reached": reached, "n_accepted": accepted & reached}
    )
    return cells, {
        "n_drafted": count.astype(np.int64),
        "n_reached": sums["n_reached"].astype(np.int64),
        "n_accepted": sums["n_accepted"].astype(np.int64),
    }


def count_acceptance_from_steps(
    steps: pd.DataFrame,
    *,
    by: str | Iterable[str] = ("run_id",),
    per_request: bool = True,
) -> pd.DataFrame:
    """The acceptance counters of :func:`count_acceptance`, from the steps table alone.

    Parameters
    ----------
    steps
        Rows of the steps table (``num_drafted``, ``num_verified``, ``accepted_len``).
    by, per_request
        As in :func:`count_acceptance`; ``prompt_id`` needs no join here.

    Returns
    -------
    pandas.DataFrame
        The same table :func:`count_acceptance` returns for the positions of these steps.

    Notes
    -----
    For a step with :math:`D` drafted, :math:`V` verified and :math:`A` accepted
    positions, acceptance is prefix-closed, so position :math:`i` was drafted iff
    :math:`i < D`, accepted iff :math:`i < A`, and reached iff :math:`i \\le A` and
    :math:`i < \\min(V, D)`:

    .. math::

        \\mathrm{drafted}_i = \\#\\{D > i\\}, \\qquad
        R_i = \\#\\{A \\ge i \\wedge \\min(V, D) > i\\}, \\qquad
        A_i = \\#\\{A > i\\}

    This equals the per-row count on any trace that passes ``dsparklab validate``
    (accepted_len equals the step's accepted rows, acceptance prefix-closed, positions
    ``0..D-1``); it reads a fifth of the rows and needs no (request, step) join, which is
    why :func:`aggregate_store` uses it for acceptance.
    """
    by = as_columns(by)
    keys = [*by]
    if per_request:
        keys += [c for c in UNIT_COLUMNS if c not in keys]
    require_columns(
        steps, [*keys, "num_drafted", "num_verified", "accepted_len"], what="count_acceptance"
    )
    codes, sizes, uniques = factorize(steps, keys)
    cells, columns = step_acceptance_cells(
        codes,
        sizes,
        steps["num_drafted"].to_numpy(dtype=np.int64),
        steps["num_verified"].to_numpy(dtype=np.int64),
        steps["accepted_len"].to_numpy(dtype=np.int64),
    )
    positions = np.arange(int(cells[-1].max()) + 1 if len(cells[-1]) else 0)  # codes = values
    return tidy([*keys, "position"], cells, [*uniques, positions], columns)


def step_acceptance_cells(
    codes: list[np.ndarray],
    sizes: list[int],
    drafted: np.ndarray,
    verified: np.ndarray,
    accepted_len: np.ndarray,
) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Acceptance counters per key cell and position from per-step ``D, V, A`` ``[S]``.

    Returns the key codes of each non-empty (key..., position) cell (the last array is the
    position) and the counter columns. See :func:`count_acceptance_from_steps`.
    """
    limit = np.minimum(verified, drafted)  # [S] positions put to the target
    accepted_len = np.minimum(accepted_len, limit)  # a valid trace never clips
    n_max = int(drafted.max()) if len(drafted) else 0
    if n_max <= 0:
        empty = np.zeros(0, dtype=np.int64)
        return [empty for _ in range(len(codes) + 1)], {name: empty for name in ACCEPTANCE_COUNTERS}
    # histogram of (key, D, L, A): few distinct cells, then spread over positions
    side = n_max + 1
    hist, count, _ = group_sums(
        [*codes, drafted, limit, accepted_len], [*sizes, side, side, side], {}
    )
    d, lim, acc = hist[-3], hist[-2], hist[-1]
    pos = np.arange(n_max)  # [P]
    n_drafted = (d[:, None] > pos) * count[:, None]  # [C, P]
    n_reached = ((acc[:, None] >= pos) & (lim[:, None] > pos)) * count[:, None]  # [C, P]
    n_accepted = (acc[:, None] > pos) * count[:, None]  # [C, P]
    keep = n_drafted > 0  # [C, P]
    spread = [np.broadcast_to(c[:, None], keep.shape)[keep] for c in hist[: len(codes)]]
    position = np.broadcast_to(pos, keep.shape)[keep]
    cells, _, sums = group_sums(
        [*spread, position],
        [*sizes, n_max],
        {
            "n_drafted": n_drafted[keep],
            "n_reached": n_reached[keep],
            "n_accepted": n_accepted[keep],
        },
    )
    return cells, {name: sums[name].astype(np.int64) for name in ACCEPTANCE_COUNTERS}


def _confidence_rows(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    score = frame["confidence"].to_numpy(dtype=np.float64, na_value=np.nan)
    return score, frame["reached"].to_numpy(dtype=bool) & ~np.isnan(score)


def _calibrated_rows(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    score = frame["confidence_calibrated"].to_numpy(dtype=np.float64, na_value=np.nan)
    return score, frame["reached"].to_numpy(dtype=bool) & ~np.isnan(score)


def _prefix_rows(frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    score = frame["prefix_confidence"].to_numpy(dtype=np.float64)
    keep = ~np.isnan(score)
    if "num_verified" in frame.columns:
        keep &= frame["position"].to_numpy() < frame["num_verified"].to_numpy(
            dtype=np.float64, na_value=np.inf
        )
    return score, keep


# score name -> (score [N], rows kept [N]) from annotated positions
SCORES: dict[str, Callable[[pd.DataFrame], tuple[np.ndarray, np.ndarray]]] = {
    "confidence": _confidence_rows,
    "confidence_calibrated": _calibrated_rows,
    "prefix_confidence": _prefix_rows,
}


def score_rows(name: str) -> Callable[[pd.DataFrame], tuple[np.ndarray, np.ndarray]]:
    """The function giving score ``name``'s (score, label) arrays of a position frame."""
    try:
        return SCORES[name]
    except KeyError:
        raise UnknownMethodError(
            f"unknown calibration score {name!r}; valid scores are {sorted(SCORES)}"
        ) from None


def count_calibration(
    positions: pd.DataFrame,
    *,
    steps: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("run_id",),
    scores: Iterable[str] = ("confidence", "prefix_confidence"),
    n_bins: int = 10,
    levels: int | None = DEFAULT_LEVELS,
) -> pd.DataFrame:
    """Calibration counters per group, score, position, bin, level and label.

    Parameters
    ----------
    positions
        The positions table (rows with a null confidence, e.g. Eagle3's, are skipped).
    steps
        The steps table (``prompt_id`` grouping; adaptive verification).
    by
        Grouping columns.
    scores
        Which scores to count: ``"confidence"``, ``"prefix_confidence"``.
    n_bins
        Equal-width bins on [0, 1] for ECE and reliability.
    levels
        The level grid AUROC is counted on: :data:`DEFAULT_LEVELS` cells by default (ties
        within 1 / L, the default of every counter, SQL or not), None the exact score
        values (exact AUROC).

    Returns
    -------
    pandas.DataFrame
        ``by`` + ``score``, ``position``, ``bin``, ``bin_lo``, ``bin_hi``, ``level``
        (the score value or grid cell's lower edge), ``accepted`` and the counters
        ``count``, ``sum_score``, ``sum_score_sq``. Tables with the same ``n_bins`` and
        ``levels`` merge by concatenating and summing.
    """
    by = as_columns(by)
    frame = annotate_positions(positions, steps=steps)
    require_columns(frame, [*by, "confidence"], what="count_calibration")
    require_values(frame, "confidence", what="calibration", why=NO_CONFIDENCE)
    pieces = []
    for name in scores:
        score, keep = score_rows(name)(frame)
        part = frame.loc[keep, [*by, "position", "accepted"]]
        pieces.append(_count_scores(part, by, name, score[keep], n_bins, levels))
    return pd.concat(pieces, ignore_index=True)


def count_step_times(
    steps: pd.DataFrame,
    *,
    by: str | Iterable[str] = ("method", "dataset"),
    match: Iterable[str] = MATCH_COLUMNS,
    per_request: bool = True,
) -> pd.DataFrame:
    """Step-time counters per group, window, baseline-match key (and request).

    Parameters
    ----------
    steps
        The steps table of method runs and baseline runs.
    by
        Grouping columns; ``method`` and ``n`` are always kept.
    match
        Run columns that pair a method run with its baseline run.
    per_request
        Keep one row per request (for bootstrap intervals).

    Returns
    -------
    pandas.DataFrame
        Keys plus ``n_steps``, ``sum_tokens`` (``emitted``: the output tokens the steps
        added, ``accepted_len + 1`` but where the output was cut),
        ``sum_time`` (``draft_time_s + verify_time_s + other_time_s``; a null draft or
        other time counts 0),
        ``sum_draft`` and ``sum_verify``; the time sums are NaN in a group holding a step
        without a verify time.
    """
    by = as_columns(by)
    keys = list(dict.fromkeys([*by, "method", "n", *match_columns(steps, match)]))
    if per_request:
        keys += [c for c in UNIT_COLUMNS if c not in keys]
    require_columns(steps, [*keys, "emitted", "verify_time_s"], what="count_step_times")
    frame = steps
    # a step without a verify time (a vLLM run records the draft time only) makes its
    # group's time sums NaN: tokens per step still count, speedup cannot
    verify = frame["verify_time_s"].to_numpy(dtype=np.float64, na_value=np.nan)
    draft = (
        frame["draft_time_s"].to_numpy(dtype=np.float64, na_value=np.nan)
        if "draft_time_s" in frame
        else np.zeros(len(frame))
    )
    draft = np.where(np.isnan(verify), np.nan, np.nan_to_num(draft, nan=0.0))
    other = (
        np.nan_to_num(frame["other_time_s"].to_numpy(dtype=np.float64, na_value=np.nan), nan=0.0)
        if "other_time_s" in frame
        else np.zeros(len(frame))
    )
    codes, sizes, uniques = factorize(frame, keys)
    cells, count, s = group_sums(
        codes,
        sizes,
        {
            # what the steps added to the output (a null emitted makes the group's NaN)
            "sum_tokens": frame["emitted"].to_numpy(dtype=np.float64, na_value=np.nan),
            "sum_time": draft + verify + other,
            "sum_draft": draft,
            "sum_verify": verify,
        },
    )
    return tidy(keys, cells, uniques, {"n_steps": count.astype(np.int64), **s})


def calibration_cells(
    score: np.ndarray, n_bins: int, levels: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bin codes ``[N]``, level codes ``[N]`` and level values ``[L]`` of scores."""
    if n_bins < 1:
        raise DSparkLabError(f"n_bins must be >= 1, got {n_bins}")
    if levels is not None and levels < 1:
        raise DSparkLabError(f"levels must be >= 1 or None (exact), got {levels}")
    bins = score_bins(score, n_bins)
    level, level_values = score_levels(score, levels)
    return bins, level, level_values


def score_cells(
    codes: list[np.ndarray],
    sizes: list[int],
    score: np.ndarray,
    label: np.ndarray,
    n_bins: int,
    levels: int | None,
) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
    """Calibration counters of ``score`` ``[N]`` vs ``label`` ``[N]`` per key cell.

    ``codes``/``sizes`` are the key columns (e.g. group and position). Returns the key
    codes of each non-empty cell and the bin, level, label and counter columns.
    """
    bins, level, level_values = calibration_cells(score, n_bins, levels)
    cells, count, sums = group_sums(
        [*codes, bins, level, np.asarray(label, dtype=np.int64)],
        [*sizes, n_bins, len(level_values), 2],
        {"sum_score": score, "sum_score_sq": score * score},
    )
    return cells[: len(codes)], {
        "bin": cells[-3],
        "bin_lo": cells[-3] / n_bins,
        "bin_hi": (cells[-3] + 1) / n_bins,
        "level": level_values[cells[-2]],
        "accepted": cells[-1].astype(bool),
        "count": count.astype(np.int64),
        "sum_score": sums["sum_score"],
        "sum_score_sq": sums["sum_score_sq"],
    }


def _count_scores(
    part: pd.DataFrame,
    by: tuple[str, ...],
    name: str,
    score: np.ndarray,
    n_bins: int,
    levels: int | None,
) -> pd.DataFrame:
    codes, sizes, uniques = factorize(part, [*by, "position"])
    label = part["accepted"].to_numpy(dtype=bool)
    cells, columns = score_cells(codes, sizes, score, label, n_bins, levels)
    keys = tidy([*by, "position"], cells, uniques, {})
    return format_calibration_counts(keys, by, name, columns)


def format_calibration_counts(
    keys: pd.DataFrame, by: tuple[str, ...], name: str, columns: dict[str, np.ndarray]
) -> pd.DataFrame:
    """Counter table in column order ``by``, score, position, bin..., counters."""
    out = keys[list(by)].assign(score=np.full(len(keys), name, dtype=object))
    out["position"] = keys["position"].to_numpy()
    return out.assign(**columns)
