"""The seeds' question, answered from measurements: does a speedup rise, stay flat or fall
from the smallest window to the largest?

Novita reports that from n = 3 to n = 7 DSpark's speedup grows while Eagle3's stays flat
(or falls, on LiveCodeBench). :func:`speedup_trend` puts each measured (dataset, method)
curve in one of those classes, by its bootstrap intervals, and :func:`seeds_answer` says
per dataset whether the published shape appears.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import as_columns, require_columns

# a comparison whose intervals overlap names no winner
CANNOT_TELL = "cannot tell"


def speedup_trend(
    scaling: pd.DataFrame,
    *,
    by: str | Iterable[str] = ("dataset", "method"),
    low_n: int | None = None,
    high_n: int | None = None,
    value: str = "speedup",
) -> pd.DataFrame:
    """How ``value`` moves from ``low_n`` to ``high_n`` in each group.

    Parameters
    ----------
    scaling
        From :func:`dsparklab.analysis.compute_window_scaling` (``n``, ``value`` and its
        ``_lo``/``_hi`` interval columns).
    by
        The groups, each with its own curve over n.
    low_n, high_n
        The windows compared; default each group's smallest and largest n.
    value
        ``"speedup"`` or ``"accept_len"``.

    Returns
    -------
    pandas.DataFrame
        One row per group: ``low_n``, ``high_n``, the value and interval at each
        (``low``, ``low_lo``, ``low_hi``, ``high``, ...), ``change`` = high - low and
        ``trend``.

    Notes
    -----
    With intervals :math:`[l_a, h_a]` at ``low_n`` and :math:`[l_b, h_b]` at ``high_n``:

    .. math::

        \\text{rises} \\iff l_b > h_a, \\qquad \\text{falls} \\iff h_b < l_a,
        \\qquad \\text{flat otherwise (the intervals overlap)}

    so "flat" means the measurement cannot tell the two windows apart, not that they are
    equal. Without intervals (NaN bounds) the point values decide and no group is flat
    unless they are equal.
    """
    by = list(as_columns(by))
    lo_col, hi_col = f"{value}_lo", f"{value}_hi"
    require_columns(scaling, [*by, "n", value, lo_col, hi_col], what="speedup_trend")
    rows = []
    for key, part in scaling.groupby(by, sort=True, dropna=False):
        part = part.dropna(subset=[value])
        if part.empty:
            continue
        a_n = int(part["n"].min()) if low_n is None else low_n
        b_n = int(part["n"].max()) if high_n is None else high_n
        a, b = part[part["n"] == a_n], part[part["n"] == b_n]
        if a.empty or b.empty or a_n == b_n:
            continue
        a, b = a.iloc[0], b.iloc[0]
        a_lo, a_hi = _bounds(a, value, lo_col, hi_col)
        b_lo, b_hi = _bounds(b, value, lo_col, hi_col)
        trend = "rises" if b_lo > a_hi else "falls" if b_hi < a_lo else "flat"
        rows.append(
            {
                **dict(zip(by, key if isinstance(key, tuple) else (key,), strict=True)),
                "low_n": a_n,
                "high_n": b_n,
                "low": float(a[value]),
                "low_lo": a_lo,
                "low_hi": a_hi,
                "high": float(b[value]),
                "high_lo": b_lo,
                "high_hi": b_hi,
                "change": float(b[value] - a[value]),
                "trend": trend,
            }
        )
    columns = [*by, "low_n", "high_n", "low", "low_lo", "low_hi", "high", "high_lo"]
    return pd.DataFrame(rows, columns=[*columns, "high_hi", "change", "trend"])


def _bounds(row: pd.Series, value: str, lo: str, hi: str) -> tuple[float, float]:
    point = float(row[value])
    low, high = float(row[lo]), float(row[hi])
    return (point, point) if np.isnan(low) or np.isnan(high) else (low, high)


def seeds_answer(
    trend: pd.DataFrame, *, block: str = "dspark", autoregressive: str = "eagle3"
) -> pd.DataFrame:
    """Per dataset: does the published shape appear (block rises, autoregressive does not)?

    Parameters
    ----------
    trend
        From :func:`speedup_trend` with ``by=("dataset", "method")``.
    block, autoregressive
        The two methods compared.

    Returns
    -------
    pandas.DataFrame
        One row per dataset holding both methods: ``<block>_trend``,
        ``<autoregressive>_trend``, their ``_change``, ``published_shape`` (bool:
        :math:`\\text{block rises} \\wedge \\text{autoregressive} \\in
        \\{\\text{flat}, \\text{falls}\\}`) and ``faster_at_high_n``: the method whose
        interval at its largest n lies wholly above the other's (:math:`l_b > h_a`, the
        rule of :func:`speedup_trend`), else ``"cannot tell"``.
    """
    require_columns(trend, ["dataset", "method", "trend", "change", "high"], what="seeds_answer")
    rows = []
    for dataset, part in trend.groupby("dataset", sort=True):
        mine = part.set_index("method")
        if block not in mine.index or autoregressive not in mine.index:
            continue
        b, a = mine.loc[block], mine.loc[autoregressive]
        rows.append(
            {
                "dataset": dataset,
                f"{block}_trend": b["trend"],
                f"{block}_change": float(b["change"]),
                f"{autoregressive}_trend": a["trend"],
                f"{autoregressive}_change": float(a["change"]),
                "published_shape": bool(b["trend"] == "rises" and a["trend"] != "rises"),
                "faster_at_high_n": (
                    block
                    if b["high_lo"] > a["high_hi"]
                    else autoregressive
                    if a["high_lo"] > b["high_hi"]
                    else CANNOT_TELL
                ),
            }
        )
    return pd.DataFrame(rows)
