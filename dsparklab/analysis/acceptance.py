"""Acceptance by drafted position: conditional acceptance, survival, acceptance length.

Conventions (docs/acceptance-definitions.md): positions count from 0; a row is
*reached* when every earlier position of its step was accepted; the acceptance length AL
counts the bonus token, so a step that accepts nothing still emits 1 token.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import (
    UNIT_COLUMNS,
    combined_codes,
    group_key_frame,
    split_by_code,
)
from dsparklab.analysis._kernels import (
    bootstrap_sums,
    group_rng,
    percentile_interval,
)
from dsparklab.errors import DSparkLabError


def is_acceptance_counts(frame: pd.DataFrame) -> bool:
    """Whether ``frame`` holds acceptance counts (``n_reached``, ``n_accepted``) rather than
    position rows (``accepted``)."""
    return {"n_reached", "n_accepted"} <= set(frame.columns) and "accepted" not in frame


def acceptance_stats(
    reached: np.ndarray, accepted: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The acceptance formulas, on counts ``[..., P]`` (last axis: position).

    Returns ``a`` ``[..., P]`` (NaN where nothing was reached), ``s`` ``[..., P]`` and
    ``AL`` ``[...]``. See :func:`finish_acceptance` for the formulas.
    """
    with np.errstate(invalid="ignore", divide="ignore"):
        rate = np.where(reached > 0, accepted / np.where(reached > 0, reached, 1), np.nan)
    survival = np.cumprod(np.where(reached > 0, rate, 0.0), axis=-1)
    return rate, survival, 1.0 + survival.sum(axis=-1)


def finish_acceptance(
    counts: pd.DataFrame, by: tuple[str, ...], *, n_boot: int, ci: float, seed: int
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Acceptance by position and acceptance length from counts (one formula for both).

    ``counts``: ``position``, ``n_reached``, ``n_accepted`` (optionally ``n_drafted``) over
    ``by``, per request (``run_id``, ``request_id``) for the bootstrap intervals. The
    tables, their columns and formulas are those of
    :func:`dsparklab.analysis.compute_acceptance_by_position` and
    :func:`dsparklab.analysis.compute_acceptance_length`, which count whatever rows each
    run holds and finish here.
    """
    if not 0.0 < ci < 1.0:
        raise DSparkLabError(f"ci must be in (0, 1), got {ci}; e.g. ci=0.95")
    if counts.empty:
        return _empty_by_position(by), _empty_length(by)
    counts = counts.reset_index(drop=True)
    group, n_groups = combined_codes(counts, by)
    position = counts["position"].to_numpy(dtype=np.int64)
    n_pos = int(position.max()) + 1
    dense = np.zeros((n_groups, n_pos, 3))  # [G, P, (drafted, reached, accepted)]
    drafted = counts["n_drafted"] if "n_drafted" in counts else counts["n_reached"]
    values = np.stack(
        [
            drafted.to_numpy(float),
            counts["n_reached"].to_numpy(float),
            counts["n_accepted"].to_numpy(float),
        ],
        axis=1,
    )  # [R, 3]
    np.add.at(dense, (group, position), values)
    rate, survival, accept_len = acceptance_stats(dense[..., 1], dense[..., 2])

    keys = group_key_frame(counts, by, group, n_groups)  # one row per group code
    shape = (n_groups, n_pos)
    rate_lo, rate_hi = np.full(shape, np.nan), np.full(shape, np.nan)
    surv_lo, surv_hi = np.full(shape, np.nan), np.full(shape, np.nan)
    len_lo, len_hi = np.full(n_groups, np.nan), np.full(n_groups, np.nan)
    # unknown (NA) when the counts were summed over requests
    n_requests = pd.array([pd.NA] * n_groups, dtype="Int64")
    if all(c in counts.columns for c in UNIT_COLUMNS):
        unit, _ = combined_codes(counts, [*by, *UNIT_COLUMNS])
        pairs = np.unique(np.stack([group, unit], axis=1), axis=0)  # [U_total, 2]
        n_requests = pd.array(np.bincount(pairs[:, 0], minlength=n_groups), dtype="Int64")
        if n_boot > 0:
            for g, rows in enumerate(split_by_code(group, n_groups)):
                local, inverse = np.unique(unit[rows], return_inverse=True)
                per_unit = np.zeros((len(local), n_pos, 2))  # [U, P, (reached, accepted)]
                np.add.at(per_unit, (inverse.reshape(-1), position[rows]), values[rows, 1:])
                rng = group_rng(seed, tuple(keys.iloc[g]))
                boot = bootstrap_sums(per_unit, n_boot, rng)  # [B, P, 2]
                b_rate, b_surv, b_len = acceptance_stats(boot[..., 0], boot[..., 1])
                rate_lo[g], rate_hi[g] = percentile_interval(b_rate, ci)
                surv_lo[g], surv_hi[g] = percentile_interval(b_surv, ci)
                len_lo[g], len_hi[g] = percentile_interval(b_len, ci)

    g_idx, p_idx = np.nonzero(dense[..., 0] > 0)
    by_position = (
        keys.iloc[g_idx]
        .reset_index(drop=True)
        .assign(
            position=p_idx,
            n_drafted=dense[g_idx, p_idx, 0].astype(np.int64),
            n_reached=dense[g_idx, p_idx, 1].astype(np.int64),
            n_accepted=dense[g_idx, p_idx, 2].astype(np.int64),
            accept_rate=rate[g_idx, p_idx],
            accept_rate_lo=rate_lo[g_idx, p_idx],
            accept_rate_hi=rate_hi[g_idx, p_idx],
            survival=survival[g_idx, p_idx],
            survival_lo=surv_lo[g_idx, p_idx],
            survival_hi=surv_hi[g_idx, p_idx],
            n_requests=n_requests[g_idx],
        )
    )
    length = keys.assign(
        accept_len=accept_len,
        accept_len_lo=len_lo,
        accept_len_hi=len_hi,
        n_positions=(dense[..., 0] > 0).sum(axis=1),
        n_steps=dense[:, 0, 1].astype(np.int64),
        n_accepted=dense[..., 2].sum(axis=1).astype(np.int64),
        n_requests=n_requests,
    )
    return by_position, length


def _empty_by_position(by: tuple[str, ...]) -> pd.DataFrame:
    cols = [
        *by,
        "position",
        "n_drafted",
        "n_reached",
        "n_accepted",
        "accept_rate",
        "accept_rate_lo",
        "accept_rate_hi",
        "survival",
        "survival_lo",
        "survival_hi",
        "n_requests",
    ]
    return pd.DataFrame({c: pd.Series(dtype=float) for c in cols})


def _empty_length(by: tuple[str, ...]) -> pd.DataFrame:
    cols = [
        *by,
        "accept_len",
        "accept_len_lo",
        "accept_len_hi",
        "n_positions",
        "n_steps",
        "n_accepted",
        "n_requests",
    ]
    return pd.DataFrame({c: pd.Series(dtype=float) for c in cols})


def compute_iid_accept_len(rate: float | np.ndarray, n: int | np.ndarray) -> np.ndarray:
    """Acceptance length when every position is accepted with the same probability.

    Notes
    -----
    .. math:: \\mathrm{AL}(n) = \\sum_{i=0}^{n} a^i = \\frac{1 - a^{n+1}}{1 - a}

    (Leviathan et al. 2023), and :math:`n + 1` at :math:`a = 1`.
    """
    rate = np.asarray(rate, dtype=np.float64)
    n = np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        closed = (1.0 - rate ** (n + 1)) / (1.0 - rate)
    return np.where(np.isclose(rate, 1.0), n + 1.0, closed)
