"""Calibration of the confidence head: ECE, Brier, AUROC, reliability bins, temperature.

Two scores are judged (docs/acceptance-definitions.md, "Calibration scores"):

- ``"confidence"``: the head's output :math:`c_i` at a *reached* position against
  whether that position was accepted, i.e. :math:`P(\\mathrm{accepted}_i \\mid
  \\mathrm{reached}_i)`;
- ``"prefix_confidence"``: :math:`\\prod_{j \\le i} c_j` at every drafted (verified)
  position against whether it was accepted, i.e. the survival probability.

Every metric is finished from one counter table (``aggregate_store(metric="calibration")``
over a store, :func:`~dsparklab.analysis.sql.count_frames` over frames): row counts
and score sums per (group, score, position, equal-width bin, score level, label). The
level is a cell of an ``L``-cell grid (``levels=L``, :data:`DEFAULT_LEVELS` = 1000 by
default, in memory and in SQL alike) or, with ``levels=None``, the exact score value;
AUROC treats scores within one level as ties, so on a grid it is exact up to pairs in the
same cell, and the temperature is fitted on each level's mean score.

Runs imported from a source that computed its own calibration hold only its bins:
:mod:`dsparklab.analysis.reported_reliability` reads those.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import (
    as_columns,
    combined_codes,
    group_key_frame,
    require_columns,
    split_by_code,
)
from dsparklab.analysis._kernels import group_sums, score_bins
from dsparklab.analysis.layouts import DEFAULT_LEVELS
from dsparklab.analysis.sql.counting import count_frames
from dsparklab.errors import UnknownMethodError

# The scores a calibration table can judge: the SQL counter's, and the head's score after
# per-position temperatures (calibrate_confidence), judged on the rows ``confidence`` is.
CALIBRATED = "confidence_calibrated"
CALIBRATION_SCORES = ("confidence", CALIBRATED, "prefix_confidence")
CLIP = 1e-6  # scores are clipped to [CLIP, 1 - CLIP] before a logit


def calibrate_confidence(
    positions: pd.DataFrame, temperatures: dict[str, list[float]]
) -> pd.DataFrame:
    """Add ``confidence_calibrated``: the head's score after per-position temperatures.

    Parameters
    ----------
    positions
        The positions table (``run_id``, ``position``, ``confidence``).
    temperatures
        run_id -> :math:`T_i` per position (the drafter's ``calibration.json``, recorded
        in run.json as ``drafter.confidence_temperatures``); runs not in it get NaN.

    Notes
    -----
    .. math:: \\hat c_i = \\sigma\\big(\\operatorname{logit}(c_i) / T_i\\big)

    with :math:`c_i` clipped to :math:`[10^{-6}, 1 - 10^{-6}]` first; positions beyond the
    fitted ones keep the last temperature.
    """
    require_columns(positions, ["run_id", "position", "confidence"], what="calibrate_confidence")
    out = positions.copy()
    calibrated = np.full(len(out), np.nan)
    conf = np.clip(out["confidence"].to_numpy(np.float64, na_value=np.nan), CLIP, 1 - CLIP)
    run_ids = out["run_id"].to_numpy()
    pos = out["position"].to_numpy()
    for run_id, temps in temperatures.items():
        mine = run_ids == run_id
        t = np.asarray(temps, dtype=np.float64)[np.minimum(pos[mine], len(temps) - 1)]
        logit = np.log(conf[mine]) - np.log1p(-conf[mine])
        calibrated[mine] = 1.0 / (1.0 + np.exp(-logit / t))
    out["confidence_calibrated"] = calibrated
    return out


def _is_counts(frame: pd.DataFrame) -> bool:
    return {"count", "sum_score", "level", "bin"} <= set(frame.columns)


def check_scores(scores: Iterable[str]) -> list[str]:
    """``scores`` as a list, each one of :data:`CALIBRATION_SCORES` (else one error)."""
    wanted = list(scores)
    for name in wanted:
        if name not in CALIBRATION_SCORES:
            raise UnknownMethodError(
                f"unknown calibration score {name!r}; valid scores are {list(CALIBRATION_SCORES)}"
            )
    return wanted


def _counts_for(
    data: pd.DataFrame,
    steps: pd.DataFrame | None,
    by: tuple[str, ...],
    scores: Iterable[str],
    n_bins: int,
    levels: int | None,
) -> pd.DataFrame:
    """The calibration counts of ``data``: itself when it is a counter table, else its
    rows counted by the SQL counter (``confidence_calibrated`` counted as the confidence of
    rows whose confidence it replaces)."""
    wanted = check_scores(scores)
    if _is_counts(data):
        require_columns(data, [*by, "score", "position", "accepted"], what="calibration")
        return data[data["score"].isin(wanted)]
    pieces = []
    for name in wanted:
        rows = data
        if name == CALIBRATED:
            require_columns(data, [CALIBRATED], what="calibration")
            rows = data.assign(confidence=data[CALIBRATED])
        counted = count_frames(
            "calibration",
            positions=rows,
            steps=steps,
            by=by,
            per_request=False,
            scores=("confidence" if name == CALIBRATED else name,),
            n_bins=n_bins,
            levels=levels,
        )
        pieces.append(counted.assign(score=name))
    return pd.concat(pieces, ignore_index=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return np.exp(-np.logaddexp(0.0, -x))


def _fit_inverse_temperature(logit: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> float:
    """beta minimising the weighted NLL of sigmoid(beta * logit), by bisection.

    The NLL is convex in beta, so its derivative ``sum z (n sigmoid(beta z) - pos)`` is
    increasing; the root is bracketed in [0, 1e4]. NaN when the minimum is at beta <= 0
    (scores that do not rank the labels) or beyond the bracket (separable labels).
    """
    total = pos + neg

    def grad(beta: float) -> float:
        return float(np.sum(logit * (total * _sigmoid(beta * logit) - pos)))

    if pos.sum() == 0 or neg.sum() == 0 or grad(0.0) >= 0:
        return np.nan
    high = 1.0
    while grad(high) < 0:
        high *= 2.0
        if high > 1e4:
            return np.nan
    low = 0.0
    for _ in range(80):
        mid = 0.5 * (low + high)
        if grad(mid) < 0:
            low = mid
        else:
            high = mid
    return 0.5 * (low + high)


def _finish(counts: pd.DataFrame, keys: list[str]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Summary per group of ``keys`` and reliability bins; the calibration formulas."""
    counts = counts.reset_index(drop=True)
    group, n_groups = combined_codes(counts, keys)
    label = counts["accepted"].to_numpy(dtype=bool)
    count = counts["count"].to_numpy(dtype=np.float64)
    sum_score = counts["sum_score"].to_numpy(dtype=np.float64)
    sum_sq = counts["sum_score_sq"].to_numpy(dtype=np.float64)
    n_pos = np.bincount(group, weights=count * label, minlength=n_groups)  # [G]
    n_all = np.bincount(group, weights=count, minlength=n_groups)  # [G]
    n_neg = n_all - n_pos
    # Brier: sum (s - y)^2 = sum s^2 - 2 y s + y
    brier_sum = np.bincount(
        group, weights=sum_sq - 2 * label * sum_score + label * count, minlength=n_groups
    )
    # reliability bins: counts per (group, bin)
    bin_code = counts["bin"].to_numpy(dtype=np.int64)
    n_bins = _n_bins(counts)
    cells, _, b_sums = group_sums(
        [group, bin_code],
        [n_groups, n_bins],
        {"count": count, "pos": count * label, "score": sum_score},
    )
    b_group, b_bin = cells
    ece = binned_ece(b_group, n_groups, b_sums["count"], b_sums["score"], b_sums["pos"])
    # AUROC from levels: pairs (positive, negative) ordered by score, ties count 1/2
    level_code, level_values = pd.factorize(counts["level"], sort=True)
    cells, _, l_sums = group_sums(
        [group, level_code],
        [n_groups, len(level_values)],
        {"pos": count * label, "neg": count * ~label, "score": sum_score, "n": count},
    )
    l_group = cells[0]  # sorted by (group, level)
    neg_excl = np.cumsum(l_sums["neg"]) - l_sums["neg"]  # negatives before each level row
    start = np.searchsorted(l_group, np.arange(n_groups))  # first level row of each group
    neg_before = neg_excl - neg_excl[np.minimum(start, len(neg_excl) - 1)][l_group]
    auc_sum = np.bincount(
        l_group, weights=l_sums["pos"] * (neg_before + 0.5 * l_sums["neg"]), minlength=n_groups
    )
    with np.errstate(invalid="ignore", divide="ignore"):
        auroc = np.where((n_pos > 0) & (n_neg > 0), auc_sum / (n_pos * n_neg), np.nan)
        mean_score = np.bincount(group, weights=sum_score, minlength=n_groups) / n_all
        level_mean = l_sums["score"] / l_sums["n"]
    # temperature: sigmoid(logit(s) / T) fitted per group on the levels
    logit = np.log(np.clip(level_mean, CLIP, 1 - CLIP) / (1 - np.clip(level_mean, CLIP, 1 - CLIP)))
    temperature = np.full(n_groups, np.nan)
    ece_scaled = np.full(n_groups, np.nan)
    for g, rows in enumerate(split_by_code(l_group, n_groups)):
        beta = _fit_inverse_temperature(logit[rows], l_sums["pos"][rows], l_sums["neg"][rows])
        if not np.isfinite(beta) or beta <= 0:
            continue
        temperature[g] = 1.0 / beta
        scaled = _sigmoid(beta * logit[rows])  # [L_g]
        s_bin = score_bins(scaled, n_bins)
        gap = np.bincount(
            s_bin, weights=l_sums["pos"][rows] - l_sums["n"][rows] * scaled, minlength=n_bins
        )
        ece_scaled[g] = np.abs(gap).sum() / n_all[g]

    key_frame = group_key_frame(counts, keys, group, n_groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        summary = key_frame.assign(
            n_rows=n_all.astype(np.int64),  # not "n": that is the window size column
            n_accepted=n_pos.astype(np.int64),
            mean_score=mean_score,
            accept_rate=n_pos / n_all,
            ece=ece,
            brier=brier_sum / n_all,
            auroc=auroc,
            temperature=temperature,
            ece_calibrated=ece_scaled,
        )
    reliability = reliability_rows(
        key_frame.iloc[b_group],
        bins=b_bin,
        bin_lo=b_bin / n_bins,
        bin_hi=(b_bin + 1) / n_bins,
        count=b_sums["count"].astype(np.int64),
        sum_score=b_sums["score"],
        sum_accepted=b_sums["pos"],
    )
    return summary, reliability


def _n_bins(counts: pd.DataFrame) -> int:
    """The equal-width bins a counter table was made with (``1 / (bin_hi - bin_lo)``).

    Without edge columns, the highest bin seen + 1 (a lower bound: the top bins may be
    empty).
    """
    seen = int(counts["bin"].max()) + 1 if len(counts) else 1
    if {"bin_lo", "bin_hi"} <= set(counts.columns) and len(counts):
        width = float(counts["bin_hi"].iloc[0]) - float(counts["bin_lo"].iloc[0])
        if width > 0:
            return max(int(round(1.0 / width)), seen)
    return seen


def binned_ece(
    group: np.ndarray,
    n_groups: int,
    count: np.ndarray,
    sum_score: np.ndarray,
    sum_accepted: np.ndarray,
) -> np.ndarray:
    """ECE ``[G]`` of each group from its bins' sums (one entry per non-empty bin ``[B]``).

    Notes
    -----
    With bin weight :math:`w_b` (rows, or a source's reported weight), score sum
    :math:`S_b = w_b \\bar p_b` and accepted sum :math:`Y_b = w_b \\bar y_b`:

    .. math::

        \\mathrm{ECE} = \\frac{\\sum_b |Y_b - S_b|}{\\sum_b w_b}
          = \\frac{\\sum_b w_b\\,|\\bar p_b - \\bar y_b|}{\\sum_b w_b}

    (NaN for a group without weight).
    """
    gap = np.bincount(group, weights=np.abs(sum_accepted - sum_score), minlength=n_groups)
    total = np.bincount(group, weights=count, minlength=n_groups)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, gap / np.where(total > 0, total, 1.0), np.nan)


def reliability_rows(
    keys: pd.DataFrame,
    *,
    bins: np.ndarray,
    bin_lo: np.ndarray,
    bin_hi: np.ndarray,
    count: np.ndarray,
    sum_score: np.ndarray,
    sum_accepted: np.ndarray,
) -> pd.DataFrame:
    """The reliability table: ``keys`` (one row per bin) + ``bin`` (= ``bins``), ``bin_lo``,
    ``bin_hi``,
    ``count``, ``mean_score`` = sum_score / count, ``accept_rate`` = sum_accepted / count
    and ``gap`` = accept_rate - mean_score."""
    with np.errstate(invalid="ignore", divide="ignore"):
        out = keys.reset_index(drop=True).assign(
            bin=np.asarray(bins, dtype=np.int64),
            bin_lo=bin_lo,
            bin_hi=bin_hi,
            count=count,
            mean_score=sum_score / count,
            accept_rate=sum_accepted / count,
        )
    out["gap"] = out["accept_rate"] - out["mean_score"]
    return out


def calibration_keys(by: tuple[str, ...], per_position: bool) -> list[str]:
    """The key columns of a calibration table: the grouping, the score, the position."""
    return [*by, "score", *(["position"] if per_position else [])]


def compute_calibration(
    data: pd.DataFrame,
    *,
    steps: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("run_id",),
    scores: Iterable[str] = ("confidence", "prefix_confidence"),
    per_position: bool = True,
    n_bins: int = 10,
    levels: int | None = DEFAULT_LEVELS,
) -> pd.DataFrame:
    """ECE, Brier score, AUROC and a fitted temperature of the confidence head.

    Parameters
    ----------
    data
        The positions table (counted by :func:`dsparklab.analysis.count_frames`), or
        counts from :func:`dsparklab.analysis.aggregate_store` / ``count_frames``.
    steps, by, scores, n_bins, levels
        The steps table beside the positions (``prompt_id``; adaptive verification), the
        grouping columns, the scores (:data:`CALIBRATION_SCORES`), the equal-width bins
        and the AUROC level grid, as in ``count_frames`` (ignored, except ``by`` and
        ``scores``, for counts).
    per_position
        One row per position (True) or pooled over positions (False).

    Returns
    -------
    pandas.DataFrame
        One row per group, score (and position): ``n_rows``, ``n_accepted``, ``mean_score``,
        ``accept_rate``, ``ece``, ``brier``, ``auroc``, ``temperature`` and
        ``ece_calibrated`` (the ECE after dividing the logit by that temperature).

    Notes
    -----
    With scores :math:`p_k`, labels :math:`y_k \\in \\{0, 1\\}`, :math:`N` rows and
    equal-width bins :math:`B_b = [b/M, (b+1)/M)` (the last one closed):

    .. math::

        \\mathrm{ECE} = \\sum_b \\frac{|B_b|}{N}\\,
            \\bigl|\\bar y_{B_b} - \\bar p_{B_b}\\bigr|
          = \\frac{1}{N} \\sum_b \\Bigl|\\sum_{k \\in B_b} (y_k - p_k)\\Bigr|, \\qquad
        \\mathrm{Brier} = \\frac{1}{N} \\sum_k (p_k - y_k)^2

    .. math::

        \\mathrm{AUROC} = \\frac{1}{N_+ N_-} \\sum_{k: y_k = 1} \\sum_{l: y_l = 0}
            \\Bigl([p_k > p_l] + \\tfrac12 [p_k = p_l]\\Bigr)

    where :math:`p_k = p_l` means the same level: the same grid cell by default (scores
    within 1/L, :data:`DEFAULT_LEVELS`), the same score with ``levels=None``.

    The temperature :math:`T` minimises
    :math:`-\\sum_k y_k \\log \\sigma(z_k/T) + (1-y_k) \\log(1 - \\sigma(z_k/T))` with
    :math:`z_k = \\operatorname{logit} \\bar p_{\\ell(k)}`, the mean score of row
    :math:`k`'s level (its own score with ``levels=None``); :math:`T > 1` means the head is
    over-confident, :math:`T < 1` under-confident (NaN when one class is absent or the
    scores do not rank the labels the right way round).
    """
    by = as_columns(by)
    counts = _counts_for(data, steps, by, scores, n_bins, levels)
    if counts.empty:
        return pd.DataFrame(
            columns=[*calibration_keys(by, per_position), "n_rows", "ece", "brier", "auroc"]
        )
    return _finish(counts, calibration_keys(by, per_position))[0]


def compute_reliability(
    data: pd.DataFrame,
    *,
    steps: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("run_id",),
    scores: Iterable[str] = ("confidence", "prefix_confidence"),
    per_position: bool = True,
    n_bins: int = 10,
    levels: int | None = DEFAULT_LEVELS,
) -> pd.DataFrame:
    """Reliability diagram bins: mean score and acceptance rate per equal-width bin.

    Parameters are those of :func:`compute_calibration`.

    Returns
    -------
    pandas.DataFrame
        One row per group, score, (position,) and non-empty bin: ``bin``, ``bin_lo``,
        ``bin_hi``, ``count``, ``mean_score`` (:math:`\\bar p_B`), ``accept_rate``
        (:math:`\\bar y_B`) and ``gap`` = accept_rate - mean_score (negative: the head
        is over-confident in that bin).
    """
    by = as_columns(by)
    counts = _counts_for(data, steps, by, scores, n_bins, levels)
    if counts.empty:
        return pd.DataFrame(columns=[*calibration_keys(by, per_position), "bin", "count", "gap"])
    return _finish(counts, calibration_keys(by, per_position))[1]


# Columns of the store's ``calibration`` table a reported reliability bin needs.
