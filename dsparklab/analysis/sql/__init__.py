"""The counting stage as SQL: the analysis layer's one I/O entry point.

- :mod:`~dsparklab.analysis.sql.queries`: one query text per counter (acceptance from the
  steps or the position rows, calibration bins per score, step-time sums), the same text
  for DuckDB and Spark SQL;
- :mod:`~dsparklab.analysis.sql.engines`: the engines that run them over a store, DuckDB
  (embedded, the default) and Spark (pyspark, configured by Spark's own configuration);
- :func:`aggregate_store`: a metric's counter table from a store, equal to the in-process
  ``count_*`` function's on the same rows; the numpy finishing (bootstrap, formulas) is
  the in-memory path's.
"""

from dsparklab.analysis.sql.counting import (
    METRICS,
    aggregate_store,
    count_frames,
    empty_counts,
    metric_keys,
    select_runs,
)
from dsparklab.analysis.sql.engines import ENGINES, DuckDBEngine, Engine, SparkEngine, open_engine
from dsparklab.analysis.sql.queries import COUNTERS, render

__all__ = [
    "COUNTERS",
    "ENGINES",
    "METRICS",
    "DuckDBEngine",
    "Engine",
    "SparkEngine",
    "aggregate_store",
    "count_frames",
    "empty_counts",
    "metric_keys",
    "open_engine",
    "render",
    "select_runs",
]
