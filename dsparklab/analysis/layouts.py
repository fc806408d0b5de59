"""The layouts of the counter tables: their counter columns and the keys they pair on.

Every counter table (acceptance, calibration, step times) is counted by one SQL text
(:mod:`dsparklab.analysis.sql`), over a store or over frames in memory, and finished by the
``compute_*`` functions; both sides read these names from here.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

from dsparklab.analysis._frames import as_columns

# Counter columns of an acceptance count table (sum/total pairs: merge runs by adding).
ACCEPTANCE_COUNTERS = ("n_drafted", "n_reached", "n_accepted")
# Counter columns of a calibration count table.
CALIBRATION_COUNTERS = ("count", "sum_score", "sum_score_sq")
# the level grid every calibration counter takes unless told: AUROC with ties within
# 0.001, a table of at most 1000 levels per bin however large the store
DEFAULT_LEVELS = 1000
# The counters of a step-time table (aggregate_store's and count_frames' "step_times").
STEP_TIME_COUNTERS = ("n_steps", "sum_tokens", "sum_time", "sum_draft", "sum_verify")
# Run columns a baseline run must share with the method run it is compared with.
MATCH_COLUMNS = ("engine", "target", "dataset", "temperature", "concurrency")
# Match columns a frame built by hand may lack: without one, its runs share one load.
OPTIONAL_MATCH_COLUMNS = ("concurrency",)
# Step columns a step-time table may be grouped by. A group by one is matched with the
# baseline's steps of the same value: a step of b requests is costed against the
# target-only steps of b requests, not against the baseline's mean step.
STEP_MATCH_COLUMNS = ("batch_size",)


def match_columns(frame: pd.DataFrame, match: Iterable[str]) -> list[str]:
    """``match`` less the optional columns (:data:`OPTIONAL_MATCH_COLUMNS`) ``frame`` lacks:
    a frame without ``concurrency`` (built by hand, not read from a store) is one load."""
    return [c for c in as_columns(match) if c in frame.columns or c not in OPTIONAL_MATCH_COLUMNS]
