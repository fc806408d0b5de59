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


def with_run_ids(*frames: pd.DataFrame) -> tuple[pd.DataFrame, ...]:
    """Frames built by hand may lack ``run_id``: their rows are one run per combination of
    the run columns that every such frame holds (one run, ``"run"``, when they hold one).

    The frames are labelled alike, so that rows of one run join across them (a positions
    frame and its steps): only the run columns they share count, and numbers are compared as
    numbers (``n`` = 3 in one frame is ``n`` = 3.0 in another). Frames with ``run_id`` come
    back unchanged.
    """
    lacking = [i for i, frame in enumerate(frames) if "run_id" not in frame.columns]
    if not lacking:
        return frames
    columns = [c for c in RUN_COLUMNS if all(c in frames[i].columns for i in lacking)]
    keys = {i: run_key_text(frames[i], columns) for i in lacking}
    one_run = len(set().union(*(set(key) for key in keys.values()))) <= 1
    return tuple(
        frame.assign(run_id="run" if one_run else keys[i]) if i in keys else frame
        for i, frame in enumerate(frames)
    )


def run_key_text(frame: pd.DataFrame, columns: Sequence[str], *, sep: str = "|") -> pd.Series:
    """Each row's values of ``columns`` as one text, joined by ``sep`` (``""`` for every row
    when there are none), numbers as numbers: ``n`` = 3 and 3.0 give the same text, so the
    keys of two frames of one run agree."""
    label = pd.Series("", index=frame.index, dtype=object)
    for number, name in enumerate(columns):
        column = frame[name]
        if pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column):
            column = column.astype("float64")
        label = label + (sep if number else "") + column.astype(str)
    return label


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
