"""Small pandas helpers: column checks, key codes, tidy output."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from dsparklab import errors
from dsparklab.store.schema import RUN_COLUMNS

# A request is identified by its run and its id: request ids need not be unique across runs.
UNIT_COLUMNS = ("run_id", "request_id")
STEP_KEY = ("run_id", "request_id", "step")


def as_columns(by: str | Iterable[str] | None) -> tuple[str, ...]:
    """``by`` as a tuple of column names (a single name is allowed)."""
    if by is None:
        return ()
    if isinstance(by, str):
        return (by,)
    return tuple(by)


def require_columns(frame: pd.DataFrame, columns: Iterable[str], *, what: str) -> None:
    """Raise TraceSchemaError naming the first missing column and the ones available."""
    hint = "read it with dsparklab.store.read_trace, or pass steps= for prompt_id / num_verified"
    errors.require_columns(frame, columns, what=what, hint=hint)


NO_CONFIDENCE = "only DSpark drafters with a confidence head record one"
NO_MARKOV = "only DSpark drafters with a Markov head record one"


def require_values(frame: pd.DataFrame, column: str, *, what: str, why: str) -> None:
    """Raise MissingInputError when ``column`` is absent or holds no value: the runs lack
    this input (``why`` says which runs do), and ``what`` cannot be computed."""
    if column not in frame.columns or not frame[column].notna().any():
        methods = sorted(map(str, frame["method"].unique())) if "method" in frame else []
        of = f" of {', '.join(methods)}" if methods else ""
        raise errors.MissingInputError(f"{what} needs {column}, which the runs{of} lack ({why})")


def with_run_ids(frame: pd.DataFrame) -> pd.DataFrame:
    """A frame built by hand may lack ``run_id``: its rows are one run per combination of
    the run columns they hold (one run, ``"run"``, when they hold one)."""
    if "run_id" in frame.columns:
        return frame
    columns = [c for c in RUN_COLUMNS if c in frame.columns]
    if not columns or len(frame[columns].drop_duplicates()) <= 1:
        return frame.assign(run_id="run")
    label = frame[columns[0]].astype(str)
    for name in columns[1:]:
        label = label + "|" + frame[name].astype(str)
    return frame.assign(run_id=label)


def factorize(
    frame: pd.DataFrame, columns: Sequence[str]
) -> tuple[list[np.ndarray], list[int], list[pd.Index]]:
    """Sorted integer codes ``[N]`` per column, the number of codes, and the uniques."""
    codes, sizes, uniques = [], [], []
    for name in columns:
        code, unique = pd.factorize(frame[name], sort=True, use_na_sentinel=False)
        codes.append(np.asarray(code, dtype=np.int64))
        sizes.append(len(unique))
        uniques.append(pd.Index(unique))
    return codes, sizes, uniques


def combined_codes(frame: pd.DataFrame, columns: Sequence[str]) -> tuple[np.ndarray, int]:
    """One dense code ``[N]`` per distinct combination of ``columns`` (in sorted order)."""
    if not columns:
        return np.zeros(len(frame), dtype=np.int64), 1
    codes, sizes, _ = factorize(frame, columns)
    key = np.zeros(len(frame), dtype=np.int64)
    for code, size in zip(codes, sizes, strict=True):
        key = key * max(size, 1) + code
    cells, inverse = np.unique(key, return_inverse=True)
    return inverse.reshape(-1).astype(np.int64), len(cells)


def tidy(
    names: Sequence[str],
    cell_codes: Sequence[np.ndarray],
    uniques: Sequence[pd.Index | np.ndarray],
    columns: dict[str, np.ndarray],
) -> pd.DataFrame:
    """A DataFrame of decoded key columns followed by ``columns``."""
    data: dict[str, object] = {}
    for name, code, unique in zip(names, cell_codes, uniques, strict=True):
        data[name] = np.asarray(unique)[code] if len(code) else np.asarray(unique)[:0]
    data.update(columns)
    return pd.DataFrame(data)


def group_key_frame(
    frame: pd.DataFrame, by: Sequence[str], group: np.ndarray, n_groups: int
) -> pd.DataFrame:
    """The ``by`` values of each group code ``0..n_groups-1`` (codes from combined_codes)."""
    _, first = np.unique(group, return_index=True)
    return (
        frame.iloc[first][list(by)].reset_index(drop=True)
        if by
        else pd.DataFrame(index=range(n_groups))
    )


def split_by_code(code: np.ndarray, n_codes: int) -> list[np.ndarray]:
    """Row indices of each code ``0..n_codes-1``."""
    order = np.argsort(code, kind="stable")
    bounds = np.searchsorted(code[order], np.arange(n_codes + 1))
    return [order[bounds[g] : bounds[g + 1]] for g in range(n_codes)]
