"""The counting stage as SQL: the library's one way to count.

- :mod:`~dsparklab.analysis.sql.queries`: one query text per counter (acceptance from the
  steps or the position rows, calibration bins per score, step-time sums), the same text
  for DuckDB and Spark SQL;
- :mod:`~dsparklab.analysis.sql.engines`: the engines that run them, over a store (DuckDB,
  embedded, the default; Spark, configured by Spark's own configuration) or over frames in
  memory (DuckDB);
- :func:`aggregate_store`: a metric's counter table from a store (the analysis layer's one
  I/O entry point); :func:`count_frames`: the same table from frames in memory. The numpy
  finishing (bootstrap, formulas) is the ``compute_*`` functions'.
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
