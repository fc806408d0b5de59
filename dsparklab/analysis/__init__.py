"""Analysis: pure functions from trace DataFrames to tidy DataFrames (no plotting, no I/O).

Every metric is finished from counters (sum/total pairs) that merge by addition; the
counters are counted by one SQL text per counter (:mod:`dsparklab.analysis.sql`), run by
DuckDB or Spark straight from a store on disk or ``s3://`` (:func:`aggregate_store`, the
one function here that reads files) or by DuckDB over frames in memory
(:func:`count_frames`). Runs without token-level rows (imported or
scraped live) are counted by the same acceptance functions from whatever rows each run
holds, and :func:`compute_coverage` says what each run cannot show; the conversions between
every tool's conventions are in :mod:`dsparklab.analysis.definitions`.
"""

from dsparklab.analysis._frames import with_run_ids
from dsparklab.analysis.acceptance import (
    acceptance_stats,
    compute_iid_accept_len,
)
from dsparklab.analysis.adaptive import compute_adaptive_verification
from dsparklab.analysis.aggregate import (
    compute_acceptance_by_position,
    compute_acceptance_length,
    compute_acceptance_over_time,
    compute_rate_acceptance,
    count_acceptance_any,
    count_acceptance_from_counters,
)
from dsparklab.analysis.attribution import (
    COMPONENTS,
    compute_speedup_attribution,
    compute_window_attribution,
)
from dsparklab.analysis.calibration import (
    CALIBRATION_SCORES,
    calibrate_confidence,
    compute_calibration,
    compute_reliability,
)
from dsparklab.analysis.coverage import ANALYSES, compute_coverage
from dsparklab.analysis.definitions import compute_auroc, compute_brier, compute_ece
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
from dsparklab.analysis.projection import (
    compute_best_n,
    compute_position_payoff,
    compute_prefix_agreement,
    compute_projected_speedup,
    compute_required_survival,
    compute_truncated_acceptance,
    compute_window_prediction,
    cost_table_from_profile,
    cost_table_from_published,
    cost_table_from_step_times,
    fitted_cost_table,
)
from dsparklab.analysis.reported_reliability import (
    compute_reliability_ece,
    compute_reported_reliability,
)
from dsparklab.analysis.schedule import compute_speculation_schedule, schedule_config
from dsparklab.analysis.speedup import (
    DRAFTER_KINDS,
    compute_speedup_model,
    fit_speedup_model,
)
from dsparklab.analysis.sql import aggregate_store, count_frames
from dsparklab.analysis.tokens import KEYWORDS, TOKEN_CLASSES, classify_token, rejected_pairs
from dsparklab.analysis.window import (
    compute_window_scaling,
    require_step_costs,
)

__all__ = [
    "ANALYSES",
    "CALIBRATION_SCORES",
    "COMPONENTS",
    "DRAFTER_KINDS",
    "KEYWORDS",
    "TOKEN_CLASSES",
    "acceptance_stats",
    "aggregate_store",
    "annotate_positions",
    "calibrate_confidence",
    "classify_token",
    "compute_acceptance_by_position",
    "compute_acceptance_length",
    "compute_acceptance_over_time",
    "compute_adaptive_verification",
    "compute_auroc",
    "compute_best_n",
    "compute_brier",
    "compute_calibration",
    "compute_coverage",
    "compute_ece",
    "compute_iid_accept_len",
    "compute_markov_attribution",
    "compute_markov_bias_distribution",
    "compute_position_payoff",
    "compute_prefix_agreement",
    "compute_projected_speedup",
    "compute_rate_acceptance",
    "compute_regression_diff",
    "compute_reliability",
    "compute_reliability_ece",
    "compute_reported_reliability",
    "compute_required_survival",
    "compute_speculation_schedule",
    "compute_speedup_attribution",
    "compute_speedup_model",
    "compute_token_class_acceptance",
    "compute_token_class_diff",
    "compute_truncated_acceptance",
    "compute_window_attribution",
    "compute_window_prediction",
    "compute_window_scaling",
    "compute_worst_prompts",
    "cost_table_from_profile",
    "cost_table_from_published",
    "cost_table_from_step_times",
    "count_acceptance_any",
    "count_acceptance_from_counters",
    "count_frames",
    "fit_speedup_model",
    "fitted_cost_table",
    "rejected_pairs",
    "require_step_costs",
    "schedule_config",
    "with_run_ids",
]
