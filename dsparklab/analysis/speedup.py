"""Speedup model: fit draft and verify costs from step timings, predict S(n).

.. math:: S(n) = \\frac{\\mathrm{AL}(n)}{1 + c_{\\mathrm{draft}}(n) + v(n)}

with costs relative to one target-only decode step (DESIGN.md). A block drafter (DSpark,
DFlash) drafts the whole window in one pass, :math:`c_{\\mathrm{draft}}(n) = c`; an
autoregressive drafter (Eagle3) runs once per position, :math:`c_{\\mathrm{draft}}(n) = nc`.
The verify overhead is fitted as a line, :math:`v(n) = v_0 + v_1 n`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import as_columns, combined_codes, split_by_code
from dsparklab.analysis.window import BASELINE_METHOD, MATCH_COLUMNS, compute_window_scaling
from dsparklab.errors import UnknownMethodError

# method -> drafter kind
DRAFTER_KINDS: dict[str, str] = {
    "dspark": "block",
    "dflash": "block",
    "eagle3": "autoregressive",
    "eagle": "autoregressive",
}
# drafter kind -> how the draft cost grows with n, as a regressor: c_draft(n) = c * x(n)
DRAFT_COST_SHAPES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "block": lambda n: np.ones_like(n, dtype=np.float64),
    "autoregressive": lambda n: np.asarray(n, dtype=np.float64),
}


def _kind(method: str, kinds: Mapping[str, str]) -> str:
    if method not in kinds:
        raise UnknownMethodError(
            f"no drafter kind for method {method!r}; known methods are {sorted(kinds)}; "
            f"pass kinds={{{method!r}: 'block' or 'autoregressive'}}"
        )
    kind = kinds[method]
    if kind not in DRAFT_COST_SHAPES:
        raise UnknownMethodError(
            f"unknown drafter kind {kind!r} for method {method!r}; valid kinds are "
            f"{sorted(DRAFT_COST_SHAPES)}"
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
    code, n_codes = combined_codes(ok, fit_by)
    rows_out = []
    for rows in split_by_code(code, n_codes):
        part = ok.iloc[rows]
        kind = _kind(str(part["method"].iloc[0]), kinds)
        n = part["n"].to_numpy(float)
        w = part["n_steps"].to_numpy(float)
        shape = DRAFT_COST_SHAPES[kind](n)  # [R]
        c = float(np.sum(w * shape * part["draft_cost"]) / np.sum(w * shape * shape))
        v0, v1 = _weighted_line(n, part["verify_cost"].to_numpy(float), w)
        rows_out.append(
            {
                **{k: part[k].iloc[0] for k in fit_by},
                "kind": kind,
                "c": c,
                "v0": v0,
                "v1": v1,
                "n_values": sorted(set(part["n"].tolist())),
                "n_steps": int(w.sum()),
            }
        )
    return pd.DataFrame(rows_out, columns=[*fit_by, "kind", "c", "v0", "v1", "n_values", "n_steps"])


def fit_speedup_model(
    steps: pd.DataFrame,
    *,
    fit_by: str | Iterable[str] = ("method",),
    baseline_method: str = BASELINE_METHOD,
    match: Iterable[str] = MATCH_COLUMNS,
    kinds: Mapping[str, str] | None = None,
) -> pd.DataFrame:
    """Fit the draft cost c and the verify overhead v(n) = v0 + v1 n per group.

    Parameters
    ----------
    steps
        The steps table of method runs and their target-only baseline runs.
    fit_by
        One fit per group; must include ``method`` (the drafter kind depends on it).
    baseline_method, match
        As in :func:`dsparklab.analysis.compute_window_scaling`.
    kinds
        method -> ``"block"`` or ``"autoregressive"``; default :data:`DRAFTER_KINDS`.

    Returns
    -------
    pandas.DataFrame
        One row per group: ``kind``, ``c``, ``v0``, ``v1``, ``n_values`` and ``n_steps``.

    Notes
    -----
    From each (group, dataset, n) the measured costs relative to the matched baseline
    step time :math:`t_b` are :math:`c(n) = \\bar d / t_b` and
    :math:`v(n) = \\bar u / t_b - 1` (:math:`\\bar d`, :math:`\\bar u`: mean draft and
    verify time per step). Then, weighting by steps,

    .. math::

        \\hat c = \\arg\\min_c \\sum w\\,(c(n) - c\\,x(n))^2 = \\frac{\\sum w\\,x\\,c(n)}
        {\\sum w\\,x^2}, \\qquad x(n) = 1 \\text{ (block)}, \\ n \\text{ (autoregressive)}

    and :math:`(v_0, v_1)` by weighted least squares on :math:`v(n)`.
    """
    fit_by = list(as_columns(fit_by))
    if "method" not in fit_by:
        fit_by = ["method", *fit_by]
    measured = compute_window_scaling(
        steps,
        by=list(dict.fromkeys([*fit_by, *as_columns(match)])),
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
        The steps table of method runs and their target-only baseline runs.
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
    .. math:: S_{\\mathrm{model}}(n) = \\frac{\\mathrm{AL}(n)}{1 + \\hat c\\,x(n) + \\hat v_0
              + \\hat v_1 n}

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
    out = measured.merge(params[[*fit_by, "kind", "c", "v0", "v1"]], on=fit_by, how="left")
    n = out["n"].to_numpy(float)
    shape = np.full(len(out), np.nan)  # [R] x(n) of each row's drafter kind
    for kind, fn in DRAFT_COST_SHAPES.items():
        mine = (out["kind"] == kind).to_numpy()
        shape[mine] = fn(n[mine])
    out["draft_cost_model"] = out["c"] * shape
    out["verify_cost_model"] = out["v0"] + out["v1"] * n
    out["speedup_model"] = out["tokens_per_step"] / (
        1.0 + out["draft_cost_model"] + out["verify_cost_model"]
    )
    out["model_error"] = out["speedup_model"] / out["speedup"] - 1.0
    return out.drop(columns=["c", "v0", "v1"])
