"""Numpy kernels shared by the in-memory (pandas) path and the store (pyarrow) path.

Both paths turn rows into integer codes and call these kernels, so every counter
(the sum/total pairs the metrics are finished from) is computed by one piece of code.
Nothing here knows about DataFrames or files.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# A key space up to this many cells per input row is counted with a dense bincount;
# a sparser one goes through np.unique (a sort).
DENSE_CELLS_PER_ROW = 4
DENSE_CELLS_MIN = 1 << 20
MAX_KEY_SPACE = 1 << 62


def _dense(total: int, n_rows: int) -> bool:
    return total <= max(DENSE_CELLS_PER_ROW * n_rows, DENSE_CELLS_MIN)


def group_sums(
    codes: Sequence[np.ndarray],
    sizes: Sequence[int],
    values: Mapping[str, np.ndarray],
) -> tuple[list[np.ndarray], np.ndarray, dict[str, np.ndarray]]:
    """Sum ``values`` over the non-empty cells of a mixed-radix key.

    Parameters
    ----------
    codes
        One int array per key column, each ``[N]`` with values in ``[0, size)``.
    sizes
        The number of distinct codes of each key column.
    values
        Arrays ``[N]`` (bool, int or float) summed per cell.

    Returns
    -------
    cell_codes, count, sums
        The key codes of each non-empty cell (one ``[C]`` array per key column), the row
        count per cell ``[C]`` and each value's sum per cell ``[C]`` (float64).
    """
    if not codes:  # no key columns: one cell holding every row
        n_rows = len(next(iter(values.values()))) if values else 0
        _, count, sums = group_sums([np.zeros(n_rows, dtype=np.int64)], [1], values)
        return [], count, sums
    n_rows = len(codes[0])
    sizes = [max(int(s), 1) for s in sizes]
    total = 1
    for size in sizes:
        total *= size
    if n_rows == 0:
        empty = np.zeros(0, dtype=np.int64)
        return [empty.copy() for _ in sizes], empty, {k: np.zeros(0) for k in values}
    if total >= MAX_KEY_SPACE:
        stacked = np.stack([np.asarray(c, dtype=np.int64) for c in codes], axis=1)  # [N, K]
        cells_nd, inverse = np.unique(stacked, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        count = np.bincount(inverse)
        sums = {k: np.bincount(inverse, weights=_weights(v)) for k, v in values.items()}
        return [cells_nd[:, j] for j in range(len(sizes))], count, sums
    # [N]; int32 arithmetic is twice as fast when the key space allows it
    key: np.ndarray = np.zeros(n_rows, dtype=np.int32 if total < 2**31 else np.int64)
    for code, size in zip(codes, sizes, strict=True):
        key *= size
        key += code
    if _dense(total, n_rows):
        count = np.bincount(key, minlength=total)
        cells = np.flatnonzero(count)
        count = count[cells]
        sums = {
            k: np.bincount(key, weights=_weights(v), minlength=total)[cells]
            for k, v in values.items()
        }
    else:
        cells, inverse = np.unique(key, return_inverse=True)
        count = np.bincount(inverse)
        sums = {k: np.bincount(inverse, weights=_weights(v)) for k, v in values.items()}
    return list(np.unravel_index(cells, sizes)), count, sums


def _weights(values: np.ndarray) -> np.ndarray:
    return np.asarray(values, dtype=np.float64)


def step_codes(request_code: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, int]:
    """Dense codes ``[N]`` in ``[0, S)`` for the (request, step) of each row, and S."""
    if len(request_code) == 0:
        return np.zeros(0, dtype=np.int64), 0
    n_step_values = int(step.max()) + 1
    total = (int(request_code.max()) + 1) * n_step_values
    key: np.ndarray = request_code.astype(np.int32 if total < 2**31 else np.int64)
    key = key * n_step_values + step  # [N]
    if _dense(total, len(key)):
        present = np.bincount(key, minlength=total) > 0  # [total]
        lookup = np.cumsum(present) - 1
        return lookup[key], int(present.sum())
    cells, inverse = np.unique(key, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), len(cells)


def reached_mask(
    step_code: np.ndarray,
    n_steps: int,
    position: np.ndarray,
    accepted: np.ndarray,
    verified_limit: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Which rows were reached: every earlier position of the step accepted (and verified).

    With greedy verification acceptance is prefix-closed, so a step with A accepted
    positions reached exactly positions ``0..A``; under adaptive verification a position
    at or past the step's ``num_verified`` was never put to the target.

    Returns the mask ``[N]`` and the accepted count per step ``[S]``.
    """
    n_accepted = np.bincount(step_code[accepted], minlength=n_steps)  # [S]
    reached = position <= n_accepted[step_code]  # [N]
    if verified_limit is not None:
        reached &= position < verified_limit
    return reached, n_accepted


def prefix_product(
    step_code: np.ndarray, n_steps: int, position: np.ndarray, values: np.ndarray
) -> np.ndarray:
    """Running product of ``values`` over positions ``0..i`` of each row's step.

    ``values`` is ``[N]``; the result ``[N]`` is NaN where an earlier position of the step
    is missing or NaN (e.g. a null confidence).
    """
    out = np.asarray(values, dtype=np.float64).copy()  # [N]
    if len(out) == 0:
        return out
    n_positions = int(position.max()) + 1
    rows = np.full((n_steps, n_positions), -1, dtype=np.int64)  # [S, P]
    rows[step_code, position] = np.arange(len(out))
    for pos in range(1, n_positions):
        here = rows[:, pos]
        has = here >= 0
        before = rows[has, pos - 1]
        here = here[has]
        prev = np.where(before >= 0, out[np.maximum(before, 0)], np.nan)
        out[here] *= prev
    return out


def score_bins(score: np.ndarray, n_bins: int) -> np.ndarray:
    """Equal-width bin of each score in [0, 1]: ``min(floor(score * n_bins), n_bins - 1)``."""
    return np.clip(np.floor(score * n_bins), 0, n_bins - 1).astype(np.int64)


def score_levels(score: np.ndarray, levels: int | None) -> tuple[np.ndarray, np.ndarray]:
    """Ordinal score levels for ranking: exact distinct values or a grid of ``levels`` cells.

    Returns codes ``[N]`` and the level value of each code (the exact score, or the grid
    cell's lower edge).
    """
    if levels is None:
        uniq, inverse = np.unique(score, return_inverse=True)
        return inverse.reshape(-1).astype(np.int64), uniq.astype(np.float64)
    codes = np.clip(np.floor(score * levels), 0, levels - 1).astype(np.int64)
    return codes, np.arange(levels, dtype=np.float64) / levels


# -- bootstrap ----------------------------------------------------------------------------


def group_rng(seed: int, key: Any) -> np.random.Generator:
    """A generator seeded by ``seed`` and the group's key, not by the group's order."""
    if not isinstance(key, tuple):
        key = (key,)
    plain = tuple(k.item() if isinstance(k, np.generic) else k for k in key)
    return np.random.default_rng([int(seed), zlib.crc32(repr(plain).encode())])


def bootstrap_weights(n_units: int, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Resampling counts ``[B, U]``: each row draws ``U`` units with replacement."""
    if n_units == 0:
        return np.zeros((n_boot, 0))
    return rng.multinomial(n_units, np.full(n_units, 1.0 / n_units), size=n_boot).astype(np.float64)


# Resampling weights are drawn in blocks of at most this many entries (B_block x U).
MAX_WEIGHTS = 1 << 22


def bootstrap_sums(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Sums of ``x`` ``[U, ...]`` over ``n_boot`` resamples of its units: ``[B, ...]``.

    Each replicate draws U units with replacement (multinomial counts); weights are
    drawn in blocks so memory stays bounded for many units.
    """
    n_units = x.shape[0]
    if n_units == 0:  # a group no unit reached: every resample sums nothing
        return np.zeros((n_boot, *x.shape[1:]))
    flat = x.reshape(n_units, -1)  # [U, K]
    out = np.empty((n_boot, flat.shape[1]))
    block = max(1, MAX_WEIGHTS // max(n_units, 1))
    for start in range(0, n_boot, block):
        stop = min(n_boot, start + block)
        out[start:stop] = bootstrap_weights(n_units, stop - start, rng) @ flat
    return out.reshape((n_boot, *x.shape[1:]))


def percentile_interval(samples: np.ndarray, ci: float) -> tuple[np.ndarray, np.ndarray]:
    """Percentile interval of bootstrap ``samples`` ``[B, ...]`` at level ``ci``."""
    alpha = (1.0 - ci) / 2.0
    with warnings.catch_warnings():
        # an all-NaN column (a statistic undefined in every replicate) gives NaN bounds
        warnings.simplefilter("ignore", RuntimeWarning)
        lo = np.nanquantile(samples, alpha, axis=0)
        hi = np.nanquantile(samples, 1.0 - alpha, axis=0)
    return lo, hi
