"""Markov head attribution: how often the bias changed the draft, and what that did.

What the trace can and cannot say. Each positions row records ``markov_flip`` (the bias
changed the argmax), ``accepted`` and ``target_token``, but not the base argmax token.

- Not flipped: the base argmax *is* the drafted token, so "would the base argmax have been
  accepted" is known: exactly when the draft was.
- Flipped and accepted: the draft equals the target token and the base argmax differs from
  the draft, so the base argmax would have been rejected: the bias *helped*, known.
- Flipped and rejected: the base argmax is some other token that may or may not equal the
  target token; the trace does not say. These rows bound the counterfactual from both
  sides (all rejected: lower bound; all accepted: upper bound).

The counterfactual holds the drafted prefix fixed: it is about this position given the
same earlier tokens, not about the whole block the base head alone would have drafted
(changing one token changes every later position's context, which no trace records).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import (
    NO_MARKOV,
    as_columns,
    factorize,
    require_columns,
    require_values,
    tidy,
)
from dsparklab.analysis._kernels import group_sums
from dsparklab.analysis.prepare import annotate_positions
from dsparklab.errors import DSparkLabError

MARKOV_COLUMNS = ("markov_flip", "markov_bias")


def _markov_rows(positions: pd.DataFrame, steps: pd.DataFrame | None, by: tuple[str, ...]):
    require_columns(positions, MARKOV_COLUMNS, what="Markov attribution")
    require_values(positions, "markov_flip", what="Markov attribution", why=NO_MARKOV)
    frame = annotate_positions(positions, steps=steps)
    require_columns(frame, by, what="Markov attribution")
    flip = frame["markov_flip"]
    keep = frame["reached"].to_numpy(dtype=bool) & flip.notna().to_numpy()
    return frame.loc[keep]


def compute_markov_attribution(
    positions: pd.DataFrame,
    *,
    steps: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("run_id",),
    per_position: bool = True,
) -> pd.DataFrame:
    """Flip rate, acceptance with and without a flip, and the base-argmax counterfactual.

    Parameters
    ----------
    positions
        The positions table; rows with a null ``markov_flip`` (Eagle3, no Markov head)
        are skipped, so such groups are absent from the result.
    steps
        The steps table (``prompt_id`` grouping; adaptive verification).
    by
        Grouping columns.
    per_position
        One row per position (True) or pooled over positions (False).

    Returns
    -------
    pandas.DataFrame
        Over reached rows: ``n_reached``, ``n_flip``, ``flip_rate``, ``accept_rate``,
        ``accept_rate_flip``, ``accept_rate_noflip``, ``n_flip_helped`` (flipped and
        accepted: the base argmax would have been rejected), ``n_flip_unknown`` (flipped
        and rejected), ``base_accept_rate_lo`` / ``_hi`` (bounds on the rate at which the
        base argmax would have been accepted), ``bias_gain_lo`` / ``_hi`` (accept_rate
        minus those bounds, reversed), ``mean_bias_accepted`` / ``_rejected`` (the bias at
        the drafted token).

    Notes
    -----
    Over the :math:`R` reached rows of a group, with :math:`F` flipped,
    :math:`A` accepted, :math:`A_{\\bar F}` accepted and not flipped and
    :math:`F_{\\bar A}` flipped and rejected:

    .. math::

        \\mathrm{flip\\ rate} = F / R, \\qquad
        \\frac{A_{\\bar F}}{R} \\le P(\\mathrm{base\\ argmax\\ accepted}) \\le
        \\frac{A_{\\bar F} + F_{\\bar A}}{R}

    and the gain from the bias, :math:`A/R - P(\\mathrm{base\\ accepted})`, lies in
    :math:`[(A - A_{\\bar F} - F_{\\bar A})/R,\\ (A - A_{\\bar F})/R]`. The upper end is
    reached when no flip cost an acceptance.
    """
    by = as_columns(by)
    frame = _markov_rows(positions, steps, by)
    keys = [*by, *(["position"] if per_position else [])]
    codes, sizes, uniques = factorize(frame, keys)
    flip = frame["markov_flip"].to_numpy(dtype=bool)
    accepted = frame["accepted"].to_numpy(dtype=bool)
    bias = frame["markov_bias"].to_numpy(dtype=np.float64, na_value=np.nan)
    has_bias = ~np.isnan(bias)
    bias0 = np.where(has_bias, bias, 0.0)
    cells, count, s = group_sums(
        codes,
        sizes,
        {
            "n_flip": flip,
            "n_accepted": accepted,
            "n_acc_flip": accepted & flip,
            "n_acc_noflip": accepted & ~flip,
            "n_flip_rej": flip & ~accepted,
            "bias_acc": bias0 * accepted,
            "bias_rej": bias0 * ~accepted,
            "n_bias_acc": has_bias & accepted,
            "n_bias_rej": has_bias & ~accepted,
        },
    )
    n = count.astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = s["n_accepted"] / n
        base_lo = s["n_acc_noflip"] / n
        base_hi = (s["n_acc_noflip"] + s["n_flip_rej"]) / n
        columns = {
            "n_reached": count.astype(np.int64),
            "n_flip": s["n_flip"].astype(np.int64),
            "flip_rate": s["n_flip"] / n,
            "accept_rate": rate,
            "accept_rate_flip": s["n_acc_flip"] / s["n_flip"],
            "accept_rate_noflip": s["n_acc_noflip"] / (n - s["n_flip"]),
            "n_flip_helped": s["n_acc_flip"].astype(np.int64),
            "n_flip_unknown": s["n_flip_rej"].astype(np.int64),
            "base_accept_rate_lo": base_lo,
            "base_accept_rate_hi": base_hi,
            "bias_gain_lo": rate - base_hi,
            "bias_gain_hi": rate - base_lo,
            "mean_bias_accepted": s["bias_acc"] / s["n_bias_acc"],
            "mean_bias_rejected": s["bias_rej"] / s["n_bias_rej"],
        }
    return tidy(keys, cells, uniques, columns)


def compute_markov_bias_distribution(
    positions: pd.DataFrame,
    *,
    steps: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("run_id",),
    per_position: bool = False,
    bins: int = 40,
    value_range: tuple[float, float] | None = None,
) -> pd.DataFrame:
    """Histogram of the Markov bias at the drafted token, accepted vs rejected rows.

    Parameters
    ----------
    positions, steps, by, per_position
        As in :func:`compute_markov_attribution` (reached rows with a bias only).
    bins
        Equal-width bins.
    value_range
        (low, high) of the histogram; default: the smallest and largest bias present,
        shared by every group so that groups compare. Values outside fall in the end bins.

    Returns
    -------
    pandas.DataFrame
        One row per group, (position,), ``accepted`` and bin: ``bin``, ``bin_lo``,
        ``bin_hi``, ``count`` and ``density`` (count / (rows of that group and label x bin
        width), so each label's histogram integrates to 1).
    """
    if bins < 1:
        raise DSparkLabError(f"bins must be >= 1, got {bins}")
    by = as_columns(by)
    frame = _markov_rows(positions, steps, by)
    bias = frame["markov_bias"].to_numpy(dtype=np.float64, na_value=np.nan)
    frame = frame.loc[~np.isnan(bias)]
    bias = bias[~np.isnan(bias)]
    if value_range is None:
        value_range = (float(bias.min()), float(bias.max())) if len(bias) else (0.0, 1.0)
    low, high = value_range
    width = (high - low) / bins if high > low else 1.0
    bin_code = np.clip(np.floor((bias - low) / width), 0, bins - 1).astype(np.int64)
    keys = [*by, *(["position"] if per_position else []), "accepted"]
    codes, sizes, uniques = factorize(frame, keys)
    cells, count, _ = group_sums([*codes, bin_code], [*sizes, bins], {})
    out = tidy(
        keys,
        cells[:-1],
        uniques,
        {
            "bin": cells[-1],
            "bin_lo": low + cells[-1] * width,
            "bin_hi": low + (cells[-1] + 1) * width,
            "count": count.astype(np.int64),
        },
    )
    total = out.groupby(keys, sort=False)["count"].transform("sum")
    out["density"] = out["count"] / (total * width)
    return out
