"""The trace store: schema v2, the writer engines use, readers and validation."""

from dsparklab.store.catalog import Catalog, hive_table, list_runs, read_trace, table_dataset
from dsparklab.store.reader import (
    find_runs,
    matches_selection,
    read_run_json,
    run_field,
)
from dsparklab.store.schema import (
    POSITIONS_SCHEMA,
    REQUESTS_SCHEMA,
    SCHEMA_VERSION,
    STEPS_SCHEMA,
    TABLES,
)
from dsparklab.store.validate import RunReport, Violation, validate_run, validate_trace
from dsparklab.store.writer import TraceWriter, new_run_json, write_json_atomic

__all__ = [
    "POSITIONS_SCHEMA",
    "REQUESTS_SCHEMA",
    "SCHEMA_VERSION",
    "STEPS_SCHEMA",
    "TABLES",
    "Catalog",
    "RunReport",
    "TraceWriter",
    "Violation",
    "find_runs",
    "hive_table",
    "list_runs",
    "matches_selection",
    "new_run_json",
    "read_run_json",
    "read_trace",
    "run_field",
    "table_dataset",
    "validate_run",
    "validate_trace",
    "write_json_atomic",
]
