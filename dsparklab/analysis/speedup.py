"""Speedup model: fit draft and verify costs from step timings, predict S(n).

.. math:: S(n) = \\frac{\\mathrm{AL}(n)}{1 + c_{\\mathrm{draft}}(n) + v(n)}

with costs relative to one target-only decode step. The cost structure the fit assumes:

- verify: one target forward over the n + 1 tokens of a block. It depends on the width
  alone, not on which drafter proposed the tokens, and not smoothly (on CPU a GEMM kernel
  changes at some widths: here 7 rows cost ~20 % more than 6), so :math:`v(n)` is one value
  per n shared by every method;
- draft: a block drafter (DSpark, DFlash) drafts the whole window in one pass,
  :math:`c_{\\mathrm{draft}}(n) = c_0`; an autoregressive drafter (Eagle3) runs once per
  position after taking in the accepted tokens, :math:`c_{\\mathrm{draft}}(n) = c_0 + c_1 n`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import as_columns, combined_codes, split_by_code
from dsparklab.analysis.layouts import MATCH_COLUMNS, match_columns
from dsparklab.analysis.window import BASELINE_METHOD, compute_window_scaling, require_step_costs
from dsparklab.errors import UnknownMethodError

# method -> drafter kind
DRAFTER_KINDS: dict[str, str] = {
    "dspark": "block",
    "dflash": "block",
    "eagle3": "autoregressive",
    "eagle": "autoregressive",
}
# drafter kind -> does the draft cost grow with n (a slope is fitted) or not
DRAFT_COST_SLOPE: dict[str, bool] = {"block": False, "autoregressive": True}


def _kind(method: str, kinds: Mapping[str, str]) -> str:
    if method not in kinds:
        raise UnknownMethodError(
            f"no drafter kind for method {method!r}; known methods are {sorted(kinds)}; "
            f"pass kinds={{{method!r}: 'block' or 'autoregressive'}}"
        )
    kind = kinds[method]
    if kind not in DRAFT_COST_SLOPE:
        raise UnknownMethodError(
            f"unknown drafter kind {kind!r} for method {method!r}; valid kinds are "
            f"{sorted(DRAFT_COST_SLOPE)}"
        )
    return kind


def _weighted_line(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Weighted least squares y ~ a + b x (b = 0 with a single distinct x)."""
    if len(np.unique(x)) < 2:
        return float(np.average(y, weights=w)), 0.0
    design = np.stack([np.ones_like(x), x], axis=1) * np.sqrt(w)[:, None]  # [R, 2]
    coef, *_ = np.linalg.lstsq(design, y * np.sqrt(w), rcond=None)
    return float(coef[0]), float(coef[1])


def _fit(measured: pd.DataFrame, fit_by: list[str], kinds: Mapping[str, str]) -> pd.DataFrame:
    ok = measured.dropna(subset=["draft_cost", "verify_cost"]).reset_index(drop=True)
    # verify: one value per (fit group without the method, n), pooled over the methods
    shared = [k for k in fit_by if k != "method"]
    weighted = ok.assign(_wv=ok["verify_cost"] * ok["n_steps"])
    verify = weighted.groupby([*shared, "n"], sort=False, dropna=False)[["_wv", "n_steps"]].sum()
    verify = (verify["_wv"] / verify["n_steps"]).rename("verify_cost_fit").reset_index()
    code, n_codes = combined_codes(ok, fit_by)
    rows_out = []
    for rows in split_by_code(code, n_codes):
        part = ok.iloc[rows]
        kind = _kind(str(part["method"].iloc[0]), kinds)
        n = part["n"].to_numpy(float)
        w = part["n_steps"].to_numpy(float)
        cost = part["draft_cost"].to_numpy(float)
        if DRAFT_COST_SLOPE[kind]:
            c0, c1 = _weighted_line(n, cost, w)
        else:
            c0, c1 = float(np.average(cost, weights=w)), 0.0
        # one row per n (a group may hold several datasets at the same n)
        for value, steps in part.groupby("n", sort=True)["n_steps"].sum().items():
            rows_out.append(
                {
                    **{k: part[k].iloc[0] for k in fit_by},
                    "n": value,
                    "kind": kind,
                    "c0": c0,
                    "c1": c1,
                    "draft_cost_fit": c0 + c1 * float(value),
                    "n_steps": int(steps),
                }
            )
    columns = [*fit_by, "n", "kind", "c0", "c1", "draft_cost_fit", "n_steps"]
    params = pd.DataFrame(rows_out, columns=columns)
    return params.merge(verify, on=[*shared, "n"], how="left")


def fit_speedup_model(
    steps: pd.DataFrame,
    *,
    fit_by: str | Iterable[str] = ("method",),
    baseline_method: str = BASELINE_METHOD,
    match: Iterable[str] = MATCH_COLUMNS,
    kinds: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Fit the draft cost per method and the verify cost per window, shared by the methods.

    Parameters
    ----------
    steps
        The steps table of method runs and their target-only baseline runs, or their
        per-request step-time counters (as in ``compute_window_scaling``).
    fit_by
        One fit per group; must include ``method`` (the drafter kind depends on it).
    baseline_method, match
        As in :func:`dsparklab.analysis.compute_window_scaling`.
    kinds
        method -> ``"block"`` or ``"autoregressive"``; default :data:`DRAFTER_KINDS`.

    Returns
    -------
    pandas.DataFrame
        One row per (group, n): ``kind``, ``c0``, ``c1``, ``draft_cost_fit``
        (:math:`c_0 + c_1 n`), ``verify_cost_fit`` (:math:`\\hat v(n)`) and ``n_steps``.

    Notes
    -----
    From each (group, dataset, n) the measured costs relative to the matched baseline
    step time :math:`t_b` are :math:`c(n) = \\bar d / t_b` and
    :math:`v(n) = \\bar u / t_b - 1` (:math:`\\bar d`, :math:`\\bar u`: mean draft and
    verify time per step). With weights :math:`w` = steps,

    .. math::

        \\hat v(n) = \\frac{\\sum_{m} w_m\\, v_m(n)}{\\sum_m w_m} \\quad
        \\text{(pooled over the methods } m\\text{)}, \\qquad
        \\hat c_0 = \\frac{\\sum w\\, c(n)}{\\sum w} \\ \\text{(block)}, \\quad
        (\\hat c_0, \\hat c_1) = \\arg\\min \\sum w\\,(c(n) - c_0 - c_1 n)^2
        \\ \\text{(autoregressive)}.
    """
    fit_by = list(as_columns(fit_by))
    if "method" not in fit_by:
        fit_by = ["method", *fit_by]
    measured = compute_window_scaling(
        steps,
        by=list(dict.fromkeys([*fit_by, *match_columns(steps, match)])),
        baseline_method=baseline_method,
        match=match,
        n_boot=0,
    )
    return _fit(measured, fit_by, DRAFTER_KINDS if kinds is None else kinds)


def compute_speedup_model(
    steps: pd.DataFrame,
    *,
    by: str | Iterable[str] = ("method", "dataset"),
    fit_by: str | Iterable[str] = ("method",),
    baseline_method: str = BASELINE_METHOD,
    match: Iterable[str] = MATCH_COLUMNS,
    kinds: Mapping[str, str] | None = None,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Modelled against measured speedup per group and window n.

    Parameters
    ----------
    steps
        The steps table of method runs and their target-only baseline runs, or their
        per-request step-time counters (as in ``compute_window_scaling``).
    by
        Grouping columns of the comparison (``n`` is always added).
    fit_by
        Grouping of the cost fit (:func:`fit_speedup_model`); ``method`` is always in it.
    baseline_method, match, kinds
        As in :func:`fit_speedup_model`.
    n_boot, ci, seed
        Intervals of the measured speedup (see ``compute_window_scaling``).

    Returns
    -------
    pandas.DataFrame
        The columns of ``compute_window_scaling`` plus ``kind``, ``draft_cost_model``
        (:math:`c_{\\mathrm{draft}}(n)`), ``verify_cost_model`` (:math:`v(n)`),
        ``speedup_model`` and ``model_error`` = speedup_model / speedup - 1.

    Notes
    -----
    .. math:: S_{\\mathrm{model}}(n) = \\frac{\\mathrm{AL}(n)}{1 + \\hat c_0 + \\hat c_1 n
              + \\hat v(n)}

    with :math:`\\mathrm{AL}(n)` the measured tokens per step (equal to
    :math:`1 + \\sum_i s_i` when every step drafts n positions). With the measured costs
    in place of the fitted ones the formula reproduces the measured speedup exactly, so
    ``model_error`` is the error of the cost model alone.
    """
    by = as_columns(by)
    fit_by = list(as_columns(fit_by))
    if "method" not in fit_by:
        fit_by = ["method", *fit_by]
    kinds = DRAFTER_KINDS if kinds is None else kinds
    require_step_costs(steps, baseline_method=baseline_method)
    params = fit_speedup_model(
        steps, fit_by=fit_by, baseline_method=baseline_method, match=match, kinds=kinds
    )
    group_by = list(dict.fromkeys([*by, *fit_by]))
    measured = compute_window_scaling(
        steps,
        by=group_by,
        baseline_method=baseline_method,
        match=match,
        n_boot=n_boot,
        ci=ci,
        seed=seed,
    )
    cols = [*fit_by, "n", "kind", "draft_cost_fit", "verify_cost_fit"]
    out = measured.merge(params[cols], on=[*fit_by, "n"], how="left")
    out = out.rename(
        columns={"draft_cost_fit": "draft_cost_model", "verify_cost_fit": "verify_cost_model"}
    )
    out["speedup_model"] = out["tokens_per_step"] / (
        1.0 + out["draft_cost_model"] + out["verify_cost_model"]
    )
    out["model_error"] = out["speedup_model"] / out["speedup"] - 1.0
    return out
