"""Analysis: pure functions from trace DataFrames to tidy DataFrames (no plotting, no I/O).

Every metric is finished from counters (sum/total pairs) that merge by addition; the
counters come from the in-memory tables (``count_*``) or straight from a store on disk
(:func:`aggregate_store`, the one function here that reads files).
"""

from dsparklab.analysis.acceptance import (
    acceptance_stats,
    compute_acceptance_by_position,
    compute_acceptance_length,
    compute_iid_accept_len,
    count_acceptance,
    count_acceptance_from_steps,
)
from dsparklab.analysis.adaptive import compute_adaptive_verification
from dsparklab.analysis.calibration import (
    SCORES,
    compute_auroc,
    compute_brier,
    compute_calibration,
    compute_ece,
    compute_reliability,
    count_calibration,
)
from dsparklab.analysis.diff import (
    compute_regression_diff,
    compute_token_class_acceptance,
    compute_token_class_diff,
    compute_worst_prompts,
)
from dsparklab.analysis.markov import (
    compute_markov_attribution,
    compute_markov_bias_distribution,
)
from dsparklab.analysis.prepare import annotate_positions
from dsparklab.analysis.scale import aggregate_store
from dsparklab.analysis.speedup import (
    DRAFTER_KINDS,
    compute_speedup_model,
    fit_speedup_model,
)
from dsparklab.analysis.tokens import KEYWORDS, TOKEN_CLASSES, classify_token
from dsparklab.analysis.window import (
    compute_window_scaling,
    count_step_times,
)

__all__ = [
    "DRAFTER_KINDS",
    "KEYWORDS",
    "SCORES",
    "TOKEN_CLASSES",
    "acceptance_stats",
    "aggregate_store",
    "annotate_positions",
    "classify_token",
    "compute_acceptance_by_position",
    "compute_acceptance_length",
    "compute_adaptive_verification",
    "compute_auroc",
    "compute_brier",
    "compute_calibration",
    "compute_ece",
    "compute_iid_accept_len",
    "compute_markov_attribution",
    "compute_markov_bias_distribution",
    "compute_regression_diff",
    "compute_reliability",
    "compute_speedup_model",
    "compute_token_class_acceptance",
    "compute_token_class_diff",
    "compute_window_scaling",
    "compute_worst_prompts",
    "count_acceptance",
    "count_acceptance_from_steps",
    "count_calibration",
    "count_step_times",
    "fit_speedup_model",
]
