"""Reliability reported by a source: the bins of runs imported with their own calibration.

Runs imported from a source that computed its own calibration (DeepSpec's ``metrics.json``)
hold no rows to count, only the source's reliability bins in the store's ``calibration``
table: :func:`compute_reported_reliability` turns them into the reliability table
:func:`~dsparklab.analysis.calibration.compute_reliability` gives token-level runs, each bin
at the index and edges the source wrote, and :func:`compute_reliability_ece` gives the ECE
of either table's bins.
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
    require_values,
)
from dsparklab.analysis.calibration import (
    binned_ece,
    calibration_keys,
    check_scores,
    reliability_rows,
)
from dsparklab.errors import DSparkLabError

REPORTED_BIN_COLUMNS = (
    "score",
    "position",
    "bin",
    "bin_lo",
    "bin_hi",
    "count",
    "pred_mean",
    "target_mean",
)
EDGE_TOLERANCE = 1e-9  # one bin index pooled over runs must have the same edges
NO_BINS = "only sources that report their reliability bins, e.g. DeepSpec's metrics.json"


def compute_reported_reliability(
    calibration: pd.DataFrame,
    *,
    by: str | Iterable[str] = ("run_id",),
    scores: Iterable[str] | None = None,
    per_position: bool = True,
) -> pd.DataFrame:
    """The reliability table of runs whose source reported its bins (e.g. DeepSpec's).

    Parameters
    ----------
    calibration
        The store's ``calibration`` table (``read_trace(root, "calibration")``, or
        ``load_any_runs(...).calibration``): the rows with a ``bin`` are the source's
        reliability bins, with the bin's index and edges as the source wrote them.
    by
        Grouping columns (run columns such as ``method``, ``dataset``).
    scores
        Keep only these scores (None: every score the rows hold).
    per_position
        One set of bins per position (True) or pooled over positions (False).

    Returns
    -------
    pandas.DataFrame
        The columns of :func:`compute_reliability`, one row per group, score, (position,)
        and non-empty bin: ``bin`` and its edges ``bin_lo``, ``bin_hi`` as reported (a
        bin the source left out, being empty, is absent), ``count`` (the bin's reported
        weight), ``mean_score`` (:math:`\\bar p_b`), ``accept_rate`` (:math:`\\bar y_b`),
        ``gap``; plus ``source`` (``"reported by <engine>"``). MissingInputError when no
        row holds a bin.

    Notes
    -----
    Bins of several runs in one group pool by weight: with run :math:`r`'s weight
    :math:`w_{rb}`, mean prediction :math:`p_{rb}` and observed rate :math:`y_{rb}`,

    .. math::

        w_b = \\sum_r w_{rb}, \\qquad
        \\bar p_b = \\frac{\\sum_r w_{rb} p_{rb}}{w_b}, \\qquad
        \\bar y_b = \\frac{\\sum_r w_{rb} y_{rb}}{w_b}

    (a bin index must have the same edges in every run it pools). The ECE of these bins is
    :func:`compute_reliability_ece`.
    """
    by = as_columns(by)
    keys = calibration_keys(by, per_position)
    require_columns(calibration, [*by, *REPORTED_BIN_COLUMNS], what="reported reliability")
    require_values(calibration, "bin", what="a reported reliability diagram", why=NO_BINS)
    rows = calibration[calibration["bin"].notna() & (calibration["count"].fillna(0) > 0)]
    if scores is not None:
        rows = rows[rows["score"].isin(check_scores(scores))]
    if rows.empty:
        columns = [*keys, "bin", "bin_lo", "bin_hi", "count", "mean_score", "accept_rate"]
        return pd.DataFrame(columns=[*columns, "gap", "source"])
    rows = rows.reset_index(drop=True)
    group, n_groups = combined_codes(rows, keys)
    index = rows["bin"].to_numpy(dtype=np.int64)
    n_bins = int(index.max()) + 1
    cell, inverse = np.unique(group * n_bins + index, return_inverse=True)
    inverse = inverse.reshape(-1)
    weight = rows["count"].to_numpy(dtype=np.float64)

    def per_cell(values: np.ndarray) -> np.ndarray:
        return np.bincount(inverse, weights=values, minlength=len(cell))

    pred = rows["pred_mean"].to_numpy(dtype=np.float64, na_value=np.nan)
    target = rows["target_mean"].to_numpy(dtype=np.float64, na_value=np.nan)
    b_group, b_bin = cell // n_bins, cell % n_bins
    bin_lo, bin_hi = _reported_edges(rows, inverse, len(cell), keys, b_group, b_bin)
    key_frame = group_key_frame(rows, keys, group, n_groups)
    out = reliability_rows(
        key_frame.iloc[b_group],
        bins=b_bin,
        bin_lo=bin_lo,
        bin_hi=bin_hi,
        count=per_cell(weight),
        sum_score=per_cell(weight * pred),
        sum_accepted=per_cell(weight * target),
    )
    engines = (
        pd.Series(rows["engine"].astype(str).to_numpy())
        .groupby(group)
        .agg(lambda s: "+".join(sorted(set(s))))
        .to_numpy()
        if "engine" in rows.columns
        else np.full(n_groups, "source", dtype=object)
    )
    out["source"] = "reported by " + pd.Series(engines[b_group], dtype=object)
    return out


def _reported_edges(
    rows: pd.DataFrame,
    inverse: np.ndarray,
    n_cells: int,
    keys: list[str],
    b_group: np.ndarray,
    b_bin: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Each pooled bin's edges ``[C]``; raises when one bin index has two sets of edges."""
    edges = []
    for name in ("bin_lo", "bin_hi"):
        value = rows[name].to_numpy(dtype=np.float64, na_value=np.nan)
        low = np.full(n_cells, np.inf)
        high = np.full(n_cells, -np.inf)
        np.minimum.at(low, inverse, value)
        np.maximum.at(high, inverse, value)
        differ = np.flatnonzero(high - low > EDGE_TOLERANCE)
        if len(differ):
            c = int(differ[0])
            where = rows.iloc[int(np.flatnonzero(inverse == c)[0])][keys].to_dict()
            raise DSparkLabError(
                f"reported bin {int(b_bin[c])} has {name} from {low[c]} to {high[c]} "
                f"in one group {where}: bins with different edges cannot be pooled; "
                "group by run_id"
            )
        edges.append(np.where(np.isfinite(low), low, np.nan))
    return edges[0], edges[1]


def compute_reliability_ece(
    reliability: pd.DataFrame,
    *,
    by: str | Iterable[str] = ("run_id",),
    per_position: bool = True,
) -> pd.DataFrame:
    """ECE of each group from its reliability bins (token-level or reported ones).

    Parameters
    ----------
    reliability
        From :func:`compute_reliability` or :func:`compute_reported_reliability`.
    by, per_position
        The grouping the table was made with (``per_position=False`` pools positions).

    Returns
    -------
    pandas.DataFrame
        One row per group, score (and position): ``count`` (the total weight
        :math:`\\sum_b w_b`), ``n_bins`` (non-empty bins) and ``ece``.

    Notes
    -----
    .. math::

        \\mathrm{ECE} = \\frac{\\sum_b w_b\\,|\\bar p_b - \\bar y_b|}{\\sum_b w_b}

    with :math:`w_b` the bin's ``count``, :math:`\\bar p_b` its ``mean_score`` and
    :math:`\\bar y_b` its ``accept_rate``. On token-level bins this is the ``ece`` of
    :func:`compute_calibration`; on a source's bins, the ECE that source's bins give.
    """
    by = as_columns(by)
    keys = calibration_keys(by, per_position)
    columns = ["count", "mean_score", "accept_rate"]
    require_columns(reliability, [*keys, *columns], what="compute_reliability_ece")
    if reliability.empty:
        return pd.DataFrame(columns=[*keys, "count", "n_bins", "ece"])
    rows = reliability.reset_index(drop=True)
    group, n_groups = combined_codes(rows, keys)
    weight = rows["count"].to_numpy(dtype=np.float64)
    ece = binned_ece(
        group,
        n_groups,
        weight,
        weight * rows["mean_score"].to_numpy(dtype=np.float64),
        weight * rows["accept_rate"].to_numpy(dtype=np.float64),
    )
    return group_key_frame(rows, keys, group, n_groups).assign(
        count=np.bincount(group, weights=weight, minlength=n_groups),
        n_bins=np.bincount(group, minlength=n_groups).astype(np.int64),
        ece=ece,
    )
