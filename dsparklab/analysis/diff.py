"""Regression diff between two run sets: per dataset, prompt, position and token class.

"base" and "new" are any two sets of runs (Eagle3 n=3 vs n=7, DSpark vs Eagle3, last
week's checkpoint vs this one). Deltas are new - base, with percentile bootstrap
intervals. When both sides know each request's prompt (their steps tables, or per-prompt
acceptance counts), prompts (dataset, prompt_id) are the resampling unit and both sides
are resampled *together* (a paired bootstrap: a prompt drawn twice counts twice on both
sides), which cancels prompt difficulty out of the interval. Otherwise requests are
resampled independently on each side.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import (
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
from dsparklab.analysis.acceptance import acceptance_stats, is_acceptance_counts
from dsparklab.analysis.prepare import annotate_positions
from dsparklab.analysis.tokens import KEYWORDS, TOKEN_CLASSES, TokenText, row_tokens, token_classes
from dsparklab.errors import DSparkLabError, UnknownMethodError

Stat = Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]


def _length_stat(reached: np.ndarray, accepted: np.ndarray) -> dict[str, np.ndarray]:
    """``reached``/``accepted`` ``[..., P]`` -> accept_len ``[..., 1]``."""
    return {"accept_len": acceptance_stats(reached, accepted)[2][..., None]}


def _position_stat(reached: np.ndarray, accepted: np.ndarray) -> dict[str, np.ndarray]:
    rate, survival, _ = acceptance_stats(reached, accepted)
    return {"accept_rate": rate, "survival": survival}


def _rate_stat(reached: np.ndarray, accepted: np.ndarray) -> dict[str, np.ndarray]:
    """Acceptance rate per cell (cells are independent, e.g. token classes)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"accept_rate": np.where(reached > 0, accepted / reached, np.nan)}


def _rows(positions: pd.DataFrame, steps: pd.DataFrame | None, keys: list[str]) -> pd.DataFrame:
    """The reached rows, each one count: ``n_reached`` = 1, ``n_accepted`` = accepted."""
    frame = annotate_positions(positions, steps=steps)
    require_columns(frame, keys, what="the regression diff")
    reached = frame.loc[frame["reached"].to_numpy(bool)]
    return reached.assign(n_reached=1.0, n_accepted=reached["accepted"].astype(float))


def _delta_table(
    base: pd.DataFrame,
    new: pd.DataFrame,
    *,
    group_cols: list[str],
    unit_cols: list[str],
    cell_col: str,
    cells: list,
    stat: Stat,
    paired: bool,
    n_boot: int,
    ci: float,
    seed: int,
) -> pd.DataFrame:
    """Deltas of ``stat`` over the counts (``n_reached``, ``n_accepted``) of ``base`` and
    ``new`` (per unit and cell, or one reached row each), per group and cell."""
    if not 0.0 < ci < 1.0:
        raise DSparkLabError(f"ci must be in (0, 1), got {ci}; e.g. ci=0.95")
    cell_index = {c: i for i, c in enumerate(cells)}
    columns = list(dict.fromkeys([*group_cols, *unit_cols, cell_col, "n_reached", "n_accepted"]))
    both = pd.concat(
        [base[columns].assign(_side=0), new[columns].assign(_side=1)], ignore_index=True
    )
    group, n_groups = combined_codes(both, group_cols)
    keys = group_key_frame(both, group_cols, group, n_groups)
    side = both["_side"].to_numpy()
    # paired: a unit is the same on both sides; unpaired: each side has its own units
    unit, _ = combined_codes(both, [*unit_cols, *([] if paired else ["_side"])])
    cell = both[cell_col].map(cell_index).to_numpy(dtype=np.int64)
    reached = both["n_reached"].to_numpy(dtype=float)
    accepted = both["n_accepted"].to_numpy(dtype=float)
    records = []
    for g, rows in enumerate(split_by_code(group, n_groups)):
        key = tuple(keys.iloc[g])
        local, inverse = np.unique(unit[rows], return_inverse=True)
        inverse = inverse.reshape(-1)
        arrays = {}
        for name, code in (("base", 0), ("new", 1)):
            mine = side[rows] == code
            units_here = np.unique(inverse[mine])
            if paired:
                remap, n_units = np.arange(len(local)), len(local)
            else:
                remap = np.full(len(local), -1)
                remap[units_here] = np.arange(len(units_here))
                n_units = len(units_here)
            x = np.zeros((n_units, len(cells), 2))  # [U, C, (reached, accepted)]
            np.add.at(x, (remap[inverse[mine]], cell[rows][mine], 0), reached[rows][mine])
            np.add.at(x, (remap[inverse[mine]], cell[rows][mine], 1), accepted[rows][mine])
            arrays[name] = x
        present = {name: int((x[..., 0].sum(axis=1) > 0).sum()) for name, x in arrays.items()}
        point = {name: stat(x[..., 0].sum(0), x[..., 1].sum(0)) for name, x in arrays.items()}
        bounds: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        if n_boot > 0:
            boot = {}
            for name, x in arrays.items():
                rng = group_rng(seed, (*key, "paired" if paired else name))
                sums = bootstrap_sums(x, n_boot, rng)  # [B, C, 2]
                boot[name] = stat(sums[..., 0], sums[..., 1])
            for metric in point["base"]:
                bounds[metric] = percentile_interval(boot["new"][metric] - boot["base"][metric], ci)
        for metric, base_value in point["base"].items():
            new_value = point["new"][metric]
            lo, hi = bounds.get(metric, (np.full_like(base_value, np.nan),) * 2)
            for j in range(len(base_value)):
                if np.isnan(base_value[j]) and np.isnan(new_value[j]):
                    continue
                records.append(
                    {
                        **dict(zip(group_cols, key, strict=True)),
                        cell_col: cells[j],
                        "metric": metric,
                        "base": base_value[j],
                        "new": new_value[j],
                        "delta": new_value[j] - base_value[j],
                        "delta_lo": lo[j],
                        "delta_hi": hi[j],
                        "n_units_base": present["base"],
                        "n_units_new": present["new"],
                    }
                )
    columns = [
        *group_cols,
        cell_col,
        "metric",
        "base",
        "new",
        "delta",
        "delta_lo",
        "delta_hi",
        "n_units_base",
        "n_units_new",
    ]
    return pd.DataFrame.from_records(records, columns=columns)


def _level_dataset(paired: bool) -> dict:
    return {
        "group_cols": ["dataset"],
        "cell_col": "position",
        "stat": _length_stat,
        "units": ["dataset", "prompt_id"] if paired else ["run_id", "request_id"],
    }


def _level_position(paired: bool) -> dict:
    return {**_level_dataset(paired), "stat": _position_stat}


def _level_prompt(paired: bool) -> dict:
    return {
        "group_cols": ["dataset", "prompt_id"],
        "cell_col": "position",
        "stat": _length_stat,
        "units": ["run_id", "request_id", "step"],
    }


# level -> how to group, which unit to resample and which statistic to compare
LEVELS: dict[str, Callable[[bool], dict]] = {
    "dataset": _level_dataset,
    "position": _level_position,
    "prompt": _level_prompt,
}


def compute_regression_diff(
    base: pd.DataFrame,
    new: pd.DataFrame,
    *,
    base_steps: pd.DataFrame | None = None,
    new_steps: pd.DataFrame | None = None,
    level: str = "dataset",
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Acceptance deltas (new - base) between two run sets, with bootstrap intervals.

    Parameters
    ----------
    base, new
        The two run sets' per-request acceptance counts (``dataset``, ``run_id``,
        ``request_id``, ``position``, ``n_reached``, ``n_accepted``; with ``prompt_id``
        the bootstrap is paired: e.g. the lab's ``Runs.acceptance_counts(by=("prompt_id",))``,
        over every request), or their positions tables (several runs each are pooled).
    base_steps, new_steps
        With positions, their steps tables: needed for ``level="prompt"`` and for the
        paired bootstrap.
    level
        ``"dataset"`` (acceptance length per dataset), ``"position"`` (:math:`a_i` and
        :math:`s_i` per dataset and position) or ``"prompt"`` (acceptance length per
        dataset and prompt; steps are resampled, independently per side: positions only).
    n_boot, ci, seed
        Percentile bootstrap; 0 replicates skips the intervals.

    Returns
    -------
    pandas.DataFrame
        Keys (``dataset`` [, ``prompt_id``] [, ``position``]), ``metric``, ``base``,
        ``new``, ``delta``, ``delta_lo``, ``delta_hi``, ``n_units_base``, ``n_units_new``.

    Notes
    -----
    The metrics are those of :func:`compute_acceptance_by_position`:
    :math:`\\Delta = m(\\mathrm{new}) - m(\\mathrm{base})` for :math:`m \\in
    \\{\\mathrm{AL}, a_i, s_i\\}`. The interval is the percentile interval of
    :math:`m(\\mathrm{new}^*) - m(\\mathrm{base}^*)` over bootstrap replicates; a run set
    compared with itself gives :math:`\\Delta = 0` (and a zero-width interval when paired).
    """
    if level not in LEVELS:
        raise UnknownMethodError(f"unknown diff level {level!r}; valid levels are {sorted(LEVELS)}")
    counted = [is_acceptance_counts(side) for side in (base, new)]
    if counted[0] != counted[1]:
        raise DSparkLabError(
            "compare like with like: both run sets as acceptance counts or both as positions"
        )
    if counted[0]:
        if level == "prompt":
            raise DSparkLabError(
                "level='prompt' resamples each prompt's steps: pass the positions and steps "
                "tables, not counts"
            )
        paired = "prompt_id" in base and "prompt_id" in new
    else:
        paired = base_steps is not None and new_steps is not None
        if level == "prompt" and not paired:
            raise DSparkLabError(
                "level='prompt' needs base_steps and new_steps (prompt_id is in the steps table)"
            )
    spec = LEVELS[level](paired)
    keys = list(dict.fromkeys([*spec["group_cols"], *spec["units"], "position"]))
    if counted[0]:
        for side in (base, new):
            require_columns(side, [*keys, "n_reached", "n_accepted"], what="the regression diff")
    else:
        base, new = _rows(base, base_steps, keys), _rows(new, new_steps, keys)
    n_pos = (
        int(
            max(
                base["position"].max() if len(base) else 0, new["position"].max() if len(new) else 0
            )
        )
        + 1
    )
    return _delta_table(
        base,
        new,
        group_cols=spec["group_cols"],
        unit_cols=spec["units"],
        cell_col="position",
        cells=list(range(n_pos)),
        stat=spec["stat"],
        paired=paired and level != "prompt",
        n_boot=n_boot,
        ci=ci,
        seed=seed,
    ).pipe(_drop_position_for_length)


def _drop_position_for_length(frame: pd.DataFrame) -> pd.DataFrame:
    if (frame["metric"] == "accept_len").all() and "position" in frame.columns:
        return frame.drop(columns="position")
    return frame


def compute_worst_prompts(
    prompt_diff: pd.DataFrame, *, k: int = 10, metric: str = "accept_len"
) -> pd.DataFrame:
    """The ``k`` prompts whose ``metric`` dropped most, from a ``level="prompt"`` diff.

    Returns those rows sorted by ``delta`` (most negative first) with ``significant`` =
    the whole interval lies below zero.
    """
    require_columns(
        prompt_diff, ["prompt_id", "metric", "delta", "delta_hi"], what="compute_worst_prompts"
    )
    rows = prompt_diff[prompt_diff["metric"] == metric]
    worst = rows.sort_values("delta", kind="stable").head(k).reset_index(drop=True)
    return worst.assign(significant=worst["delta_hi"] < 0)


def _class_rows(
    positions: pd.DataFrame,
    steps: pd.DataFrame | None,
    keys: list[str],
    token_text: TokenText,
    token_column: str,
    keywords: Iterable[str],
) -> pd.DataFrame:
    frame = _rows(positions, steps, [*keys, token_column])
    classes = token_classes(row_tokens(frame, token_column), token_text, keywords=keywords)
    return frame.assign(token_class=classes)


def compute_token_class_acceptance(
    positions: pd.DataFrame,
    *,
    token_text: TokenText,
    steps: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("run_id",),
    token_column: str = "target_token",
    keywords: Iterable[str] = KEYWORDS,
) -> pd.DataFrame:
    """Acceptance given reached per token class of the token at the position.

    Parameters
    ----------
    positions
        The positions table.
    token_text
        Token id -> text: a mapping or a callable (e.g. ``lambda i: tok.decode([i])``).
    steps
        The steps table (``prompt_id`` grouping; adaptive verification).
    by
        Grouping columns.
    token_column
        Which token classifies the row: ``target_token`` (the text actually there; null
        entries fall back to ``draft_token``) or ``draft_token``.
    keywords
        Words counted as keywords (default: Python's and common C-family/Go/Rust ones).

    Returns
    -------
    pandas.DataFrame
        One row per group and class of :data:`TOKEN_CLASSES`: ``n_reached``,
        ``n_accepted``, ``accept_rate`` = n_accepted / n_reached.
    """
    by = list(as_columns(by))
    frame = _class_rows(positions, steps, by, token_text, token_column, keywords)
    out = (
        frame.groupby([*by, "token_class"], sort=True, observed=True)["accepted"]
        .agg(n_reached="size", n_accepted="sum")
        .reset_index()
    )
    out["n_accepted"] = out["n_accepted"].astype(np.int64)
    out["accept_rate"] = out["n_accepted"] / out["n_reached"]
    return out


def compute_token_class_diff(
    base_positions: pd.DataFrame,
    new_positions: pd.DataFrame,
    *,
    token_text: TokenText,
    base_steps: pd.DataFrame | None = None,
    new_steps: pd.DataFrame | None = None,
    by: str | Iterable[str] = ("dataset",),
    token_column: str = "target_token",
    keywords: Iterable[str] = KEYWORDS,
    n_boot: int = 1000,
    ci: float = 0.95,
    seed: int = 0,
) -> pd.DataFrame:
    """Delta (new - base) of acceptance given reached per token class, with intervals.

    Parameters are those of :func:`compute_token_class_acceptance` and
    :func:`compute_regression_diff` (paired over prompts when both steps tables are
    given). ``by`` may be empty to pool everything.

    Returns
    -------
    pandas.DataFrame
        ``by`` + ``token_class``, ``metric`` (``accept_rate``), ``base``, ``new``,
        ``delta``, ``delta_lo``, ``delta_hi``, ``n_units_base``, ``n_units_new``.

    Notes
    -----
    .. math:: \\Delta_c = \\frac{A^{\\mathrm{new}}_c}{R^{\\mathrm{new}}_c} -
              \\frac{A^{\\mathrm{base}}_c}{R^{\\mathrm{base}}_c}

    over reached rows whose token is of class :math:`c`.
    """
    by = list(as_columns(by))
    paired = base_steps is not None and new_steps is not None
    units = ["dataset", "prompt_id"] if paired else ["run_id", "request_id"]
    keys = list(dict.fromkeys([*by, *units]))
    base = _class_rows(base_positions, base_steps, keys, token_text, token_column, keywords)
    new = _class_rows(new_positions, new_steps, keys, token_text, token_column, keywords)
    group_cols = by or ["_all"]
    if not by:
        base, new = base.assign(_all=0), new.assign(_all=0)
    out = _delta_table(
        base,
        new,
        group_cols=group_cols,
        unit_cols=units,
        cell_col="token_class",
        cells=list(TOKEN_CLASSES),
        stat=_rate_stat,
        paired=paired,
        n_boot=n_boot,
        ci=ci,
        seed=seed,
    )
    return out.drop(columns=["_all"]) if not by else out
