"""Where a speedup goes: log S split exactly into tokens per step and the step's costs.

For a side (a set of method runs, or the target-only baseline) over the steps of a group:

.. math::

    S = \\frac{T}{C}, \\qquad T = \\frac{E}{K}, \\qquad
    C = C_d + C_u + C_o = \\frac{D + U + O}{K\\, t_b}

with :math:`K` steps, :math:`E` emitted tokens, :math:`D, U, O` the draft, verify and other
time, and :math:`t_b` the matched target-only baseline's time per emitted token. A
target-only side has :math:`T = 1` and :math:`C = C_u = 1` (one decode step per token).

Between two sides A (base) and B (new),
:math:`\\Delta \\log S = \\Delta \\log T - \\Delta \\log C`. The token part is
:math:`\\Delta \\log T`; the cost part :math:`-\\Delta \\log (C_d + C_u + C_o)` is split
among draft, verify and other by their Shapley values (each component switched from A to
B, averaged over the :math:`3! = 6` orders), so the four parts sum exactly to
:math:`\\Delta \\log S`, whatever the order the components are listed in. A common
scale of the costs (the same baseline on both sides) cancels out of every part.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import as_columns
from dsparklab.analysis._kernels import bootstrap_sums, group_rng, percentile_interval
from dsparklab.analysis.layouts import MATCH_COLUMNS, match_columns
from dsparklab.analysis.window import BASELINE_METHOD, require_step_costs, step_time_counts
from dsparklab.errors import DSparkLabError, MissingInputError

COMPONENTS = ("tokens", "draft", "verify", "other")
COST_COMPONENTS = COMPONENTS[1:]
# per prompt: steps, emitted tokens, and the draft, verify and other time in units of the
# matched baseline's time per token (so prompts of different baselines pool)  [.., 5]
_SUMS = ("n_steps", "emitted", "draft", "verify", "other")
LEVELS = ("dataset", "prompt")


def _prompt_sums(steps: pd.DataFrame, by: list[str], match: list[str]) -> pd.DataFrame:
    """One row per (by, match, prompt_id): the five sums of :data:`_SUMS`, times divided by
    ``t_b``, the matched baseline's time per emitted token (the side is the baseline
    itself when it holds only target-only steps). ``steps``: rows, or per-request
    step-time counters with ``prompt_id`` among their keys."""
    require_step_costs(steps)
    counts = step_time_counts(steps, by=[*by, "prompt_id"], match=match)
    frame = counts.assign(
        n_steps=counts["n_steps"].astype(float),
        emitted=counts["sum_tokens"],
        draft=counts["sum_draft"],
        verify=counts["sum_verify"],
        other=counts["sum_time"] - counts["sum_draft"] - counts["sum_verify"],
    )
    is_base = frame["method"] == BASELINE_METHOD
    totals = frame.loc[is_base].groupby(match)[["sum_time", "emitted"]].sum()
    per_token = (totals["sum_time"] / totals["emitted"]).rename("t_b").reset_index()
    side = frame.loc[~is_base] if (~is_base).any() else frame.loc[is_base]
    keys = list(dict.fromkeys([*by, *match, "prompt_id"]))
    sums = side.groupby(keys, sort=True)[list(_SUMS)].sum().reset_index()
    sums = sums.merge(per_token, on=match, how="left")
    if sums["t_b"].isna().any():
        missing = sums.loc[sums["t_b"].isna(), match].drop_duplicates().to_dict("records")
        raise MissingInputError(f"no target-only baseline matches {missing}")
    for name in COST_COMPONENTS:
        sums[name] = sums[name] / sums["t_b"]
    return sums.drop(columns=["t_b"])


def _shapley_cost_parts(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Shapley split of ``-(log sum b - log sum a)`` among the components ``[..., 3]``."""
    n = a.shape[-1]
    parts = np.zeros(np.broadcast_shapes(a.shape, b.shape))
    for order in itertools.permutations(range(n)):
        current = np.array(np.broadcast_to(a, parts.shape), dtype=float)
        before = -np.log(current.sum(axis=-1))
        for i in order:
            current[..., i] = np.broadcast_to(b, parts.shape)[..., i]
            after = -np.log(current.sum(axis=-1))
            parts[..., i] += after - before
            before = after
    return parts / math.factorial(n)


def _parts(sums_a: np.ndarray, sums_b: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[..., 5]`` sums per side -> log S of each side and the four parts ``[..., 4]``."""
    with np.errstate(invalid="ignore", divide="ignore"):
        tokens_a = sums_a[..., 1] / sums_a[..., 0]
        tokens_b = sums_b[..., 1] / sums_b[..., 0]
        cost_a = sums_a[..., 2:] / sums_a[..., :1]
        cost_b = sums_b[..., 2:] / sums_b[..., :1]
        log_a = np.log(tokens_a) - np.log(cost_a.sum(axis=-1))
        log_b = np.log(tokens_b) - np.log(cost_b.sum(axis=-1))
        token_part = np.log(tokens_b) - np.log(tokens_a)
        cost_parts = _shapley_cost_parts(cost_a, cost_b)
    return log_a, log_b, np.concatenate([token_part[..., None], cost_parts], axis=-1)


def compute_speedup_attribution(
    base_steps: pd.DataFrame,
    new_steps: pd.DataFrame,
    *,
    by: str | Iterable[str] = ("dataset",),
    level: str = "dataset",
    match: Sequence[str] = MATCH_COLUMNS,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """How the change of log speedup from ``base`` to ``new`` splits into tokens per step,
    draft, verify and other cost (see the module docstring for the formula).

    Parameters
    ----------
    base_steps, new_steps
        The steps of each side's runs *and* of their target-only baseline runs (the
        baseline gives :math:`t_b`), or their per-request step-time counters with
        ``prompt_id`` among the keys (``aggregate_store(metric="step_times",
        by="prompt_id", per_request=True)``). A side holding only baseline steps is the baseline
        itself: ``compute_speedup_attribution(baseline_steps, method_steps)`` splits
        the method's own log S.
    by
        Groups compared (``dataset`` by default); prompts are paired within a group on
        ``prompt_id``, and only prompts both sides decoded count. A side holding a prompt
        under several matched settings (loads, temperatures, each against its own
        baseline) sums them: the prompt counts once.
    level
        ``"dataset"`` (one decomposition per group, with a paired percentile bootstrap
        over prompts: a prompt drawn counts on both sides) or ``"prompt"`` (one per
        prompt, point values).
    match
        Run columns pairing a side's runs with its baseline.
    n_boot, ci, seed
        Bootstrap replicates (0: no intervals), level and seed.

    Returns
    -------
    pandas.DataFrame
        One row per group [and prompt] and component (:data:`COMPONENTS`):
        ``delta_log_speedup`` with ``lo``/``hi``, ``share`` (of the total change), and on
        every row the group's ``base_speedup``, ``new_speedup``, ``total`` (=
        :math:`\\Delta \\log S`, the sum of the four parts) and ``n_prompts``.
    """
    by = list(as_columns(by))
    if level not in LEVELS:
        raise DSparkLabError(f"unknown attribution level {level!r}; expected one of {LEVELS}")
    if not 0.0 < ci < 1.0:
        raise DSparkLabError(f"ci must be in (0, 1), got {ci}; e.g. ci=0.95")
    # per side and prompt: a prompt decoded under several matched settings (loads,
    # temperatures), each scaled by its own baseline, sums them and counts once (the
    # bootstrap's unit is the prompt); the sides themselves may differ in them (one load
    # against another)
    keys = [*by, "prompt_id"]
    a, b = (
        _prompt_sums(side, by, match_columns(side, match)).groupby(keys)[list(_SUMS)].sum()
        for side in (base_steps, new_steps)
    )
    paired = a.reset_index().merge(b.reset_index(), on=keys, suffixes=("_a", "_b"), sort=True)
    if paired.empty:
        raise MissingInputError(
            "the two run sets share no prompt (dataset, prompt_id): nothing to pair"
        )
    cols_a = [f"{s}_a" for s in _SUMS]
    cols_b = [f"{s}_b" for s in _SUMS]
    rows = []
    keys = [*by, "prompt_id"] if level == "prompt" else by
    for key, group in paired.groupby(keys, sort=True) if keys else [((), paired)]:
        key = key if isinstance(key, tuple) else (key,)
        sums_a = group[cols_a].to_numpy(float)  # [P, 5]
        sums_b = group[cols_b].to_numpy(float)
        log_a, log_b, parts = _parts(sums_a.sum(0), sums_b.sum(0))
        lo = hi = np.full(len(COMPONENTS), np.nan)
        if n_boot > 0 and level == "dataset" and len(group) > 1:
            rng = group_rng(seed, ("attribution", *key))
            both = bootstrap_sums(np.concatenate([sums_a, sums_b], axis=1), n_boot, rng)
            lo, hi = percentile_interval(_parts(both[:, :5], both[:, 5:])[2], ci)
        total = float(log_b - log_a)
        for i, component in enumerate(COMPONENTS):
            rows.append(
                {
                    **dict(zip(keys, key, strict=True)),
                    "component": component,
                    "delta_log_speedup": float(parts[i]),
                    "lo": float(lo[i]),
                    "hi": float(hi[i]),
                    "share": float(parts[i] / total) if total else np.nan,
                    "total": total,
                    "base_speedup": float(np.exp(log_a)),
                    "new_speedup": float(np.exp(log_b)),
                    "n_prompts": len(group),
                }
            )
    return pd.DataFrame(rows)


def compute_window_attribution(
    steps: pd.DataFrame,
    *,
    by: str | Iterable[str] = ("dataset",),
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Per method: :func:`compute_speedup_attribution` from its smallest window to its
    largest, both sides with the target-only baseline runs ``steps`` holds.

    Returns
    -------
    pandas.DataFrame
        The attribution's rows with ``method``, ``low_n`` and ``high_n``; methods run at
        one window only are left out.

    Raises
    ------
    MissingInputError
        No method ran at two windows.
    """
    is_base = steps["method"] == BASELINE_METHOD
    baseline = steps.loc[is_base]
    frames = []
    for method, runs in steps.loc[~is_base].groupby("method", sort=True):
        ns = sorted({int(n) for n in runs["n"]})
        if len(ns) < 2:
            continue
        sides = [pd.concat([runs[runs["n"] == n], baseline]) for n in (ns[0], ns[-1])]
        parts = compute_speedup_attribution(*sides, by=by, n_boot=n_boot, ci=ci, seed=seed)
        frames.append(parts.assign(method=method, low_n=ns[0], high_n=ns[-1]))
    if not frames:
        raise MissingInputError("a window attribution needs one method run at two windows")
    return pd.concat(frames, ignore_index=True)


__all__ = ["COMPONENTS", "compute_speedup_attribution", "compute_window_attribution"]
