"""What a notebook imports as ``nb`` (``import dsparklab.lab.notebook as nb``): the lab's
notebook API in one namespace, each part in its own module.

- showing and recording (:mod:`dsparklab.lab.display`): :func:`setup`, :func:`show`,
  :func:`save_figure`, :func:`record`, :func:`read_records`;
- the runs (:mod:`dsparklab.lab.runs`): :func:`resolve_runs`, :func:`load_runs`,
  :func:`load_any_runs`, :func:`count_runs`; two run sets compared
  (:mod:`dsparklab.lab.comparison`): :func:`load_comparison`;
- published figures and cost profiles (:mod:`dsparklab.lab.published`):
  :func:`load_published`, :func:`load_published_curves`,
  :func:`load_published_verify_costs`, :func:`cost_table`;
- token text (:mod:`dsparklab.lab.tokens`): :func:`load_token_text`.

The library imports from those modules; this one only gathers them for the notebooks.
"""

from __future__ import annotations

from dsparklab.lab.comparison import Comparison, default_comparison, load_comparison
from dsparklab.lab.display import (
    HEADLESS_ENV,
    MIMETYPE,
    PLOTLY_MIMETYPE,
    SECTIONS_RECORD,
    figure_json,
    front_end_attached,
    note,
    read_records,
    record,
    save_figure,
    section_magic,
    setup,
    show,
)
from dsparklab.lab.published import (
    PUBLISHED_METHODS,
    confidence_temperatures,
    cost_table,
    load_published,
    load_published_curves,
    load_published_verify_costs,
)
from dsparklab.lab.runs import (
    ANY_TABLES,
    BASELINE_METHOD,
    DEFAULT_MAX_ROWS,
    DEFAULT_RUNS,
    MAX_ROWS_ENV,
    READ_STATUSES,
    RUNS_ENV,
    SHIPPED_ENV,
    SHIPPED_TRACES,
    TIER_ORDER,
    AnyRuns,
    Runs,
    by_status,
    count_runs,
    left_out_text,
    load_any_runs,
    load_runs,
    max_rows,
    resolve_runs,
    shipped_traces,
    token_runs,
    within,
)
from dsparklab.lab.tokens import load_token_text

__all__ = [
    "ANY_TABLES",
    "BASELINE_METHOD",
    "DEFAULT_MAX_ROWS",
    "DEFAULT_RUNS",
    "HEADLESS_ENV",
    "MAX_ROWS_ENV",
    "MIMETYPE",
    "PLOTLY_MIMETYPE",
    "PUBLISHED_METHODS",
    "READ_STATUSES",
    "RUNS_ENV",
    "SECTIONS_RECORD",
    "SHIPPED_ENV",
    "SHIPPED_TRACES",
    "TIER_ORDER",
    "AnyRuns",
    "Comparison",
    "Runs",
    "by_status",
    "confidence_temperatures",
    "cost_table",
    "count_runs",
    "default_comparison",
    "figure_json",
    "front_end_attached",
    "left_out_text",
    "load_any_runs",
    "load_comparison",
    "load_published",
    "load_published_curves",
    "load_published_verify_costs",
    "load_runs",
    "load_token_text",
    "max_rows",
    "note",
    "read_records",
    "record",
    "resolve_runs",
    "save_figure",
    "section_magic",
    "setup",
    "shipped_traces",
    "show",
    "token_runs",
    "within",
]
