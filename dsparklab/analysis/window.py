"""Window scaling: acceptance length and measured speedup as the window n grows.

Speedup is measured against the target-only baseline (``method == "none"``) run that
matches the method run on engine, target, dataset, temperature and concurrency (the
requests in flight: a method run at 4 is measured against the baseline at 4). Tokens are what the
steps emitted (``emitted``: a baseline step one token, a speculative step
``accepted_len + 1`` except where the output was cut at its end); AL stays what the
verifier accepted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import (
    UNIT_COLUMNS,
    as_columns,
    combined_codes,
    group_key_frame,
    require_columns,
    split_by_code,
)
from dsparklab.analysis._kernels import (
    bootstrap_sums,
    group_rng,
    percentile_interval,
)
from dsparklab.analysis.aggregate import compute_acceptance_length
from dsparklab.analysis.layouts import (
    MATCH_COLUMNS,
    STEP_TIME_COUNTERS,
    match_columns,
)
from dsparklab.analysis.sql.counting import count_frames
from dsparklab.errors import DSparkLabError, MissingInputError

logger = logging.getLogger(__name__)

BASELINE_METHOD = "none"


def is_step_time_counts(frame: pd.DataFrame) -> bool:
    """Whether ``frame`` is a step-time counter table rather than steps."""
    return all(c in frame.columns for c in STEP_TIME_COUNTERS)


def step_time_counts(
    steps: pd.DataFrame, *, by: Iterable[str], match: Iterable[str] = MATCH_COLUMNS
) -> pd.DataFrame:
    """Per-request step-time counters of ``steps``: the table itself when it is one
    (``aggregate_store(metric="step_times")``), else its rows counted by the same query
    (:func:`~dsparklab.analysis.sql.count_frames`). A counter table summed over requests is
    refused: the bootstraps resample its rows as requests."""
    if not is_step_time_counts(steps):
        return count_frames("step_times", steps=steps, by=by, match=match)
    keys = list(dict.fromkeys([*as_columns(by), "method", "n", *match_columns(steps, match)]))
    require_columns(steps, [*keys, *UNIT_COLUMNS], what="per-request step-time counts")
    return steps


def _baseline_rates(
    counts: pd.DataFrame, match: list[str], n_boot: int, seed: int
) -> tuple[pd.DataFrame, dict[int, np.ndarray]]:
    """Baseline time per step per match key, and bootstrap replicates of it ``[B]``."""
    base = counts.reset_index(drop=True)
    code, n_codes = combined_codes(base, match)
    keys = group_key_frame(base, match, code, n_codes)
    time = np.bincount(code, weights=base["sum_time"].to_numpy(float), minlength=n_codes)
    n = np.bincount(code, weights=base["n_steps"].to_numpy(float), minlength=n_codes)
    keys["baseline_step_time"] = time / n
    keys["baseline_steps"] = n.astype(np.int64)
    replicates: dict[int, np.ndarray] = {}
    if n_boot > 0 and all(c in base.columns for c in UNIT_COLUMNS):
        for m, rows in enumerate(split_by_code(code, n_codes)):
            rng = group_rng(seed, ("baseline", *keys.iloc[m][match]))
            per_unit = base[["sum_time", "n_steps"]].to_numpy(float)[rows]  # [U, 2]
            sums = bootstrap_sums(per_unit, n_boot, rng)  # [B, 2]
            with np.errstate(invalid="ignore", divide="ignore"):
                replicates[m] = sums[:, 0] / sums[:, 1]
    return keys, replicates


def require_step_costs(steps: pd.DataFrame, *, baseline_method: str = BASELINE_METHOD) -> None:
    """Raise :class:`~dsparklab.errors.MissingInputError` unless ``steps`` can give a
    measured speedup: target-only baseline steps, and a verify time on every step of both
    (decided from which columns are filled, whatever engine wrote them)."""
    verify_column = "sum_verify" if is_step_time_counts(steps) else "verify_time_s"
    require_columns(steps, ["method", verify_column], what="require_step_costs")
    is_base = steps["method"] == baseline_method
    if not is_base.any():
        raise MissingInputError(
            f"no target-only baseline run (method {baseline_method!r}): a speedup is measured "
            "against one; collect --method none on the same datasets"
        )
    for name, part in (("speculative", steps.loc[~is_base]), ("baseline", steps.loc[is_base])):
        untimed = part[verify_column].isna()
        if len(part) and untimed.all():
            engines = sorted(map(str, part["engine"].unique())) if "engine" in part else []
            raise MissingInputError(
                f"the {name} runs' steps carry no verify time (verify_time_s is empty"
                f"{' in ' + ', '.join(engines) + ' runs' if engines else ''}): speedup needs "
                "step timings"
            )


def compute_window_scaling(
    steps: pd.DataFrame,
    *,
    positions: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("method", "dataset"),
    baseline_method: str = BASELINE_METHOD,
    match: Iterable[str] = MATCH_COLUMNS,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Tokens per step, acceptance length and measured speedup per group and window n.

    Parameters
    ----------
    steps
        The steps table of the method runs and of their target-only baseline runs, or
        their per-request step-time counters (:func:`step_time_counts`).
    positions
        The positions table of the method runs, or their per-request acceptance counts;
        adds ``accept_len`` (1 + sum of survivals) with its interval.
    by
        Grouping columns (``n`` is always added).
    baseline_method
        The ``method`` value of target-only runs.
    match
        Run columns pairing a method run with its baseline.
    n_boot, ci, seed
        Percentile bootstrap over requests (method and baseline requests resampled
        independently); 0 replicates skips the intervals.

    Returns
    -------
    pandas.DataFrame
        One row per group and n: ``n_steps``, ``tokens_per_step`` (+ ``_lo``/``_hi``),
        ``time_per_token``, ``baseline_time_per_token``, ``speedup`` (+ ``_lo``/``_hi``),
        ``draft_cost`` (:math:`c`), ``verify_cost`` (:math:`v`), [``accept_len`` (+
        bounds)], and ``marginal_tokens_per_step``, ``marginal_speedup`` [,
        ``marginal_accept_len``]: the change from window n-1 to n in the same group (NaN
        where n-1 was not run).

    Notes
    -----
    For the steps of a group, each matched to a baseline with step time :math:`t_b`
    (the baseline's time per emitted token):

    .. math::

        \\mathrm{speedup} = \\frac{\\sum_k e_k\\, t_{b(k)}}{\\sum_k (d_k + u_k + o_k)},
        \\qquad
        c = \\frac{\\sum_k d_k}{\\sum_k t_{b(k)}}, \\qquad
        v = \\frac{\\sum_k (u_k + o_k)}{\\sum_k t_{b(k)}} - 1

    with :math:`e_k` the tokens step :math:`k` emitted (``emitted``: :math:`A_k + 1`
    but where the output was cut), :math:`d_k` its draft, :math:`u_k` its verify and
    :math:`o_k` its other time (each the request's share of its batch's). With one
    dataset this is baseline time per token over method time per token, and
    :math:`\\mathrm{speedup} = \\mathrm{tokens\\ per\\ step} / (1 + c + v)`.
    Pooling datasets weights them by emitted tokens; for the published
    convention (an unweighted mean over datasets) group by dataset and average.
    """
    by = as_columns(by)
    match = match_columns(steps, match)
    if not 0.0 < ci < 1.0:
        raise DSparkLabError(f"ci must be in (0, 1), got {ci}; e.g. ci=0.95")
    counts = step_time_counts(steps, by=by, match=match)
    is_base = counts["method"] == baseline_method
    base_keys, base_boot = _baseline_rates(counts.loc[is_base], match, n_boot, seed)
    method = counts.loc[~is_base].reset_index(drop=True)
    if method.empty:
        raise MissingInputError(
            f"no steps of a speculative method (all runs have method {baseline_method!r}); "
            "pass the method runs' steps too"
        )
    method = method.merge(base_keys.reset_index(names="_match"), on=match, how="left", sort=False)
    if method["_match"].isna().any():
        missing = method.loc[method["_match"].isna(), match].drop_duplicates()
        logger.warning(
            "no %r baseline run for %s; speedup is NaN there",
            baseline_method,
            missing.to_dict("records"),
        )
    group_cols = [*by, "n"] if "n" not in by else list(by)
    group, n_groups = combined_codes(method, group_cols)
    keys = group_key_frame(method, group_cols, group, n_groups)
    steps_n = method["n_steps"].to_numpy(float)
    tokens = method["sum_tokens"].to_numpy(float)
    time = method["sum_time"].to_numpy(float)
    step_base = method["baseline_step_time"].to_numpy(float)  # [R] NaN without a baseline
    match_code = method["_match"].fillna(-1).to_numpy(dtype=np.int64)

    # per request: steps, tokens, time, draft, verify (+ other), tokens x t_b, steps x t_b
    draft_time = method["sum_draft"].to_numpy(float)
    per_unit = np.stack(
        [
            steps_n,
            tokens,
            time,
            draft_time,
            time - draft_time,
            tokens * step_base,
            steps_n * step_base,
        ],
        axis=1,
    )
    names = (
        "n_steps",
        "tokens_per_step",
        "tokens_per_step_lo",
        "tokens_per_step_hi",
        "time_per_token",
        "baseline_time_per_token",
        "speedup",
        "speedup_lo",
        "speedup_hi",
        "draft_cost",
        "verify_cost",
    )
    out = {name: np.full(n_groups, np.nan) for name in names}
    for g, rows in enumerate(split_by_code(group, n_groups)):
        n_st, tok, tim, dra, ver, equiv, equiv_steps = per_unit[rows].sum(axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            out["n_steps"][g] = n_st
            out["tokens_per_step"][g] = tok / n_st
            out["time_per_token"][g] = tim / tok
            out["baseline_time_per_token"][g] = equiv / tok
            out["speedup"][g] = equiv / tim
            out["draft_cost"][g] = dra / equiv_steps
            out["verify_cost"][g] = ver / equiv_steps - 1.0
        if n_boot == 0:
            continue
        # resample requests; each matched baseline's step time is resampled on its own
        matches = np.unique(match_code[rows])
        by_match = (match_code[rows][:, None] == matches[None, :]) * tokens[rows][:, None]
        x = np.concatenate([per_unit[rows][:, :3], by_match], axis=1)  # [U, 3 + M]
        sums = bootstrap_sums(x, n_boot, group_rng(seed, tuple(keys.iloc[g])))  # [B, 3 + M]
        nan = np.full(n_boot, np.nan)
        base_b = np.stack([base_boot.get(int(m), nan) for m in matches], axis=1)  # [B, M]
        with np.errstate(invalid="ignore", divide="ignore"):
            tps = sums[:, 1] / sums[:, 0]
            speed = (sums[:, 3:] * base_b).sum(axis=1) / sums[:, 2]
        out["tokens_per_step_lo"][g], out["tokens_per_step_hi"][g] = percentile_interval(tps, ci)
        out["speedup_lo"][g], out["speedup_hi"][g] = percentile_interval(speed, ci)
    result = keys.assign(**out)
    result["n_steps"] = result["n_steps"].astype(np.int64)
    if positions is not None:
        step_rows = None if is_step_time_counts(steps) else steps
        length = compute_acceptance_length(
            positions, steps=step_rows, by=group_cols, n_boot=n_boot, ci=ci, seed=seed
        )[[*group_cols, "accept_len", "accept_len_lo", "accept_len_hi"]]
        result = result.merge(length, on=group_cols, how="left")
    return _with_marginals(result, [c for c in group_cols if c != "n"])


def _with_marginals(frame: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Add ``marginal_<metric>`` = metric(n) - metric(n - 1) within each group."""
    metrics = [m for m in ("tokens_per_step", "speedup", "accept_len") if m in frame.columns]
    previous = frame[[*by, "n", *metrics]].copy()
    previous["n"] = previous["n"] + 1
    previous = previous.rename(columns={m: f"_prev_{m}" for m in metrics})
    merged = frame.merge(previous, on=[*by, "n"], how="left")
    for m in metrics:
        merged[f"marginal_{m}"] = merged[m] - merged.pop(f"_prev_{m}")
    return merged.sort_values([*by, "n"], kind="stable").reset_index(drop=True)
