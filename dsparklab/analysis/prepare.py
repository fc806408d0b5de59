"""Per-row quantities the metrics are defined on: reached, prefix confidence, prompt."""

from __future__ import annotations

import numpy as np
import pandas as pd

from dsparklab.analysis._frames import (
    STEP_KEY,
    UNIT_COLUMNS,
    combined_codes,
    require_columns,
    with_run_ids,
)
from dsparklab.analysis._kernels import prefix_product, reached_mask, step_codes

POSITION_COLUMNS = ("request_id", "step", "position", "accepted")
# Columns taken from the steps table when it is given.
STEP_COLUMNS = ("prompt_id", "num_verified")


def annotate_positions(
    positions: pd.DataFrame, *, steps: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Add the per-row quantities the analysis is defined on.

    Parameters
    ----------
    positions
        Rows of the ``positions`` table (``read_trace(root, "positions")``); a frame
        without ``run_id`` is treated as one run.
    steps
        Rows of the ``steps`` table of the same runs. It supplies ``prompt_id`` and
        ``num_verified``; pass it for runs with adaptive verification, where positions
        past ``num_verified`` were drafted but never put to the target.

    Returns
    -------
    pandas.DataFrame
        ``positions`` plus ``reached`` (bool), ``step_accepted`` (accepted positions in
        the row's step), ``prefix_confidence`` (float, when ``confidence`` is present) and,
        with ``steps``, ``prompt_id`` and ``num_verified``.

    Notes
    -----
    With greedy verification acceptance is prefix-closed, so with :math:`A` accepted
    positions in a step that verified :math:`V` of them (``num_verified``; all drafted
    positions when ``steps`` is not given)

    .. math::

        \\mathrm{reached}_i = [\\, i \\le A \\,] \\wedge [\\, i < V \\,], \\qquad
        \\hat c_i = \\prod_{j \\le i} c_j

    where :math:`c_j` is the confidence head's output at position :math:`j` of the same
    step (NaN if any of them is null).
    """
    require_columns(positions, POSITION_COLUMNS, what="annotate_positions")
    if steps is None:
        (frame,) = with_run_ids(positions)
    else:
        frame, steps = with_run_ids(positions, steps)
        frame = _merge_steps(frame, steps)
    request_code, _ = combined_codes(frame, UNIT_COLUMNS)
    position = frame["position"].to_numpy(dtype=np.int64)
    step_code, n_steps = step_codes(request_code, frame["step"].to_numpy(dtype=np.int64))
    accepted = frame["accepted"].to_numpy(dtype=bool)
    limit = None
    if "num_verified" in frame.columns:
        limit = frame["num_verified"].to_numpy(dtype=np.float64, na_value=np.inf)
    reached, n_accepted = reached_mask(step_code, n_steps, position, accepted, limit)
    extra: dict[str, np.ndarray] = {
        "reached": reached,
        "step_accepted": n_accepted[step_code] if len(step_code) else np.zeros(0, np.int64),
    }
    if "confidence" in frame.columns:
        confidence = frame["confidence"].to_numpy(dtype=np.float64, na_value=np.nan)
        extra["prefix_confidence"] = prefix_product(step_code, n_steps, position, confidence)
    return frame.assign(**extra)


def _merge_steps(frame: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    require_columns(steps, ("request_id", "step"), what="the steps frame")
    wanted = [c for c in STEP_COLUMNS if c in steps.columns and c not in frame.columns]
    if not wanted:
        return frame
    keys = [c for c in STEP_KEY if c in frame.columns and c in steps.columns]
    table = steps[[*keys, *wanted]].drop_duplicates(keys)
    return frame.merge(table, on=keys, how="left", sort=False)
